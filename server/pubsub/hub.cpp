#include "server/pubsub/hub.hpp"

#include <cstring>

#include "proto/envelope.hpp"
#include "proto/ws_frame.hpp"
#include "server/base/clock.hpp"

namespace wspush::server::pubsub {

namespace {

/// Without namespaces: every topic has the history's limits, and the rest at its default.
namespaces own_namespaces(const history_options& o) {
  topic_options t;
  t.history_size = o.size_per_topic;
  t.history_ttl = double(o.ttl_ns) / 1e9;
  return namespaces(t, {});
}

}  // namespace

hub::hub(history_options o, pool::buffer_pool& buffers)
    : _own(own_namespaces(o)), _spaces(o.spaces ? *o.spaces : _own), _history(std::move(o)), _buffers(buffers) {}


pool::frame_ref hub::encode(std::string_view topic, std::string_view id, std::string_view data_raw,
                            std::string_view& topic_in_frame) noexcept {
  constexpr std::size_t room = proto::max_server_header_size;
  // A valid topic and an id need no escaping, so the event is exactly this long: a block sized
  // for it is 3-5x smaller than one sized for escaping every byte, and the history keeps it for
  // --history-ttl. A topic that does need escaping overflows it and gets the full bound.
  std::size_t exact = 28 + topic.size() + id.size() + data_raw.size();  // {"topic":"","id":"","data":}
  pool::lease l;
  std::size_t n = 0;
  for (std::size_t bound : {exact, proto::event_size_bound(topic, id, data_raw)}) {
    l = _buffers.acquire(room + bound);
    if (!l) return {};
    n = proto::encode_event(topic, id, data_raw, {reinterpret_cast<char*>(l.data()) + room, bound});
    if (n != 0) break;
  }
  if (n == 0) return {};
  std::size_t size = proto::frame_in_place({l.data(), l.capacity()}, proto::opcode::text, n);
  l.set_size(size);
  std::size_t header = size - n;
  topic_in_frame = {reinterpret_cast<const char*>(l.data()) + header + proto::event_topic_offset, topic.size()};
  pool::frame_ref f = pool::frame_ref::adopt(std::move(l));
  if (_compression && _spaces.of(topic).compression) _compression->attach(_buffers, f);
  return f;
}

void hub::offer_all(const event& e, bool wake) noexcept {
  for (event_port* p : _ports) {
    event copy{e.frame, e.topic, e.seq, e.part, {}};
    if (!p->offer(std::move(copy), wake)) _dropped.fetch_add(1, std::memory_order_relaxed);
  }
}

publish_status hub::publish(std::string_view topic, std::string_view data_raw, history_id& id, bool wake,
                            std::string_view idempotency_key) noexcept {
  if (crowded()) return publish_status::busy;
  auto made = _history.append(topic, monotonic_ns(), [&](std::string_view new_id, std::uint64_t seq) noexcept {
    event e;
    e.frame = encode(topic, new_id, data_raw, e.topic);
    if (!e.frame) return pool::frame_ref{};
    e.seq = seq;
    e.part = _history.part_of(topic);
    offer_all(e, false);
    std::memcpy(id.bytes, new_id.data(), new_id.size());
    id.len = std::uint8_t(new_id.size());
    return std::move(e.frame);
  }, idempotency_key);
  if (!made.ok) return publish_status::no_memory;
  if (made.duplicate) {
    id = _history.format_id(made.seq);  // the first publish's: nothing new to wake anyone for
    return publish_status::ok;
  }
  if (wake) wake_all();
  return publish_status::ok;
}

publish_status hub::relay(pool::frame_ref frame, std::string_view topic) noexcept {
  if (crowded()) return publish_status::busy;
  if (_compression) _compression->attach(_buffers, frame);
  offer_all(event{std::move(frame), topic, 0, no_part, {}}, true);
  return publish_status::ok;
}

bool hub::crowded() const noexcept {
  for (const event_port* p : _ports)
    if (p->crowded()) return true;
  return false;
}

void hub::wake_all() noexcept {
  for (event_port* p : _ports) p->wake();
}

}  // namespace wspush::server::pubsub
