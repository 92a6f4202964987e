#include "server/conn/compression.hpp"

#include "proto/ws_deflate.hpp"
#include "proto/ws_frame.hpp"

namespace wspush::server {

void compression::attach(pool::buffer_pool& buffers, pool::frame_ref& frame) noexcept {
  if (!_on || users() == 0 || !frame || frame.has_twin()) return;
  const auto bytes = frame.bytes();
  const proto::header_result hr = proto::parse_frame_header(bytes);
  const proto::frame_header& h = hr.header;
  if (hr.status != proto::parse_status::done || !h.fin || h.rsv != 0 || h.masked ||
      (h.raw_opcode != std::uint8_t(proto::opcode::text) && h.raw_opcode != std::uint8_t(proto::opcode::binary)) ||
      h.size + h.payload_len != bytes.size() || h.payload_len < _min_bytes)
    return;
  thread_local proto::message_deflater deflater;  // ~200 KB of tables per thread that compresses (level 1)
  if (!deflater) return;
  const auto payload = bytes.subspan(h.size);
  constexpr std::size_t room = proto::max_server_header_size;
  pool::lease l = buffers.acquire(room + deflater.bound(payload.size()));
  if (!l) return;
  const std::size_t n = deflater.deflate(payload, {l.data() + room, l.capacity() - room});
  if (n == 0 || n >= payload.size()) return;  // no gain: plain for everyone
  const std::size_t size = proto::frame_in_place({l.data(), l.capacity()}, proto::opcode(h.raw_opcode), n);
  l.data()[0] |= 0x40;  // RSV1: a compressed message
  l.set_size(size);
  if (!frame.set_twin(pool::frame_ref::adopt(std::move(l)))) return;
  _frames.fetch_add(1, std::memory_order_relaxed);
  _bytes_in.fetch_add(payload.size(), std::memory_order_relaxed);
  _bytes_out.fetch_add(n, std::memory_order_relaxed);
}

}  // namespace wspush::server
