#pragma once
// What a connection's token granted it, for the connection's whole life: the topics it may
// subscribe to and publish to (proto/jwt's compact grants) and when the token expires. It is
// the pub/sub session's, not the connection layer's, so it lives in a side table indexed by
// the connection's slot, in chunks that are allocated only when the slot numbers reach them.
// Only servers with tokens fill it: with --auth=none every connection has the same grants
// and no expiry.
//
// Budget: 32 bytes a connection. Grants up to 20 bytes in compact form (a mailbox token:
// `mailbox:1234567` is 16) sit in the record; longer ones take a heap block of their size. The
// token's user (its `sub`, as the process's user_table numbers it) is fixed at the upgrade.

#include <cstdint>
#include <cstring>
#include <memory>
#include <new>
#include <string_view>
#include <vector>

#include "proto/jwt.hpp"

namespace wspush::server::pubsub {

struct session_grants {
  static constexpr std::size_t inline_bytes = 20;
  std::uint32_t exp = 0;  // unix seconds; 0: no expiry
  std::uint32_t user = 0;  // user_table's number (0: the token named none)
  std::uint16_t topics_len = 0, pub_len = 0;
  // The grants, or (on_heap) where they are: a pointer kept in the same bytes, copied in and out
  // so that the record stays 4-byte aligned and within its 32 bytes.
  char inline_grants[inline_bytes];

  bool on_heap() const noexcept { return std::size_t(topics_len) + pub_len > inline_bytes; }
  char* heap() const noexcept {
    char* p;
    std::memcpy(&p, inline_grants, sizeof p);
    return p;
  }
  void set_heap(char* p) noexcept { std::memcpy(inline_grants, &p, sizeof p); }
  const char* grants() const noexcept { return on_heap() ? heap() : inline_grants; }
  proto::grants_view topics() const noexcept { return proto::grants_view({grants(), topics_len}); }
  proto::grants_view pub() const noexcept { return proto::grants_view({grants() + topics_len, pub_len}); }
};
static_assert(sizeof(session_grants) == 32, "session_grants budget: 32 bytes");

class session_table {
 public:
  static constexpr std::uint32_t chunk_size = 4096;

  session_table() = default;
  session_table(const session_table&) = delete;
  session_table& operator=(const session_table&) = delete;
  ~session_table() {
    for (std::uint32_t i = 0; i < capacity(); ++i) clear(i);
  }

  /// Stores slot i's grants (compact form, as jwt_claims holds them) and expiry. False when
  /// out of memory; the slot is then empty.
  bool set(std::uint32_t i, std::int64_t exp, std::string_view topics, std::string_view pub,
           std::uint32_t user = 0) noexcept {
    if (topics.size() > UINT16_MAX || pub.size() > UINT16_MAX) return false;
    while (i >= capacity())
      if (!grow()) return false;
    clear(i);
    session_grants& s = at(i);
    s.user = user;  // kept even if the grants cannot be: the close still leaves the right user
    std::size_t n = topics.size() + pub.size();
    char* dst = s.inline_grants;
    if (n > session_grants::inline_bytes) {
      dst = new (std::nothrow) char[n];
      if (!dst) return false;
      s.set_heap(dst);
    }
    if (!topics.empty()) std::memcpy(dst, topics.data(), topics.size());
    if (!pub.empty()) std::memcpy(dst + topics.size(), pub.data(), pub.size());
    s.topics_len = std::uint16_t(topics.size());
    s.pub_len = std::uint16_t(pub.size());
    s.exp = exp <= 0 ? 0 : exp > INT64_C(0xFFFFFFFF) ? 0xFFFFFFFFu : std::uint32_t(exp);
    return true;
  }

  /// Forgets slot i's session (its connection closed). Cheap for a slot never set.
  void clear(std::uint32_t i) noexcept {
    if (i >= capacity()) return;
    session_grants& s = at(i);
    if (s.on_heap()) delete[] s.heap();
    s.topics_len = s.pub_len = 0;
    s.exp = 0;
    s.user = 0;
  }

  /// Slot i's session; an empty one (no grants, no expiry) when never set.
  const session_grants& get(std::uint32_t i) const noexcept { return i < capacity() ? at(i) : _empty; }

  std::uint32_t capacity() const noexcept { return std::uint32_t(_chunks.size()) * chunk_size; }

 private:
  session_grants& at(std::uint32_t i) noexcept { return _chunks[i / chunk_size][i % chunk_size]; }
  const session_grants& at(std::uint32_t i) const noexcept { return _chunks[i / chunk_size][i % chunk_size]; }
  bool grow() noexcept {
    std::unique_ptr<session_grants[]> c(new (std::nothrow) session_grants[chunk_size]);
    if (!c) return false;
    try {
      _chunks.push_back(std::move(c));
    } catch (...) {
      return false;
    }
    return true;
  }

  std::vector<std::unique_ptr<session_grants[]>> _chunks;
  session_grants _empty{};
};

}  // namespace wspush::server::pubsub
