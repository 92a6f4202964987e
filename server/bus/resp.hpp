#pragma once
// RESP2, what Redis answers in, parsed incrementally and within bounds: bytes in, one reply tree
// out, no syscalls (fuzzed: tests/fuzz/resp_fuzz.cpp).
//
// The node owns its links to Redis (redis_link) and reads their replies with this parser, not
// with hiredis: hiredis's reader takes an array or bulk header at its word (`*2147483647`
// reserves 16 GiB of element pointers, `$1073741824` buffers a gigabyte) and its asynchronous
// layer asserts on replies it did not expect. Here every count is checked against a bound
// before anything is reserved, and what is not RESP is an error the link drops, never a crash.
//
// The tree has the shape of hiredis's redisReply as far as the bus reads it: `type`, `str` and
// `len`, `integer`, `elements` and `element[k]` (a pointer to the k-th element).

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

namespace wspush::server::bus::resp {

/// hiredis's REDIS_REPLY_* (nil: `$-1` and `*-1`).
enum class reply_type : std::uint8_t { string, array, integer, nil, status, error };

struct reply;

/// An array's elements, contiguous: element[k] points to the k-th (k < elements).
struct element_list {
  const reply* first = nullptr;
  const reply* operator[](std::size_t k) const noexcept;
};

/// One parsed reply or element. Valid until the parser's next parse() or reset().
struct reply {
  reply_type type = reply_type::nil;
  const char* str = nullptr;  ///< string, status, error: `len` bytes (not NUL-terminated)
  std::size_t len = 0;
  long long integer = 0;      ///< integer
  std::size_t elements = 0;   ///< array
  element_list element;
};

inline const reply* element_list::operator[](std::size_t k) const noexcept { return first + k; }

/// What one reply may hold. A reply past any of them is a parse error.
struct limits {
  std::size_t max_bulk = 1 << 20;      ///< bytes of one bulk string, or of one status or error line
  std::size_t max_elements = 1024;     ///< elements of one array
  std::size_t max_depth = 4;           ///< arrays within arrays (a flat array is depth 1)
  std::size_t max_total = 4u << 20;    ///< what one reply holds: its strings' bytes plus sizeof(reply)
                                       ///< per element, so many tiny elements cannot amplify it
};

enum class status : std::uint8_t { done, need_more, error };

struct result {
  status st;
  std::size_t consumed;  ///< done: bytes up to the reply's end; need_more: all of the input
};

class parser {
 public:
  explicit parser(limits l) noexcept : _lim(l) {}

  /// Feeds bytes. done: root() holds a whole reply and `consumed` says where the next one
  /// starts; need_more: everything was taken, the reply goes on in the next call; error:
  /// error() says why, and the stream cannot go on (reset() before parsing another).
  result parse(std::string_view in) noexcept;
  /// The reply parse() just completed (after done only).
  const reply& root() const noexcept { return _nodes.front(); }
  /// Why parse() said error (a static string).
  std::string_view error() const noexcept { return _error; }
  /// Forgets any partial reply and gives back storage grown past the everyday size.
  void reset() noexcept;
  /// What the parser holds now (the last reply's storage, kept for the next).
  std::size_t held_bytes() const noexcept { return _bytes.capacity() + _nodes.capacity() * (sizeof(reply) + 4); }

 private:
  enum class state : std::uint8_t { type, header, line, bulk, bulk_end };
  struct frame {
    std::uint32_t first, count, next;  // the array's elements: [first, first + count), filling `next`
  };

  void begin_reply() noexcept;
  bool begin_element(char c) noexcept;
  bool end_header() noexcept;
  bool start_array(long long n) noexcept;
  bool start_bulk(long long n) noexcept;
  bool take_line(std::string_view& in) noexcept;
  bool take_bulk(std::string_view& in) noexcept;
  bool complete() noexcept;  // the current element is whole; true when the reply is
  bool fail(const char* why) noexcept;
  bool reserve_bytes(std::size_t n) noexcept;
  void finish() noexcept;

  limits _lim;
  state _state = state::type;
  bool _cr = false;          // a line's '\r' was seen, its '\n' is next
  bool _in_reply = false;
  std::uint32_t _cur = 0;    // the element being read
  std::size_t _left = 0;     // bulk bytes still to come
  std::size_t _total = 0;    // what this reply holds (see limits::max_total)
  char _head[24];            // a header line's digits (`:`, `$`, `*`)
  std::uint8_t _head_len = 0;
  std::vector<reply> _nodes;           // [0] the root; an array's elements contiguous
  std::vector<std::uint32_t> _at;      // per node: its bytes' offset, or its first element
  std::vector<char> _bytes;            // every string of the reply
  std::vector<frame> _stack;           // arrays being filled, at most max_depth
  const char* _error = "";
};

}  // namespace wspush::server::bus::resp
