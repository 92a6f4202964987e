#include "server/conn/app.hpp"

#include <cstring>

namespace wspush::server {

pool::frame_ref frame_message(pool::buffer_pool& buffers, message& m) noexcept {
  pool::lease frame;
  if (m.block && *m.block) {  // assembled in place: put the header right before the payload
    frame = std::move(*m.block);
    frame.set_size(proto::frame_in_place({frame.data(), frame.capacity()}, m.op, m.payload.size()));
  } else {
    frame = buffers.acquire(message_header_room + m.payload.size());
    if (!frame) return {};
    if (!m.payload.empty()) std::memcpy(frame.data() + message_header_room, m.payload.data(), m.payload.size());
    frame.set_size(proto::frame_in_place({frame.data(), frame.capacity()}, m.op, m.payload.size()));
  }
  return pool::frame_ref::adopt(std::move(frame));
}

}  // namespace wspush::server
