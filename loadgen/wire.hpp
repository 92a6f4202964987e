#pragma once
/// \file wire.hpp
/// The load generator's wire pieces that never touch a socket: upgrade request and response
/// check, the latency payload, the pub/sub messages it sends and reads (and a memo that reads
/// each message once per worker), a streaming reader for server frames that keeps nothing for a
/// connection between reads unless a frame was cut, and per-topic sequence accounting.

#include "proto/ws_frame.hpp"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace wspush::loadgen {

/// xorshift64*: mask keys and Sec-WebSocket-Key values need no cryptographic quality.
struct xorshift {
  std::uint64_t state;
  std::uint64_t next() noexcept {
    state ^= state >> 12;
    state ^= state << 25;
    state ^= state >> 27;
    return state * 0x2545F4914F6CDD1DULL;
  }
  std::array<std::uint8_t, 4> mask() noexcept {
    const auto v = static_cast<std::uint32_t>(next() >> 32);
    return {static_cast<std::uint8_t>(v), static_cast<std::uint8_t>(v >> 8), static_cast<std::uint8_t>(v >> 16),
            static_cast<std::uint8_t>(v >> 24)};
  }
};

// ---------------------------------------------------------------------------------------------
// Upgrade

/// A fresh random Sec-WebSocket-Key (24 characters).
std::string make_key(xorshift& rng);
/// Sec-WebSocket-Accept for a key (RFC 6455 4.2.2).
std::string expected_accept(std::string_view key);
/// `GET path[?token=T] HTTP/1.1` with the upgrade headers.
/// With `deflate`, the request offers permessage-deflate as browsers do.
std::string make_upgrade_request(std::string_view path, std::string_view host, std::string_view key,
                                 std::string_view token, bool deflate = false);

/// What a complete response head (through the blank line) says.
struct upgrade_answer {
  int status = 0;        ///< HTTP status code; 0 when the status line is not HTTP/1.x
  bool accept_ok = false;  ///< 101 with the right Sec-WebSocket-Accept
  bool deflate = false;    ///< it accepted permessage-deflate
};
upgrade_answer check_upgrade_response(std::string_view head, std::string_view accept) noexcept;

/// An event stream's request (`--transport sse`): `GET path?topics=TOPIC[&token=T] HTTP/1.1`
/// (the topic percent-encoded) with `Accept: text/event-stream`, and `Last-Event-ID: ID` when
/// `last_id` is not empty, as EventSource resumes.
std::string make_stream_request(std::string_view path, std::string_view host, std::string_view topic,
                                std::string_view token, std::string_view last_id);
/// Its answer's head: `accept_ok` when it is a 200 with Content-Type text/event-stream.
upgrade_answer check_stream_response(std::string_view head) noexcept;

// ---------------------------------------------------------------------------------------------
// Payload: `{"s":SEQ,"t":SEND_NS}` (CLOCK_MONOTONIC, same machine), padded to `size` bytes with
// a `"p"` string. Valid JSON, so a pub/sub server forwards it as `data`, and valid UTF-8 text,
// so a broadcast server relays it as is.

inline constexpr std::size_t min_payload = 48;   ///< room for the largest s and t, and padding

/// Writes the payload into `out` (out.size() >= min_payload) and returns its length, which is
/// max(size, natural length).
std::size_t write_payload(std::span<char> out, std::size_t size, std::uint64_t seq, std::uint64_t send_ns) noexcept;

/// One delivery as the reader sees it. `topic`/`id` are views into the message (empty for a
/// plain broadcast message), valid while the message bytes are.
struct delivery {
  bool ok = false;
  bool memo_topic = false;   ///< from delivery_memo: `topic` is the one the memo serves
  std::uint64_t seq = 0;
  std::uint64_t send_ns = 0;
  std::string_view topic;
  std::string_view id;
};

namespace detail {

/// `lit` at p: the byte after it, or nullptr.
inline const char* take(const char* p, const char* end, std::string_view lit) noexcept {
  if (static_cast<std::size_t>(end - p) < lit.size() || std::memcmp(p, lit.data(), lit.size()) != 0) return nullptr;
  return p + lit.size();
}

/// Decimal digits at p (at most 19, so no overflow) ended by a non-digit (a number cut by the
/// end of a kept prefix is not read): the byte after them, or nullptr.
inline const char* take_u64(const char* p, const char* end, std::uint64_t& out) noexcept {
  const char* const first = p;
  const char* const stop = end - p > 19 ? p + 19 : end;
  std::uint64_t v = 0;
  while (p != stop && static_cast<unsigned char>(*p - '0') < 10) v = v * 10 + static_cast<unsigned char>(*p++ - '0');
  if (p == first || p == end || static_cast<unsigned char>(*p - '0') < 10) return nullptr;
  out = v;
  return p;
}

/// A JSON string's bytes up to its closing quote (topics and ids need no escapes): the byte
/// after the quote, or nullptr.
inline const char* take_string(const char* p, const char* end, std::string_view& out) noexcept {
  const char* const first = p;
  while (p != end && *p != '"' && *p != '\\') ++p;
  if (p == end || *p != '"') return nullptr;
  out = std::string_view(first, static_cast<std::size_t>(p - first));
  return p + 1;
}

/// Our payload at the start of a plain message, or in an event at the places
/// proto::encode_event puts the fields: the byte after the send time, or nullptr.
inline const char* parse_delivery(std::string_view msg, delivery& d) noexcept {
  const char* p = msg.data();
  const char* const end = p + msg.size();
  if (!msg.starts_with(R"({"s":)")) {   // not a plain payload (broadcast): an event?
    if ((p = take(p, end, R"({"topic":")")) == nullptr || (p = take_string(p, end, d.topic)) == nullptr ||
        (p = take(p, end, R"(,"id":")")) == nullptr || (p = take_string(p, end, d.id)) == nullptr ||
        (p = take(p, end, R"(,"data":)")) == nullptr) {
      return nullptr;
    }
  }
  if ((p = take(p, end, R"({"s":)")) == nullptr || (p = take_u64(p, end, d.seq)) == nullptr) return nullptr;
  if ((p = take(p, end, R"(,"t":)")) == nullptr) return nullptr;
  return take_u64(p, end, d.send_ns);
}

/// Any other shape: searches for the payload, and for the envelope's fields before it.
delivery search_delivery(std::string_view msg) noexcept;

inline std::uint64_t load8(const char* p) noexcept {
  std::uint64_t w;
  std::memcpy(&w, p, 8);
  return w;
}

}  // namespace detail

/// Whether the n bytes at a and b are the same: inline, for the short spans the receive path
/// compares per message (a call to the library's memcmp costs more than the compare).
inline bool same_bytes(const char* a, const char* b, std::size_t n) noexcept {
  if (n >= 16) {
#if defined(__SSE2__)
    auto same16 = [](const char* x, const char* y) {
      const __m128i vx = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x));
      const __m128i vy = _mm_loadu_si128(reinterpret_cast<const __m128i*>(y));
      return _mm_movemask_epi8(_mm_cmpeq_epi8(vx, vy)) == 0xffff;
    };
#else
    auto same16 = [](const char* x, const char* y) {
      return ((detail::load8(x) ^ detail::load8(y)) | (detail::load8(x + 8) ^ detail::load8(y + 8))) == 0;
    };
#endif
    for (std::size_t i = 0; i + 16 < n; i += 16) {
      if (!same16(a + i, b + i)) return false;
    }
    return same16(a + n - 16, b + n - 16);   // the last 16, maybe overlapping
  }
  if (n >= 8) return ((detail::load8(a) ^ detail::load8(b)) | (detail::load8(a + n - 8) ^ detail::load8(b + n - 8))) == 0;
  for (std::size_t i = 0; i < n; ++i) {
    if (a[i] != b[i]) return false;
  }
  return true;
}

/// Finds our payload in a plain message or in a pub/sub event
/// `{"topic":"T","id":"ID","data":{"s":..,"t":..,...}}`: both shapes are read front to back at
/// the places their writers put the fields (write_payload, proto::encode_event), with no
/// search, no JSON parser and no allocation; anything else is searched for our payload.
inline delivery read_delivery(std::string_view msg) noexcept {
  delivery d;
  if (detail::parse_delivery(msg, d) == nullptr) return detail::search_delivery(msg);
  d.ok = true;
  return d;
}

/// What the first bytes of recent messages said, remembered with those bytes: the receive
/// path's parse. A message reaches every subscriber byte for byte the same, so once one
/// connection has read message k, the others compare its head (through the byte after the send
/// time) with what that one saw, looked up by the number they expect next, instead of reading
/// it field by field. A hit needs the same bytes, so it says what read_delivery would.
///
/// Only messages of `topic` (the one every connection reading through the memo subscribed to;
/// empty for plain payloads, or when the connections' topics differ) are remembered, so a hit
/// also says the topic is that one (`memo_topic`): the caller need not compare it again.
///
/// It remembers 4,096 message numbers: in a long burst a worker's readers drift apart by more
/// than a thousand messages (what their sockets buffer), and with 256 the readers behind and
/// the readers ahead evicted each other's entries, so most deliveries were parsed again (a
/// 1,000-message burst read 25 M/s against 33 M/s). The table is 512 KB of zero pages from
/// calloc, touched only where a message number lands (a 200-message burst uses 25 KB of it).
class delivery_memo {
public:
  explicit delivery_memo(std::string topic = {})
      : _storage(static_cast<std::byte*>(std::calloc(size * sizeof(entry) + alignof(entry), 1))),
        _entries(aligned(_storage.get())), _topic(std::move(topic)) {}

  // Inline into the frame loop: it runs once per delivery.
  [[gnu::always_inline]] delivery read(std::string_view msg, std::uint64_t expect) noexcept {
    const entry& e = _entries[expect % size];
    if (e.len != 0 && msg.size() >= e.len && same_bytes(msg.data(), e.head.data(), e.len)) {
      return delivery{true, true, e.seq, e.send_ns, std::string_view(msg.data() + e.topic_at, e.topic_len),
                      std::string_view(msg.data() + e.id_at, e.id_len)};
    }
    return parse(msg);
  }

private:
  static constexpr std::size_t size = 4096;   ///< message numbers remembered at once
  struct alignas(64) entry {   // two cache lines; all zero bytes: empty
    std::uint64_t seq;
    std::uint64_t send_ns;
    std::uint8_t len;   ///< 0: empty
    std::uint8_t topic_at, topic_len, id_at, id_len;
    std::array<char, 107> head;   ///< longer heads are not remembered
  };
  static_assert(sizeof(entry) == 128 && std::is_trivial_v<entry>);
  struct free_storage {
    void operator()(std::byte* p) const noexcept { std::free(p); }
  };
  static entry* aligned(std::byte* p) {
    if (p == nullptr) throw std::bad_alloc();
    const auto at = reinterpret_cast<std::uintptr_t>(p);
    return reinterpret_cast<entry*>((at + alignof(entry) - 1) & ~std::uintptr_t{alignof(entry) - 1});
  }

  /// A miss: reads the message, and remembers what it said.
  delivery parse(std::string_view msg) noexcept;

  std::unique_ptr<std::byte, free_storage> _storage;
  entry* _entries;   ///< `size` of them, in _storage
  std::string _topic;
};

/// `{"op":"sub","topics":["T"]}`, with `,"since":{"T":"ID"}` when `since` is not empty.
std::string make_sub(std::string_view topic, std::string_view since);
/// `{"op":"pub","topic":"T","data":PAYLOAD}`
std::string make_pub(std::string_view topic, std::string_view payload);
/// `{"topic":"T","data":PAYLOAD}` — the admin API's POST /publish body.
std::string make_publish_body(std::string_view topic, std::string_view payload);

/// Server message kinds the load generator tells apart.
enum class server_msg : std::uint8_t { event, subbed, error, lost, other };
server_msg classify(std::string_view msg) noexcept;
/// In a `subbed` reply: whether its `lost` list names anything.
bool subbed_reports_lost(std::string_view msg) noexcept;
/// In a `subbed` reply to a sub of one topic: the position its `at` gives it (empty: none).
std::string_view subbed_position(std::string_view msg) noexcept;

// ---------------------------------------------------------------------------------------------
// Streaming reader for server frames (unmasked): several frames per read, a frame split over
// any number of reads. A frame that lies whole in the read is handed over where it lies, with no
// copy; only a frame cut by the end of a read leases a spill from the worker's pool (its header
// bytes, the first bytes of the message, a control payload) until it is complete. An idle
// connection holds 16 bytes of reader state and no buffer.

template <class Handler>
concept frame_handler = requires(Handler h, std::span<const std::uint8_t> s, std::uint8_t op) {
  h.on_message(s, op);  // a complete data message: all of it, or its first keep_bytes when it was cut
  h.on_ping(s);
  h.on_close(s);
};

/// What a connection keeps of a frame cut by the end of a read.
struct spill {
  static constexpr std::size_t keep_bytes = 192;      ///< prefix of a cut data message kept
  static constexpr std::size_t control_bytes = 125;   ///< control payload limit (RFC 6455)
  std::array<std::uint8_t, keep_bytes> data;
  std::array<std::uint8_t, control_bytes> ctrl;
  std::array<std::uint8_t, proto::max_frame_header_size> hdr;
  std::uint8_t data_len;
  std::uint8_t ctrl_len;
  std::uint8_t hdr_len;
  void clear() noexcept { data_len = ctrl_len = hdr_len = 0; }
};

/// A worker's spills: a slab with a free list. It grows to the most cuts pending at once (at most
/// one per connection) and allocates nothing after that. `Slot::clear()` readies a leased one.
template <class Slot>
class slab_pool {
public:
  static constexpr std::uint32_t none = ~std::uint32_t{0};

  std::uint32_t lease() noexcept {
    std::uint32_t i;
    if (_free.empty()) {
      i = static_cast<std::uint32_t>(_slots.size());
      _slots.emplace_back();
      _free.reserve(_slots.size());   // so release() never allocates
    } else {
      i = _free.back();
      _free.pop_back();
    }
    _slots[i].clear();
    return i;
  }
  void release(std::uint32_t i) noexcept { _free.push_back(i); }
  /// Valid until the next lease() (the slab may move).
  Slot& operator[](std::uint32_t i) noexcept { return _slots[i]; }
  [[nodiscard]] std::size_t leased() const noexcept { return _slots.size() - _free.size(); }

private:
  std::vector<Slot> _slots;
  std::vector<std::uint32_t> _free;
};

using spill_pool = slab_pool<spill>;

/// The head of a permessage-deflate message, inflated (zlib's stream, reset for each message:
/// the server takes no context over). The load generator reads only a message's first bytes,
/// so it inflates no more than those: less work than a browser does, none of it the server's.
class head_inflater {
public:
  static constexpr std::size_t head_bytes = 256;
  head_inflater();
  ~head_inflater();
  head_inflater(const head_inflater&) = delete;
  head_inflater& operator=(const head_inflater&) = delete;
  /// The first bytes (at most head_bytes) `payload` inflates to, as far as it inflates (a message
  /// cut short keeps only its first compressed bytes); empty when nothing does.
  std::span<const std::uint8_t> head(std::span<const std::uint8_t> payload) noexcept;

private:
  void* _z;  // z_stream
  std::array<std::uint8_t, head_bytes> _out{};
};

/// The frame reader hands a message on with its opcode; a permessage-deflate message (RSV1 on
/// its first frame) with this bit set in it too.
inline constexpr std::uint8_t compressed_bit = 0x40;

class frame_reader {
public:
  static constexpr std::size_t keep_bytes = spill::keep_bytes;
  static constexpr std::size_t control_bytes = spill::control_bytes;

  /// Feeds bytes; returns false on a protocol violation (the caller drops the connection).
  template <frame_handler Handler>
  bool consume(std::span<const std::uint8_t> in, Handler& h, spill_pool& pool) noexcept {
    const std::uint8_t* p = in.data();
    const std::uint8_t* const end = p + in.size();
    while (p != end) {
      if (_spill == spill_pool::none && !_in_payload) {
        p = whole_frames(p, end, h);
        if (p == end) break;
      }
      p = cut_frame(p, end, h, pool);   // what whole_frames left: a cut frame, a rare one, an error
      if (p == nullptr) return false;
    }
    return true;
  }

  /// Forget everything (a reconnect starts a new stream); gives back a leased spill.
  void reset(spill_pool& pool) noexcept {
    if (_spill != spill_pool::none) pool.release(_spill);
    *this = frame_reader{};
  }

private:
  /// Hands over the whole, final, unfragmented frames at p where they lie; returns where the
  /// first other one starts (cut by the end, fragmented, 64-bit length, or malformed).
  template <frame_handler Handler>
  const std::uint8_t* whole_frames(const std::uint8_t* p, const std::uint8_t* end, Handler& h) noexcept {
    while (end - p >= 2) {
      const std::uint8_t b0 = p[0];
      const std::uint8_t b1 = p[1];
      // Only fin frames without RSV bits, or a text or binary one with RSV1 (compressed);
      // unmasked, and not a 64-bit length.
      const bool plain = (b0 & 0xf0) == 0x80;
      const bool deflated = (b0 & 0xf0) == 0xc0 && ((b0 & 0x0f) == 1 || (b0 & 0x0f) == 2);
      if ((!plain && !deflated) || b1 >= 127) break;
      std::size_t head = 2;
      std::size_t len = b1;
      if (b1 == 126) {
        if (end - p < 4) break;
        len = std::size_t{p[2]} << 8 | p[3];
        head = 4;
      }
      if (static_cast<std::size_t>(end - p) - head < len) break;
      const std::span<const std::uint8_t> payload(p + head, len);
      const std::uint8_t op = b0 & 0x0f;
      if (op == 1 || op == 2) h.on_message(payload, static_cast<std::uint8_t>(op | (b0 & compressed_bit)));
      else if (op == 9 && len <= control_bytes) h.on_ping(payload);
      else if (op == 8 && len <= control_bytes) h.on_close(payload);
      else if (op != 10 || len > control_bytes) break;   // continuation, reserved, long control
      p += head + len;
    }
    return p;
  }

  const std::uint8_t* take_header(const std::uint8_t* p, const std::uint8_t* end, spill& s) noexcept;
  template <frame_handler Handler>
  const std::uint8_t* cut_frame(const std::uint8_t* p, const std::uint8_t* end, Handler& h, spill_pool& pool) noexcept;
  template <frame_handler Handler>
  bool finish_frame(Handler& h, spill& s) noexcept;

  std::uint64_t _remaining = 0;            ///< payload bytes of the frame in progress still to come
  std::uint32_t _spill = spill_pool::none;  ///< leased while a frame or message is cut
  std::uint8_t _op = 0;       ///< opcode of the frame in progress
  std::uint8_t _msg_op = 0;   ///< opcode of the data message in progress (0: none)
  bool _fin = false;
  bool _in_payload = false;
};

static_assert(sizeof(frame_reader) == 16, "an idle connection's reader stays small");

/// The slow path, one step: gathers a header into the spill, or keeps payload bytes there;
/// returns where it stopped, nullptr on a protocol violation.
template <frame_handler Handler>
const std::uint8_t* frame_reader::cut_frame(const std::uint8_t* p, const std::uint8_t* end, Handler& h,
                                            spill_pool& pool) noexcept {
  if (_spill == spill_pool::none) _spill = pool.lease();
  spill& s = pool[_spill];
  if (!_in_payload) {
    p = take_header(p, end, s);
    if (p == nullptr || !_in_payload) return p;
  } else {
    const auto n = static_cast<std::size_t>(std::min<std::uint64_t>(_remaining, static_cast<std::size_t>(end - p)));
    const bool control = proto::is_control(_op);
    std::uint8_t& len = control ? s.ctrl_len : s.data_len;
    const std::size_t room = (control ? control_bytes : keep_bytes) - len;
    std::memcpy((control ? s.ctrl.data() : s.data.data()) + len, p, std::min(room, n));
    len = static_cast<std::uint8_t>(len + std::min(room, n));
    p += n;
    _remaining -= n;
  }
  if (_remaining == 0 && !finish_frame(h, s)) return nullptr;
  if (!_in_payload && _msg_op == 0 && s.hdr_len == 0) {   // nothing cut any more: back to the fast path
    pool.release(_spill);
    _spill = spill_pool::none;
  }
  return p;
}

template <frame_handler Handler>
bool frame_reader::finish_frame(Handler& h, spill& s) noexcept {
  _in_payload = false;
  if (proto::is_control(_op)) {
    const std::span<const std::uint8_t> payload(s.ctrl.data(), s.ctrl_len);
    if (_op == static_cast<std::uint8_t>(proto::opcode::ping)) h.on_ping(payload);
    else if (_op == static_cast<std::uint8_t>(proto::opcode::close)) h.on_close(payload);
    else if (_op != static_cast<std::uint8_t>(proto::opcode::pong)) return false;
    return true;
  }
  if (_fin) {
    h.on_message(std::span<const std::uint8_t>(s.data.data(), s.data_len), _msg_op);
    _msg_op = 0;
  }
  return true;
}

// ---------------------------------------------------------------------------------------------
// Sequence accounting per receiving connection: the next expected number plus a 64-wide window
// of what arrived below it, so duplicates and late (reordered) arrivals are told apart exactly
// within the window, in 16 bytes per connection whatever the message count.

struct seq_counters {
  std::uint64_t unique = 0;      ///< distinct sequence numbers received
  std::uint64_t duplicates = 0;  ///< a number received again (within the window)
  std::uint64_t gaps = 0;        ///< times a number arrived ahead of the next expected one
  std::uint64_t reordered = 0;   ///< a number that filled an earlier gap
  std::uint64_t stale = 0;       ///< below the window: a duplicate or very late, cannot tell
};

class seq_tracker {
public:
  /// Accounts for one received number; returns true when it was new.
  bool on_seq(std::uint32_t s, seq_counters& c) noexcept {
    if (s >= _next) {
      if (s > _next) ++c.gaps;
      const std::uint64_t shift = std::uint64_t{s} - _next + 1;
      _window = shift >= 64 ? 0 : _window << shift;
      _window |= 1;
      _next = s + 1;
      ++c.unique;
      return true;
    }
    const std::uint32_t d = _next - 1 - s;
    if (d >= 64) {
      ++c.stale;
      return false;
    }
    const std::uint64_t bit = std::uint64_t{1} << d;
    if (_window & bit) {
      ++c.duplicates;
      return false;
    }
    _window |= bit;
    ++c.unique;
    ++c.reordered;
    return true;
  }
  [[nodiscard]] std::uint32_t next() const noexcept { return _next; }

private:
  std::uint64_t _window = 0;   ///< bit i: number _next-1-i was received
  std::uint32_t _next = 0;
};

static_assert(sizeof(seq_tracker) == 16, "per-connection accounting stays small");

}  // namespace wspush::loadgen
