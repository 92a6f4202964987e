#include "server/conn/out_queue.hpp"

#include <algorithm>
#include <cstring>
#include <new>

#include "proto/ws_frame.hpp"

namespace wspush::server {

out_queue& out_queue::operator=(out_queue&& other) noexcept {
  if (this != &other) {
    clear();
    _block = std::move(other._block);
  }
  return *this;
}

/// Makes room for one more frame: the first block, or the ring moved into one twice the size
/// (oldest frame first). False when out of memory.
bool out_queue::room(pool::buffer_pool& pool) noexcept {
  if (_block && head().count < head().cap) return true;
  std::size_t slots_now = _block ? head().cap : 0;
  std::size_t want = slots_now ? sizeof(header) + 2 * slots_now * sizeof(pool::frame_ref) : first_block;
  pool::lease bigger = pool.acquire(want);
  if (!bigger) return false;
  header h = _block ? head() : header{};
  auto* fresh = reinterpret_cast<pool::frame_ref*>(bigger.data() + sizeof(header));
  for (std::uint32_t k = 0; k < h.count; ++k) {
    ::new (static_cast<void*>(fresh + k)) pool::frame_ref(std::move(at(k)));
    at(k).~frame_ref();
  }
  h.first = 0;
  h.cap = std::uint32_t((bigger.capacity() - sizeof(header)) / sizeof(pool::frame_ref));
  ::new (static_cast<void*>(bigger.data())) header(h);
  _block = std::move(bigger);
  return true;
}

bool out_queue::push(pool::buffer_pool& pool, pool::frame_ref f) noexcept {
  if (!f || !room(pool)) return false;
  header& h = head();
  h.bytes += f.bytes().size();
  ::new (static_cast<void*>(&slots()[(h.first + h.count) % h.cap])) pool::frame_ref(std::move(f));
  ++h.count;
  return true;
}

/// Whether a pong waits unsent and may be replaced: queued, not the frame being written (partly
/// sent), not covered by the send in flight. `k` receives its index from the first frame.
bool out_queue::pong_waiting(header& h, std::uint32_t& k) const noexcept {
  if (h.pong_at == UINT64_MAX || h.pong_at < h.popped || h.pong_at - h.popped >= h.count) return false;
  k = std::uint32_t(h.pong_at - h.popped);
  if (k == 0 && h.offset > 0) return false;
  std::uint64_t before = 0;  // unsent bytes ahead of it
  for (std::uint32_t j = 0; j < k && before < h.offered; ++j) before += at(j).bytes().size() - (j == 0 ? h.offset : 0);
  return before >= h.offered;
}

bool out_queue::push_pong(pool::buffer_pool& pool, std::span<const std::uint8_t> payload) noexcept {
  if (payload.size() > proto::max_control_payload_size) return false;
  pool::lease l = pool.acquire(proto::max_server_header_size + payload.size());
  if (!l) return false;
  std::size_t hn = proto::encode_frame_header(
      std::span<std::uint8_t, proto::max_server_header_size>(l.data(), proto::max_server_header_size),
      proto::opcode::pong, true, payload.size());
  if (!payload.empty()) std::memcpy(l.data() + hn, payload.data(), payload.size());
  l.set_size(hn + payload.size());
  pool::frame_ref f = pool::frame_ref::adopt(std::move(l));
  std::uint32_t k = 0;
  if (_block && pong_waiting(head(), k)) {
    header& h = head();
    h.bytes = h.bytes - at(k).bytes().size() + f.bytes().size();
    at(k) = std::move(f);
    return true;
  }
  if (!push(pool, std::move(f))) return false;
  head().pong_at = head().popped + head().count - 1;
  return true;
}

int out_queue::gather(std::span<iovec> iov, std::size_t& offered, std::size_t max_bytes) const noexcept {
  offered = 0;
  if (!_block) return 0;
  const header& h = head();
  int n = int(std::min<std::size_t>(h.count, iov.size()));
  int k = 0;
  for (; k < n; ++k) {
    auto b = at(std::uint32_t(k)).bytes();
    std::size_t skip = k == 0 ? h.offset : 0;
    if (k > 0 && offered + (b.size() - skip) > max_bytes) break;  // the first goes whatever its size
    iov[k] = {const_cast<std::uint8_t*>(b.data()) + skip, b.size() - skip};
    offered += b.size() - skip;
  }
  return k;
}

void out_queue::sending(std::size_t offered, std::uint64_t turn) noexcept {
  head().offered = offered;
  head().sent_turn = turn;
}

void out_queue::consume(std::size_t n) noexcept {
  if (!_block) return;
  header& h = head();
  h.offered = 0;
  h.taken += n;
  h.bytes -= std::min<std::uint64_t>(n, h.bytes);
  while (n > 0 && h.count > 0) {
    std::size_t left = at(0).bytes().size() - h.offset;
    if (n < left) {
      h.offset += std::uint32_t(n);
      return;
    }
    n -= left;
    h.offset = 0;
    at(0).~frame_ref();
    h.first = (h.first + 1) % h.cap;
    --h.count;
    ++h.popped;
  }
  if (h.count == 0) _block.reset();  // nothing left: an idle connection holds no block
}

void out_queue::drop_unsent() noexcept {
  if (!_block) return;
  header& h = head();
  std::uint32_t keep = 0;
  std::uint64_t kept = 0;
  // Keep the frames the send in flight covers, and a frame already partly written.
  while (keep < h.count && (kept < h.offered || (keep == 0 && h.offset > 0))) {
    kept += at(keep).bytes().size() - (keep == 0 ? h.offset : 0);
    ++keep;
  }
  for (std::uint32_t k = keep; k < h.count; ++k) at(k).~frame_ref();
  h.count = keep;
  h.bytes = kept;
  if (h.count == 0) _block.reset();
}

void out_queue::clear() noexcept {
  if (!_block) return;
  header& h = head();
  for (std::uint32_t k = 0; k < h.count; ++k) at(k).~frame_ref();
  _block.reset();
}

}  // namespace wspush::server
