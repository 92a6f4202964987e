// The event-stream phase: a stream's `sub`, and every frame queued for it as events.

#include "server/conn/sse_phase.hpp"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <random>

#include "proto/sse.hpp"
#include "proto/ws_close.hpp"
#include "proto/ws_frame.hpp"
#include "server/base/random.hpp"
#include "server/conn/app.hpp"
#include "server/conn/connections.hpp"

namespace wspush::server {

sse_phase::sse_phase(connections& c) : _c(c), _rand(std::random_device{}() | 1) { _id.reserve(proto::max_sse_id_bytes); }

void sse_phase::start(std::uint32_t slot, std::span<const std::string_view> topics,
                      std::span<const std::string_view> positions) noexcept {
  // The `sub` a WebSocket client would send: topics and positions need no escaping (topic.hpp,
  // proto::is_position).
  std::size_t bound = 64;
  for (std::size_t k = 0; k < topics.size(); ++k) bound += 2 * topics[k].size() + positions[k].size() + 12;
  pool::lease l = _c.buffers().acquire(bound + 64);  // + the JSON parser's padding
  try {
    stream& s = _streams[slot] = stream{};
    s.topics.assign(topics.begin(), topics.end());
    s.at.assign(positions.begin(), positions.end());
    for (std::string& p : s.at) p.reserve(proto::max_id_bytes);  // an event's id never grows it
    _c.at(slot).ext |= ext_sse_state;
  } catch (...) {
    _streams.erase(slot);
    l.reset();
  }
  if (!l) return _c.close_now(slot);
  char* p = reinterpret_cast<char*>(l.data());
  char* const begin = p;
  auto put = [&p](std::string_view s) {
    std::memcpy(p, s.data(), s.size());
    p += s.size();
  };
  put(R"({"op":"sub","topics":[)");
  for (std::size_t k = 0; k < topics.size(); ++k) put(k ? ",\"" : "\""), put(topics[k]), put("\"");
  put("]");
  bool any = false;
  for (std::size_t k = 0; k < topics.size(); ++k) {
    if (positions[k].empty()) continue;
    put(any ? ",\"" : R"(,"since":{")"), put(topics[k]), put(R"(":")"), put(positions[k]), put("\"");
    any = true;
  }
  put(any ? "}}" : "}");
  const std::size_t n = std::size_t(p - begin);
  l.set_size(n);
  message m{proto::opcode::text, {l.data(), n}, l.capacity(), nullptr};
  _c.counters_mut().messages_in.add();
  _c.app().on_message(slot, m);
}

/// A stream's reconnect delay after a close: 1 to 10 s at random, so that the streams a drain
/// (or a restart) ends come back spread out instead of all at once.
std::uint32_t sse_phase::retry_ms() noexcept {
  return 1000 + std::uint32_t(next_random(_rand) % 9000);
}

pool::frame_ref sse_phase::shared(const pool::frame_ref& frames) noexcept {
  if (_shared_src != frames.bytes().data() || !_shared) {
    bool unused = false;
    _shared = render(no_slot, frames, unused);
    _shared_src = frames.bytes().data();
  }
  return _shared;
}

bool sse_phase::stateless(std::uint32_t slot) const noexcept { return !(_c.at(slot).ext & ext_sse_state); }

void sse_phase::forget(std::uint32_t slot) noexcept {
  if (_c.at(slot).ext & ext_sse_state) _streams.erase(slot);
}

pool::frame_ref sse_phase::render(std::uint32_t slot, const pool::frame_ref& frames, bool& close_after) noexcept {
  auto it = _streams.end();
  if (slot != no_slot && !stateless(slot)) it = _streams.find(slot);
  stream* s = it == _streams.end() ? nullptr : &it->second;
  std::span<const std::uint8_t> in = frames.bytes();
  pool::lease out = _c.buffers().acquire(in.size() + in.size() / 4 + 256);
  if (!out) return {};
  std::size_t at = 0;
  auto emit = [&](std::string_view event, std::string_view id, std::string_view data) {
    const std::size_t need = at + proto::sse_bound(event, id, data);
    if (need > out.capacity()) {
      out.set_size(at);
      if (!out.reserve(std::max(need, out.capacity() * 2))) return false;
    }
    at += proto::encode_sse(event, id, data, {reinterpret_cast<char*>(out.data()) + at, out.capacity() - at});
    return true;
  };
  auto emit_raw = [&](std::string_view text) {
    if (at + text.size() > out.capacity()) {
      out.set_size(at);
      if (!out.reserve(std::max(at + text.size(), out.capacity() * 2))) return false;
    }
    std::memcpy(out.data() + at, text.data(), text.size());
    at += text.size();
    return true;
  };
  auto joined = [&]() -> std::string_view {
    _id.clear();
    for (std::size_t k = 0; k < s->at.size(); ++k) {
      if (k) _id += ',';
      _id += s->at[k];
    }
    return _id;
  };
  while (!in.empty()) {
    auto h = proto::parse_frame_header(in);
    if (h.status != proto::parse_status::done || in.size() - h.header.size < h.header.payload_len) break;
    const auto payload = in.subspan(h.header.size, std::size_t(h.header.payload_len));
    in = in.subspan(h.header.size + payload.size());
    const std::string_view text(reinterpret_cast<const char*>(payload.data()), payload.size());
    bool ok = true;
    switch (proto::opcode(h.header.raw_opcode)) {
      case proto::opcode::ping: ok = emit_raw(":\n\n"); break;  // the keepalive: a comment
      case proto::opcode::close: {  // whatever the reason, the stream ends: when to come back
        // A revoked user's stream says so first, as a refusal (its token will not do again).
        const auto why = proto::parse_close_payload(payload);
        if (why.ok && why.info.has_code && why.info.code == std::uint16_t(proto::close_code::revoked) &&
            !emit("refused", {}, R"({"op":"error","code":"revoked"})"))
          return {};
        char line[32];
        const int n = std::snprintf(line, sizeof line, "retry: %u\n\n", unsigned(retry_ms()));
        ok = emit_raw({line, std::size_t(n)});
        break;
      }
      case proto::opcode::text: {
        const proto::sse_message m = proto::classify_message(text);
        if (m.kind == proto::sse_message::event) {
          std::string_view id = m.id;
          if (s) {
            for (std::size_t k = 0; k < s->topics.size(); ++k)
              if (s->topics[k] == m.topic) s->at[k].assign(m.id);
            id = joined();
          }
          ok = emit({}, id, text);
        } else if (m.kind == proto::sse_message::reply && m.op == "subbed" && s && s->opening) {
          // Where the stream resumes before its first event: a topic with a position it can
          // resume from keeps it (its replay follows); any other starts at the subscription's.
          proto::for_each_subbed_entry(text, [&](std::string_view topic, bool lost, std::string_view pos) {
            for (std::size_t k = 0; k < s->topics.size(); ++k)
              if (s->topics[k] == topic && (lost || s->at[k].empty()) && proto::is_position(pos)) s->at[k].assign(pos);
          });
          ok = emit("subbed", joined(), text);
          s->opening = false;
          if (s->topics.size() == 1) {  // from here on, an event's id is its own
            _streams.erase(it);
            _c.at(slot).ext &= ~ext_sse_state;
            s = nullptr;
          }
        } else if (m.kind == proto::sse_message::reply) {
          // `error` is named `refused` on a stream: an EventSource's own `error` event (the
          // connection failed) would reach the same listeners.
          const bool refused = m.op == "error";
          ok = emit(refused ? std::string_view("refused") : m.op, {}, text);
          if (refused && s && s->opening) close_after = true;  // its `sub` was refused
        }
        break;
      }
      default: break;  // no other frame has a form on the stream
    }
    if (!ok) return {};
  }
  out.set_size(at);
  return pool::frame_ref::adopt(std::move(out));
}

}  // namespace wspush::server
