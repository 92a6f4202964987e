#pragma once
// The per-loop slab of connection records, in chunks allocated as the table grows, so
// memory follows the number of connections and records never move (nginx's connection
// array, grown in pieces). Free slots form a list through `last_rx`, unused while free.

#include <memory>
#include <vector>

#include "server/conn/connection.hpp"
#include "server/reactor/timer_wheel.hpp"

namespace wspush::server {

class conn_table {
 public:
  static constexpr std::uint32_t chunk_size = 4096;

  /// A free slot with a fresh generation, or no_index when `limit` is reached or memory ran out.
  std::uint32_t acquire(std::uint32_t limit) noexcept {
    if (_count >= limit || (_free == no_index && !grow())) return no_index;
    std::uint32_t i = _free;
    connection& c = at(i);
    _free = c.last_rx;
    c.last_rx = 0;
    c.gen = (c.gen + 1) & 0xFFFFFF;
    if (c.gen == 0) c.gen = 1;  // token 0 is reserved
    ++_count;
    return i;
  }

  void release(std::uint32_t i) noexcept {
    connection& c = at(i);
    c.state = conn_state::free;
    c.flags = 0;
    c.fd = -1;
    c.last_rx = _free;
    _free = i;
    --_count;
  }

  connection& at(std::uint32_t i) noexcept { return _chunks[i / chunk_size][i % chunk_size]; }
  const connection& at(std::uint32_t i) const noexcept { return _chunks[i / chunk_size][i % chunk_size]; }

  /// The live record for a token, or nullptr if the slot was released or reused since.
  connection* find(conn_token t) noexcept {
    std::uint32_t i = token_index(t);
    if (i >= _capacity) return nullptr;
    connection& c = at(i);
    return (c.state != conn_state::free && c.gen == token_gen(t)) ? &c : nullptr;
  }

  std::uint32_t size() const noexcept { return _count; }
  std::uint32_t capacity() const noexcept { return _capacity; }

 private:
  bool grow() noexcept {
    auto chunk = std::unique_ptr<connection[]>(new (std::nothrow) connection[chunk_size]);
    if (!chunk) return false;
    std::uint32_t base = _capacity;
    for (std::uint32_t k = chunk_size; k-- > 0;) {  // lowest index first out of the free list
      chunk[k].last_rx = _free;
      _free = base + k;
    }
    _chunks.push_back(std::move(chunk));
    _capacity += chunk_size;
    return true;
  }

  std::vector<std::unique_ptr<connection[]>> _chunks;
  std::uint32_t _free = no_index;
  std::uint32_t _count = 0;
  std::uint32_t _capacity = 0;
};

}  // namespace wspush::server
