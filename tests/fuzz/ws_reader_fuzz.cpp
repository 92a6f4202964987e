// Fuzz target for proto::ws_reader. Input: one control byte (split pattern, limits, whether the
// handler stops now and then, whether permessage-deflate is on), then client→server wire bytes. The bytes are read twice: whole,
// and split at pseudo-random points with the unconsumed tail presented again like a real
// caller. Both readings must produce the same completed events and the same verdict, and every
// event must satisfy what the reader promises (first/last bracketing, valid UTF-8 text, control
// payloads within 125 bytes, valid close payloads, limits; a compressed message only with the
// extension, within the limits plus deflate's slack, and not UTF-8 checked).

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "fuzz_check.hpp"
#include "proto/ws_reader.hpp"

using namespace wspush::proto;

namespace {

struct checking_handler {
  const ws_limits* limits = nullptr;
  std::string log;          // completed events: messages and control frames
  std::string message;      // the message being assembled
  bool in_message = false;
  opcode message_op = opcode::continuation;
  bool message_compressed = false;
  std::size_t calls = 0;
  std::size_t stop_every = 0;  // return false on every n-th call; 0 = never

  bool on_data(opcode op, std::span<std::uint8_t> piece, bool first, bool last, bool compressed) noexcept {
    WSPUSH_FUZZ_CHECK(op == opcode::text || op == opcode::binary);
    WSPUSH_FUZZ_CHECK(first != in_message);
    WSPUSH_FUZZ_CHECK(!compressed || limits->deflate);
    if (first) message_op = op, message.clear(), message_compressed = compressed;
    WSPUSH_FUZZ_CHECK(op == message_op && compressed == message_compressed);
    message.append(reinterpret_cast<const char*>(piece.data()), piece.size());
    WSPUSH_FUZZ_CHECK(message.size() <= limits->max_message_bytes + (compressed ? deflate_slack(limits->max_message_bytes) : 0));
    in_message = !last;
    if (last) {
      if (op == opcode::text && !compressed)
        WSPUSH_FUZZ_CHECK(is_valid_utf8({reinterpret_cast<const std::uint8_t*>(message.data()), message.size()}));
      if (compressed) log += "Z";
      log += op == opcode::text ? "T" : "B";
      log += std::to_string(message.size()) + ":" + message + ";";
    }
    return !(stop_every != 0 && ++calls % stop_every == 0);
  }

  bool on_control(opcode op, std::span<std::uint8_t> payload) noexcept {
    WSPUSH_FUZZ_CHECK(op == opcode::ping || op == opcode::pong || op == opcode::close);
    WSPUSH_FUZZ_CHECK(payload.size() <= 125);
    if (op == opcode::close) WSPUSH_FUZZ_CHECK(parse_close_payload(payload).ok);
    log += "C" + std::to_string(static_cast<int>(op)) + ":";
    log.append(reinterpret_cast<const char*>(payload.data()), payload.size());
    log += ";";
    return !(stop_every != 0 && ++calls % stop_every == 0);
  }
};

struct outcome {
  parse_status status;
  close_code error;
  std::string log;
  bool in_message;
};

outcome read_all(const std::uint8_t* data, std::size_t size, const ws_limits& limits, std::uint8_t control,
                 bool split_it) {
  checking_handler h;
  h.limits = &limits;
  h.stop_every = (control & 0x40) ? 3 : 0;
  ws_reader reader;
  std::vector<std::uint8_t> buf;  // what the caller holds: the unconsumed tail, then new bytes
  wspush::fuzz::splitter split(control);
  std::size_t fed = 0;
  read_result r{parse_status::done, 0, close_code{}};
  while (fed < size || !buf.empty()) {
    const std::size_t n = split_it ? std::min(split.next((control & 0x20) ? 4 : 200), size - fed) : size - fed;
    buf.insert(buf.end(), data + fed, data + fed + n);
    fed += n;
    r = reader.consume(buf, limits, h);
    if (r.status == parse_status::error) break;
    WSPUSH_FUZZ_CHECK(r.consumed <= buf.size());
    if (r.status == parse_status::need_more) {
      WSPUSH_FUZZ_CHECK(r.consumed < buf.size());
      WSPUSH_FUZZ_CHECK(buf.size() - r.consumed <= 131);  // a partial header or control frame, no more
      WSPUSH_FUZZ_CHECK(!reader.mid_frame());
    }
    buf.erase(buf.begin(), buf.begin() + static_cast<std::ptrdiff_t>(r.consumed));
    // a stopped reader resumes on the same bytes; a reader waiting for more stops here
    if (r.status == parse_status::need_more && fed == size) break;
  }
  return {r.status, r.error, h.log, reader.in_message()};
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  const std::uint8_t control = data[0];
  ++data, --size;
  ws_limits limits;
  if (control & 0x80) limits = {64, 160};  // small limits so 1009 paths are reachable
  limits.deflate = (control & 0x20) != 0;  // RSV1 on a message's first frame: compressed
  const outcome whole = read_all(data, size, limits, control & 0xBF, false);
  const outcome split = read_all(data, size, limits, control, true);
  WSPUSH_FUZZ_CHECK(whole.status == split.status);
  WSPUSH_FUZZ_CHECK(whole.error == split.error);
  WSPUSH_FUZZ_CHECK(whole.log == split.log);
  if (whole.status != parse_status::error) WSPUSH_FUZZ_CHECK(whole.in_message == split.in_message);
  if (whole.status == parse_status::error) {
    const auto e = whole.error;
    WSPUSH_FUZZ_CHECK(e == close_code::protocol_error || e == close_code::invalid_payload || e == close_code::too_big);
  }
  return 0;
}
