/// \file wire.cpp
#include "loadgen/wire.hpp"

#include <openssl/evp.h>
#include <zlib.h>

#include <cctype>
#include <charconv>
#include <stdexcept>

namespace wspush::loadgen {
namespace {

std::string base64(std::span<const std::uint8_t> in) {
  static constexpr char alphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  for (std::size_t i = 0; i < in.size(); i += 3) {
    const std::size_t n = std::min<std::size_t>(3, in.size() - i);
    std::uint32_t v = std::uint32_t{in[i]} << 16;
    if (n > 1) v |= std::uint32_t{in[i + 1]} << 8;
    if (n > 2) v |= in[i + 2];
    out += alphabet[(v >> 18) & 63];
    out += alphabet[(v >> 12) & 63];
    out += n > 1 ? alphabet[(v >> 6) & 63] : '=';
    out += n > 2 ? alphabet[v & 63] : '=';
  }
  return out;
}

bool iequals(std::string_view a, std::string_view b) noexcept {
  return a.size() == b.size() &&
         std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) { return (x | 0x20) == (y | 0x20); });
}

/// The digits at `pos` in `s`, as a number; advances pos past them. False when there are none.
bool read_u64(std::string_view s, std::size_t& pos, std::uint64_t& out) noexcept {
  const char* first = s.data() + pos;
  const auto [end, ec] = std::from_chars(first, s.data() + s.size(), out);
  if (ec != std::errc{} || end == first) return false;
  pos += static_cast<std::size_t>(end - first);
  return true;
}

/// The string value after `"key":"` (no escapes: topic names and ids never need them).
std::string_view string_field(std::string_view msg, std::string_view key_quote) noexcept {
  const std::size_t at = msg.find(key_quote);
  if (at == std::string_view::npos) return {};
  const std::size_t from = at + key_quote.size();
  const std::size_t end = msg.find('"', from);
  if (end == std::string_view::npos) return {};
  return msg.substr(from, end - from);
}

}  // namespace

std::string make_key(xorshift& rng) {
  std::array<std::uint8_t, 16> raw{};
  for (std::size_t i = 0; i < raw.size(); i += 8) {
    const std::uint64_t v = rng.next();
    std::memcpy(raw.data() + i, &v, 8);
  }
  return base64(raw);
}

std::string expected_accept(std::string_view key) {
  std::string input(key);
  input += "258EAFA5-E914-47DA-95CA-C5AB0DC85B11";
  std::array<std::uint8_t, EVP_MAX_MD_SIZE> digest{};
  unsigned int len = 0;
  EVP_Digest(input.data(), input.size(), digest.data(), &len, EVP_sha1(), nullptr);
  return base64(std::span<const std::uint8_t>(digest.data(), len));
}

std::string make_upgrade_request(std::string_view path, std::string_view host, std::string_view key,
                                 std::string_view token, bool deflate) {
  std::string r;
  r.reserve(256 + token.size());
  r.append("GET ").append(path);
  if (!token.empty()) r.append(path.find('?') == std::string_view::npos ? "?token=" : "&token=").append(token);
  r.append(" HTTP/1.1\r\nHost: ").append(host);
  r.append("\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: ").append(key);
  r.append("\r\nSec-WebSocket-Version: 13\r\n");
  if (deflate) r.append("Sec-WebSocket-Extensions: permessage-deflate; client_max_window_bits\r\n");
  r.append("\r\n");
  return r;
}

upgrade_answer check_upgrade_response(std::string_view head, std::string_view accept) noexcept {
  upgrade_answer a;
  if (head.size() < 12 || head.substr(0, 7) != "HTTP/1." || head[8] != ' ') return a;
  std::size_t pos = 9;
  std::uint64_t code = 0;
  if (!read_u64(head, pos, code) || pos != 12 || code > 999) return a;
  a.status = static_cast<int>(code);
  if (a.status != 101) return a;
  constexpr std::string_view name = "sec-websocket-accept:", ext = "sec-websocket-extensions:";
  for (std::size_t at = head.find("\r\n"); at != std::string_view::npos; at = head.find("\r\n", at + 2)) {
    const std::string_view line = head.substr(at + 2, head.find("\r\n", at + 2) - at - 2);
    const bool is_accept = line.size() >= name.size() && iequals(line.substr(0, name.size()), name);
    const bool is_ext = line.size() >= ext.size() && iequals(line.substr(0, ext.size()), ext);
    if (!is_accept && !is_ext) continue;
    std::string_view v = line.substr(is_accept ? name.size() : ext.size());
    while (!v.empty() && (v.front() == ' ' || v.front() == '\t')) v.remove_prefix(1);
    while (!v.empty() && (v.back() == ' ' || v.back() == '\t')) v.remove_suffix(1);
    if (is_accept) a.accept_ok = v == accept;
    else a.deflate = v.starts_with("permessage-deflate");
  }
  return a;
}

std::string make_stream_request(std::string_view path, std::string_view host, std::string_view topic,
                                std::string_view token, std::string_view last_id) {
  static constexpr char hex[] = "0123456789ABCDEF";
  std::string r;
  r.reserve(160 + 3 * topic.size() + token.size() + last_id.size());
  r.append("GET ").append(path).append(path.find('?') == std::string_view::npos ? "?topics=" : "&topics=");
  for (const char ch : topic) {   // a comma would split the topic in two; `:` and the unreserved stay
    const auto c = static_cast<unsigned char>(ch);
    if (std::isalnum(c) || c == '-' || c == '.' || c == '_' || c == '~' || c == ':') {
      r += ch;
    } else {
      r += '%';
      r += hex[c >> 4];
      r += hex[c & 15];
    }
  }
  if (!token.empty()) r.append("&token=").append(token);
  r.append(" HTTP/1.1\r\nHost: ").append(host);
  r.append("\r\nAccept: text/event-stream\r\nCache-Control: no-cache\r\n");
  if (!last_id.empty()) r.append("Last-Event-ID: ").append(last_id).append("\r\n");
  r.append("\r\n");
  return r;
}

upgrade_answer check_stream_response(std::string_view head) noexcept {
  upgrade_answer a;
  if (head.size() < 12 || head.substr(0, 7) != "HTTP/1." || head[8] != ' ') return a;
  std::size_t pos = 9;
  std::uint64_t code = 0;
  if (!read_u64(head, pos, code) || pos != 12 || code > 999) return a;
  a.status = static_cast<int>(code);
  if (a.status != 200) return a;
  constexpr std::string_view name = "content-type:", type = "text/event-stream";
  for (std::size_t at = head.find("\r\n"); at != std::string_view::npos; at = head.find("\r\n", at + 2)) {
    const std::string_view line = head.substr(at + 2, head.find("\r\n", at + 2) - at - 2);
    if (line.size() < name.size() || !iequals(line.substr(0, name.size()), name)) continue;
    std::string_view v = line.substr(name.size());
    while (!v.empty() && (v.front() == ' ' || v.front() == '\t')) v.remove_prefix(1);
    a.accept_ok = v.size() >= type.size() && iequals(v.substr(0, type.size()), type) &&
                  (v.size() == type.size() || v[type.size()] == ';' || v[type.size()] == ' ');
  }
  return a;
}

/// The padding: text like a mail notification's (names, a subject, a preview), so that a
/// compressed message shrinks as a real one does, not as a run of one letter. No quote or
/// backslash: it stays one JSON string as it is.
constexpr std::string_view k_pad_text =
    "from Alice Example <alice.example@mail.example.com> to the platform team, subject Re: Q3 planning notes "
    "and the migration schedule for the storage cluster; preview: Hi all, attached are the notes from Tuesday. "
    "We agreed to move the reporting jobs to the new cluster before the end of the month, with Bob taking the "
    "first batch (billing, invoices, refunds) and Carol the second (audit logs, exports). Open questions: who "
    "owns the dashboards after the move, whether the nightly export can wait until 02:00 UTC, and how long we "
    "keep the old replicas. Please reply by Friday with anything I missed. Labels: inbox, work, planning, q3; "
    "thread 41 messages, 3 unread, 2 attachments (notes-2026-09-15.pdf 182 KB, schedule.xlsx 64 KB); folder "
    "Projects/Storage; importance normal; received 2026-09-16T08:41:07Z via mx2.mail.example.com. ";

std::size_t write_payload(std::span<char> out, std::size_t size, std::uint64_t seq, std::uint64_t send_ns) noexcept {
  char* p = out.data();
  char* const end = out.data() + out.size();
  auto put = [&](std::string_view s) {
    std::memcpy(p, s.data(), s.size());
    p += s.size();
  };
  put(R"({"s":)");
  p = std::to_chars(p, end, seq).ptr;
  put(R"(,"t":)");
  p = std::to_chars(p, end, send_ns).ptr;
  const auto natural = static_cast<std::size_t>(p - out.data()) + 1;   // with the closing brace
  const std::size_t pad_room = std::min(size, out.size());
  if (pad_room >= natural + 7) {   // ,"p":"" is 7 bytes
    put(R"(,"p":")");
    for (std::size_t left = pad_room - natural - 7; left > 0;) {
      const std::size_t n = std::min(left, k_pad_text.size());
      std::memcpy(p, k_pad_text.data(), n);
      p += n;
      left -= n;
    }
    put("\"");
  }
  put("}");
  return static_cast<std::size_t>(p - out.data());
}

delivery detail::search_delivery(std::string_view msg) noexcept {
  delivery d;
  const std::size_t at = msg.find(R"({"s":)");
  if (at == std::string_view::npos || parse_delivery(msg.substr(at), d) == nullptr) return {};
  if (at > 0) {
    const std::string_view envelope = msg.substr(0, at);
    d.topic = string_field(envelope, R"("topic":")");
    d.id = string_field(envelope, R"("id":")");
  }
  d.ok = true;
  return d;
}

delivery delivery_memo::parse(std::string_view msg) noexcept {
  delivery d;
  const char* const after = detail::parse_delivery(msg, d);
  if (after == nullptr) return detail::search_delivery(msg);
  d.ok = true;
  const std::size_t len = static_cast<std::size_t>(after - msg.data()) + 1;   // the byte ending the time too
  entry& e = _entries[d.seq % size];
  if (len > e.head.size() || d.topic != _topic) return d;
  std::memcpy(e.head.data(), msg.data(), len);
  e.len = static_cast<std::uint8_t>(len);
  e.seq = d.seq;
  e.send_ns = d.send_ns;
  auto at = [&](std::string_view v) { return static_cast<std::uint8_t>(v.empty() ? 0 : v.data() - msg.data()); };
  e.topic_at = at(d.topic);
  e.topic_len = static_cast<std::uint8_t>(d.topic.size());
  e.id_at = at(d.id);
  e.id_len = static_cast<std::uint8_t>(d.id.size());
  return d;
}

std::string make_sub(std::string_view topic, std::string_view since) {
  std::string m;
  m.reserve(64 + 2 * topic.size() + since.size());
  m.append(R"({"op":"sub","topics":[")").append(topic).append("\"]");
  if (!since.empty()) m.append(R"(,"since":{")").append(topic).append(R"(":")").append(since).append("\"}");
  m.append("}");
  return m;
}

std::string make_pub(std::string_view topic, std::string_view payload) {
  std::string m;
  m.reserve(40 + topic.size() + payload.size());
  m.append(R"({"op":"pub","topic":")").append(topic).append(R"(","data":)").append(payload).append("}");
  return m;
}

std::string make_publish_body(std::string_view topic, std::string_view payload) {
  std::string m;
  m.reserve(24 + topic.size() + payload.size());
  m.append(R"({"topic":")").append(topic).append(R"(","data":)").append(payload).append("}");
  return m;
}

server_msg classify(std::string_view msg) noexcept {
  const std::size_t op = msg.find(R"("op":")");
  if (op == std::string_view::npos || op > 8) return msg.find(R"({"s":)") != std::string_view::npos ? server_msg::event : server_msg::other;
  const std::string_view rest = msg.substr(op + 6);
  if (rest.starts_with("subbed\"")) return server_msg::subbed;
  if (rest.starts_with("error\"")) return server_msg::error;
  if (rest.starts_with("lost\"")) return server_msg::lost;
  return server_msg::other;
}

bool subbed_reports_lost(std::string_view msg) noexcept {
  const std::size_t at = msg.find(R"("lost":[)");
  return at != std::string_view::npos && at + 8 < msg.size() && msg[at + 8] != ']';
}

std::string_view subbed_position(std::string_view msg) noexcept {
  // ,"at":{"TOPIC":"POSITION"}: neither a topic nor a position holds a quote.
  const std::size_t at = msg.find(R"("at":{")");
  if (at == std::string_view::npos) return {};
  const std::size_t key_end = msg.find('"', at + 7);
  if (key_end == std::string_view::npos || msg.substr(key_end, 3) != R"(":")") return {};
  const std::size_t start = key_end + 3, end = msg.find('"', start);
  return end == std::string_view::npos ? std::string_view{} : msg.substr(start, end - start);
}

// ---------------------------------------------------------------------------------------------

const std::uint8_t* frame_reader::take_header(const std::uint8_t* p, const std::uint8_t* end, spill& s) noexcept {
  const auto avail = static_cast<std::size_t>(end - p);
  proto::header_result r{};
  std::size_t used = 0;
  if (s.hdr_len == 0) {
    r = proto::parse_frame_header({p, avail});
    used = r.status == proto::parse_status::done ? r.header.size : 0;
  } else {
    const std::size_t add = std::min(s.hdr.size() - s.hdr_len, avail);
    std::memcpy(s.hdr.data() + s.hdr_len, p, add);
    r = proto::parse_frame_header(std::span<const std::uint8_t>(s.hdr.data(), s.hdr_len + add));
    used = r.status == proto::parse_status::done ? r.header.size - s.hdr_len : add;
    if (r.status == proto::parse_status::need_more) s.hdr_len = static_cast<std::uint8_t>(s.hdr_len + add);
  }
  if (r.status == proto::parse_status::error) return nullptr;
  if (r.status == proto::parse_status::need_more) {
    if (s.hdr_len == 0) {   // the first attempt parsed straight from the input: stash it
      std::memcpy(s.hdr.data(), p, avail);
      s.hdr_len = static_cast<std::uint8_t>(avail);
    }
    return end;
  }
  p += used;
  s.hdr_len = 0;
  const auto& fh = r.header;
  const bool compressed = fh.rsv == 4 && !proto::is_control(fh.raw_opcode) && fh.raw_opcode != 0;
  if (fh.masked || (fh.rsv != 0 && !compressed) || !proto::is_known_opcode(fh.raw_opcode)) return nullptr;
  _op = fh.raw_opcode;
  _fin = fh.fin;
  const bool control = proto::is_control(_op);
  if (control && (!_fin || fh.payload_len > control_bytes)) return nullptr;
  if (!control) {
    const bool continuation = _op == 0;
    if (continuation != (_msg_op != 0)) return nullptr;
    if (!continuation) {
      _msg_op = static_cast<std::uint8_t>(_op | (compressed ? compressed_bit : 0));
      s.data_len = 0;
    }
  }
  s.ctrl_len = 0;
  _remaining = fh.payload_len;
  _in_payload = true;
  return p;
}

head_inflater::head_inflater() : _z(new z_stream{}) {
  if (inflateInit2(static_cast<z_stream*>(_z), -15) != Z_OK) throw std::runtime_error("zlib: inflateInit2 failed");
}

head_inflater::~head_inflater() {
  inflateEnd(static_cast<z_stream*>(_z));
  delete static_cast<z_stream*>(_z);
}

std::span<const std::uint8_t> head_inflater::head(std::span<const std::uint8_t> payload) noexcept {
  static constexpr std::uint8_t tail[] = {0x00, 0x00, 0xff, 0xff};
  auto* z = static_cast<z_stream*>(_z);
  if (inflateReset(z) != Z_OK) return {};
  z->next_out = _out.data();
  z->avail_out = static_cast<uInt>(_out.size());
  for (std::span<const std::uint8_t> in : {payload, std::span<const std::uint8_t>(tail)}) {
    z->next_in = const_cast<Bytef*>(in.data());
    z->avail_in = static_cast<uInt>(in.size());
    const int r = inflate(z, Z_SYNC_FLUSH);
    if (r == Z_STREAM_END || z->avail_out == 0) break;
    // A message cut by the end of a read keeps only its first bytes: the stream stops short,
    // and what it gave so far is the head.
    if (r != Z_OK && r != Z_BUF_ERROR) break;
  }
  return {_out.data(), _out.size() - z->avail_out};
}

}  // namespace wspush::loadgen
