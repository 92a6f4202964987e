#include "server/pubsub/hub.hpp"

#include <cstring>

#include "proto/envelope.hpp"
#include "proto/ws_frame.hpp"
#include "server/conn/shard.hpp"
#include "server/reactor/clock.hpp"

namespace wspush::server {
namespace {

constexpr std::string_view event_prefix = R"({"topic":")";


}  // namespace

hub::hub(pubsub::history_options o, pool::buffer_pool& buffers, const std::vector<shard*>& shards)
    : _history(std::move(o)), _buffers(buffers), _shards(shards) {}

pool::frame_ref hub::encode(std::string_view topic, std::string_view id, std::string_view data_raw) noexcept {
  constexpr std::size_t room = proto::max_server_header_size;
  std::size_t bound = proto::event_size_bound(topic, id, data_raw);
  pool::lease l = _buffers.acquire(room + bound);
  if (!l) return {};
  std::size_t n = proto::encode_event(topic, id, data_raw, {reinterpret_cast<char*>(l.data()) + room, bound});
  if (n == 0) return {};
  l.set_size(proto::frame_in_place({l.data(), l.capacity()}, proto::opcode::text, n));
  return pool::frame_ref::adopt(std::move(l));
}

bool hub::publish(std::string_view topic, std::string_view data_raw, pubsub::history_id& id, bool wake) noexcept {
  auto made = _history.append(topic, monotonic_ns(), [&](std::string_view new_id, std::uint64_t seq) noexcept {
    pool::frame_ref f = encode(topic, new_id, data_raw);
    if (!f) return f;
    std::uint32_t part = _history.shard_of(topic);
    for (shard* s : _shards) s->post({inbox_item::event, pool::frame_ref(f).release_raw(), seq, part}, false);
    std::memcpy(id.bytes, new_id.data(), new_id.size());
    id.len = std::uint8_t(new_id.size());
    return f;
  });
  if (!made.ok) return false;
  if (wake) wake_all();
  return true;
}

bool hub::crowded() const noexcept {
  for (const shard* s : _shards)
    if (s->inbox_crowded()) return true;
  return false;
}

void hub::wake_all() noexcept {
  for (shard* s : _shards) s->wake();
}

std::string_view event_topic(std::span<const std::uint8_t> frame) noexcept {
  if (frame.size() < 2) return {};
  std::size_t len7 = frame[1] & 0x7F, at = len7 < 126 ? 2 : len7 == 126 ? 4 : 10;
  if (frame.size() < at + event_prefix.size()) return {};
  std::string_view payload(reinterpret_cast<const char*>(frame.data()) + at, frame.size() - at);
  if (payload.substr(0, event_prefix.size()) != event_prefix) return {};
  payload.remove_prefix(event_prefix.size());
  std::size_t end = payload.find('"');
  return end == std::string_view::npos ? std::string_view{} : payload.substr(0, end);
}

}  // namespace wspush::server
