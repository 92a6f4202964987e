// Fuzz target for server/bus/resp (the RESP2 parser the node reads Redis with). Input: one
// control byte (split pattern, which limits), then bytes as Redis would send them. They are read
// twice: whole, and in pseudo-random pieces; both readings must give the same replies and the
// same verdict. Every reply must keep the promises: element counts, nesting, bulk sizes and the
// reply's storage within the limits, pointers inside the parser's storage, and what the parser
// holds bounded at all times (whatever a header claims).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_check.hpp"
#include "server/bus/resp.hpp"

using namespace wspush::server::bus;

namespace {

void walk(const resp::reply& r, const resp::limits& l, std::size_t depth, std::string& out) {
  using enum resp::reply_type;
  switch (r.type) {
    case status:
    case error:
    case string:
      WSPUSH_FUZZ_CHECK(r.len <= l.max_bulk);
      WSPUSH_FUZZ_CHECK(r.len == 0 || r.str != nullptr);
      out += char('0' + int(r.type));
      out.append(r.str, r.len);
      out += '|';
      break;
    case integer: out += ":" + std::to_string(r.integer) + "|"; break;
    case nil: out += "nil|"; break;
    case array:
      WSPUSH_FUZZ_CHECK(depth < l.max_depth);
      WSPUSH_FUZZ_CHECK(r.elements <= l.max_elements);
      out += "[" + std::to_string(r.elements);
      for (std::size_t k = 0; k < r.elements; ++k) walk(*r.element[k], l, depth + 1, out);
      out += "]";
      break;
  }
}

struct reading {
  std::string replies;
  bool error = false;
};

reading read(std::string_view in, const resp::limits& l, wspush::fuzz::splitter* split) {
  resp::parser p(l);
  reading out;
  // Storage: what max_total allows (strings, elements), grown at most twice over, plus the
  // everyday storage kept between replies.
  const std::size_t most = 2 * l.max_total + (64 << 10) + 1024 * (sizeof(resp::reply) + 4) * 2;
  while (!in.empty()) {
    const std::size_t n = split ? std::min(in.size(), split->next(64)) : in.size();
    std::string_view piece = in.substr(0, n);
    in.remove_prefix(n);
    while (!piece.empty()) {
      const resp::result r = p.parse(piece);
      WSPUSH_FUZZ_CHECK(p.held_bytes() <= most);
      if (r.st == resp::status::error) {
        WSPUSH_FUZZ_CHECK(!p.error().empty());
        out.error = true;
        return out;
      }
      WSPUSH_FUZZ_CHECK(r.consumed <= piece.size());
      if (r.st == resp::status::need_more) {
        WSPUSH_FUZZ_CHECK(r.consumed == piece.size());
        break;
      }
      WSPUSH_FUZZ_CHECK(r.consumed > 0);
      walk(p.root(), l, 0, out.replies);
      out.replies += '\n';
      piece.remove_prefix(r.consumed);
    }
  }
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1 || size > (1 << 16)) return 0;
  const std::uint8_t control = data[0];
  const std::string_view in(reinterpret_cast<const char*>(data) + 1, size - 1);
  // Small limits reach every bound; the node's own (large) ones check what a header may claim.
  const resp::limits l = (control & 1) ? resp::limits{.max_bulk = 64, .max_elements = 16, .max_depth = 4, .max_total = 2048}
                                       : resp::limits{.max_bulk = (1 << 20) + 256, .max_elements = 216, .max_depth = 4,
                                                      .max_total = (4 << 20) + (64 << 10)};
  const reading whole = read(in, l, nullptr);
  wspush::fuzz::splitter split(control);
  const reading pieces = read(in, l, &split);
  WSPUSH_FUZZ_CHECK(whole.error == pieces.error);
  WSPUSH_FUZZ_CHECK(whole.replies == pieces.replies);
  return 0;
}
