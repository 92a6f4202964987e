#pragma once
// The connection layer as the pub/sub session sees it, for its unit tests: what each connection
// was sent (the payload of each frame), closes, app bits, holds and resumes, and what it has
// unsent: send() adds a frame's bytes, drain() is the client reading (the session asks only on
// a bus's paced replay).

#include <algorithm>
#include <cstdint>
#include <map>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "pool/buffer_pool.hpp"
#include "proto/ws_frame.hpp"
#include "server/conn/app.hpp"

namespace wspush::server::pubsub::testing {

class fake_conns final : public conn_ops {
 public:
  explicit fake_conns(pool::buffer_pool& b) : _b(b) {}
  bool send(conn_id c, pool::frame_ref f) noexcept override {
    if (closed.count(c)) return false;
    auto bytes = f.bytes();  // one frame, or several back to back (a run joined by the fanout)
    unsent[c] += bytes.size();
    while (!bytes.empty()) {
      auto h = proto::parse_frame_header(bytes);
      std::size_t end = h.header.size + std::size_t(h.header.payload_len);
      sent[c].emplace_back(reinterpret_cast<const char*>(bytes.data()) + h.header.size, end - h.header.size);
      bytes = bytes.subspan(end);
    }
    return true;
  }
  send_counts send_all(std::span<const conn_id> cs, const pool::frame_ref& f, std::uint32_t) noexcept override {
    send_counts n;
    for (conn_id c : cs) (send(c, f) ? n.queued : n.closing) += 1;
    return n;
  }
  void close(conn_id c, proto::close_code code) noexcept override { closed[c] = std::uint16_t(code); }
  bool is_open(conn_id c) const noexcept override { return !closed.count(c); }
  std::size_t unsent_bytes(conn_id c) const noexcept override { return unsent.count(c) ? unsent.at(c) : 0; }
  void expiry_changed(conn_id) noexcept override { ++expiry_changes; }
  std::uint8_t app_bits(conn_id c) const noexcept override { return bits.count(c) ? bits.at(c) : 0; }
  void set_app_bits(conn_id c, std::uint8_t v) noexcept override { bits[c] = v; }
  pool::buffer_pool& buffers() noexcept override { return _b; }
  void hold(conn_id c) noexcept override { held.insert(c); }
  void resume(conn_id c) noexcept override {
    held.erase(c);
    ++resumes[c];
  }

  /// The client read `n` bytes of what `c` had unsent (all by default).
  void drain(conn_id c, std::size_t n = SIZE_MAX) { unsent[c] -= std::min(n, unsent[c]); }

  std::map<conn_id, std::vector<std::string>> sent;
  std::map<conn_id, std::size_t> unsent;
  std::map<conn_id, std::uint16_t> closed;
  std::map<conn_id, std::uint8_t> bits;
  std::set<conn_id> held;
  std::map<conn_id, int> resumes;
  int expiry_changes = 0;

 private:
  pool::buffer_pool& _b;
};

}  // namespace wspush::server::pubsub::testing
