// Output. Frames are queued per connection as shared references; a connection with queued
// output goes on the flush list once, and at the end of the loop iteration each listed
// connection is written once with everything it has (coalescing: a loopback send costs
// about the same CPU whatever its size, so sends per subscriber decide fan-out speed).
// While a send is in flight new frames just queue behind it and leave with the next one.

#include <algorithm>
#include <climits>
#include <cstring>

#include <sys/socket.h>
#include <unistd.h>

#include "server/app/log.hpp"
#include "server/conn/shard.hpp"
#include "server/conn/shard_internal.hpp"

namespace wspush::server {
namespace {

constexpr std::size_t first_queue_block = 256;
/// Connections written per loop iteration. A fan-out to tens of thousands of subscribers
/// goes out in slices of this many sends, with the loop taking new events between slices,
/// so one big publish does not hold up every other socket of the shard for its whole length.
constexpr std::uint32_t flush_slice = 1024;

/// The bytes of a queued frame without touching its reference count.
std::span<const std::uint8_t> raw_bytes(void* raw) noexcept {
  pool::frame_ref f = pool::frame_ref::from_raw(raw);
  auto b = f.bytes();
  f.release_raw();
  return b;
}

std::uint32_t slots_in(std::size_t block) noexcept {
  return std::uint32_t((block - sizeof(out_queue)) / sizeof(void*));
}

/// Moves the ring into a block twice the size, oldest frame first.
bool grow_queue(pool::buffer_pool& buffers, pool::lease& tx) noexcept {
  out_queue& q = *block_as<out_queue>(tx);
  pool::lease bigger = buffers.acquire(sizeof(out_queue) + 2 * std::size_t(q.cap) * sizeof(void*));
  if (!bigger) return false;
  out_queue& n = *new (bigger.data()) out_queue{};
  n.cap = slots_in(bigger.capacity());
  n.count = q.count;
  n.offset = q.offset;
  n.bytes = q.bytes;
  for (std::uint32_t k = 0; k < q.count; ++k) n.slots()[k] = q.slots()[(q.head + k) % q.cap];
  tx = std::move(bigger);
  return true;
}

}  // namespace

bool shard::queue(std::uint32_t i, pool::frame_ref f, bool control) noexcept {
  connection& c = _conns.at(i);
  if (!f || c.state == conn_state::free || c.state == conn_state::dead) return false;
  std::size_t size = f.bytes().size();
  if (!c.tx) {
    c.tx = _g.buffers->acquire(first_queue_block);
    if (!c.tx) return close_now(i), false;
    new (c.tx.data()) out_queue{};
    block_as<out_queue>(c.tx)->cap = slots_in(c.tx.capacity());
  }
  out_queue* q = block_as<out_queue>(c.tx);
  if (!control && c.state == conn_state::open && q->bytes > 0 && q->bytes + size > _cfg.max_pending_bytes) {
    // A slow consumer: it does not read what we send. Bounded memory beats completeness
    // here; the client reconnects and catches up. One message into an empty queue always
    // fits (its size is bounded by --max-message-bytes): the bound is on backlog.
    _n.slow_consumer_closes.add();
    log_ratelimited(log_level::info, "closing a slow consumer (%llu bytes unsent)", (unsigned long long)q->bytes);
    start_close(i, proto::close_code::try_again_later, true);
    return false;
  }
  if (q->count == q->cap) {
    if (!grow_queue(*_g.buffers, c.tx)) return close_now(i), false;
    q = block_as<out_queue>(c.tx);
  }
  q->slots()[(q->head + q->count) % q->cap] = f.release_raw();
  ++q->count;
  q->bytes += size;
  list(i);
  return true;
}

bool shard::queue_control(std::uint32_t i, proto::opcode op, std::span<const std::uint8_t> payload) noexcept {
  pool::lease l = _g.buffers->acquire(proto::max_server_header_size + payload.size());
  if (!l) return false;
  std::size_t hn = proto::encode_frame_header(std::span<std::uint8_t, proto::max_server_header_size>(l.data(), proto::max_server_header_size), op,
                                              true, payload.size());
  copy_bytes(l.data() + hn, payload);
  l.set_size(hn + payload.size());
  // Control frames bypass the slow-consumer bound: they are tiny and a close must get out.
  return queue(i, pool::frame_ref::adopt(std::move(l)), true);
}

void shard::list(std::uint32_t i) noexcept {
  connection& c = _conns.at(i);
  if (c.flags & flag_listed) return;
  c.flags |= flag_listed;
  c.flush_next = no_index;
  if (_flush_tail == no_index) _flush_head = i;
  else _conns.at(_flush_tail).flush_next = i;
  _flush_tail = i;
}

void shard::flush_listed() noexcept {
  for (std::uint32_t n = 0; _flush_head != no_index && n < flush_slice; ++n) {
    std::uint32_t i = _flush_head;
    connection& c = _conns.at(i);
    _flush_head = c.flush_next;
    if (_flush_head == no_index) _flush_tail = no_index;
    c.flush_next = no_index;
    c.flags &= ~flag_listed;
    if (c.state == conn_state::dead && !(c.flags & flag_send_in_flight)) finish_dead(i);  // its release waited for this
    if (c.state == conn_state::free || c.state == conn_state::dead) continue;
    if (c.flags & flag_rearm_read) {
      c.flags &= ~flag_rearm_read;
      _io->start_reading(c.fd, token_of(i));
    }
    flush(i);
  }
}

void shard::flush(std::uint32_t i) noexcept {
  connection& c = _conns.at(i);
  if (c.flags & (flag_send_in_flight | flag_wait_writable)) return;
  for (;;) {
    out_queue* q = c.tx ? block_as<out_queue>(c.tx) : nullptr;
    if (!q || q->count == 0) return output_drained(i);
    int n = int(std::min<std::size_t>({q->count, _iov.size(), IOV_MAX}));
    std::size_t offered = 0;
    for (int k = 0; k < n; ++k) {
      auto b = raw_bytes(q->slots()[(q->head + k) % q->cap]);
      std::size_t skip = k == 0 ? q->offset : 0;
      _iov[k] = {const_cast<std::uint8_t*>(b.data()) + skip, b.size() - skip};
      offered += b.size() - skip;
    }
    send_result r = _io->send(c.fd, token_of(i), _iov.data(), n);
    if (r.outcome == send_outcome::pending) {
      c.flags |= flag_send_in_flight;
      return;
    }
    if (r.outcome == send_outcome::failed) return close_now(i);
    consume_output(i, r.bytes);
    if (r.bytes < offered) {  // the socket is full: wait until it has room
      c.flags |= flag_wait_writable;
      _io->wait_writable(c.fd, token_of(i));
      return;
    }
  }
}

void shard::consume_output(std::uint32_t i, std::size_t bytes) noexcept {
  connection& c = _conns.at(i);
  out_queue& q = *block_as<out_queue>(c.tx);
  _n.bytes_out.add(bytes);
  q.bytes -= std::min<std::uint64_t>(bytes, q.bytes);
  while (bytes > 0 && q.count > 0) {
    void* raw = q.slots()[q.head];
    std::size_t left = raw_bytes(raw).size() - q.offset;
    if (bytes < left) {
      q.offset += std::uint32_t(bytes);
      return;
    }
    bytes -= left;
    q.offset = 0;
    pool::frame_ref::from_raw(raw);  // drops our reference
    q.head = (q.head + 1) % q.cap;
    --q.count;
  }
}

void shard::output_drained(std::uint32_t i) noexcept {
  connection& c = _conns.at(i);
  c.tx.reset();  // the ring is empty: nothing to release but the block
  if (c.flags & flag_close_when_flushed) return close_now(i);
  if (c.flags & flag_linger_when_flushed) {
    c.flags &= ~flag_linger_when_flushed;
    ::shutdown(c.fd, SHUT_WR);
  }
}

void shard::on_send_done(conn_token t, int res) noexcept {
  std::uint32_t i = lookup(t);
  if (i == no_index) return;
  connection& c = _conns.at(i);
  c.flags &= ~flag_send_in_flight;
  if (c.state == conn_state::dead) return finish_dead(i);
  if (res < 0) return close_now(i);
  consume_output(i, std::size_t(res));
  list(i);  // what queued meanwhile leaves with the next send, at the end of this iteration
}

void shard::on_writable(conn_token t) noexcept {
  std::uint32_t i = lookup(t);
  if (i == no_index) return;
  _conns.at(i).flags &= ~flag_wait_writable;
  list(i);
}

void shard::close_now(std::uint32_t i) noexcept {
  connection& c = _conns.at(i);
  if (c.state == conn_state::free || c.state == conn_state::dead) return;
  _wheel.cancel(i);
  // The count goes down before the socket closes: a peer that sees the close may connect again
  // at once, on another shard too, and must find the slot free under --max-connections.
  _g.connections.fetch_sub(1, std::memory_order_release);
  _io->close(c.fd, token_of(i));
  c.fd = -1;
  if (c.rx) {  // open/closing: an rx_state; before that, plain bytes or an upgrade_job
    if (c.state == conn_state::open || c.state == conn_state::closing) block_as<rx_state>(c.rx)->~rx_state();
    c.rx.reset();
  }
  set_state(i, conn_state::dead);
  if (!(c.flags & flag_send_in_flight)) finish_dead(i);  // else the send's completion does it
}

void shard::finish_dead(std::uint32_t i) noexcept {
  if (_fanning) {  // a fan-out is walking a topic's subscribers: release the slot after it
    _release_later.push_back(i);
    return;
  }
  connection& c = _conns.at(i);
  // The flush list links through flush_next, which the slab reuses as its free-list link: a
  // slot still on the list is released when flush_listed takes it off, never before.
  if (c.flags & flag_listed) return;
  if (c.tx) {
    out_queue& q = *block_as<out_queue>(c.tx);
    for (; q.count; --q.count, q.head = (q.head + 1) % q.cap) pool::frame_ref::from_raw(q.slots()[q.head]);
    c.tx.reset();
  }
  if (_topics.unsubscribe_all(i)) count_subscriptions();  // a reused slot starts with no topics
  _sessions.clear(i);
  set_state(i, conn_state::free);
  _conns.release(i);
}

}  // namespace wspush::server
