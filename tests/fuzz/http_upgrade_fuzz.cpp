// Fuzz target for proto::upgrade_parser. Input: one byte choosing the split pattern and the
// limit, then the request bytes. The request is parsed whole and again fed in growing prefixes
// like a real caller appends; both must reach the same verdict, and every view must lie
// inside the input.

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

#include "fuzz_check.hpp"
#include "proto/http_upgrade.hpp"

using namespace wspush::proto;

namespace {

bool inside(std::string_view view, std::string_view buffer) {
  if (view.empty()) return true;
  return view.data() >= buffer.data() && view.data() + view.size() <= buffer.data() + buffer.size();
}

void check_result(const upgrade_result& r, const upgrade_request& req, std::string_view bytes) {
  switch (r.outcome) {
    case upgrade_outcome::websocket:
      WSPUSH_FUZZ_CHECK(r.status == 101);
      WSPUSH_FUZZ_CHECK(req.key.size() == 24);
      WSPUSH_FUZZ_CHECK(req.method == "GET");
      [[fallthrough]];
    case upgrade_outcome::plain_http: {
      WSPUSH_FUZZ_CHECK(r.consumed >= 4 && r.consumed <= bytes.size());
      WSPUSH_FUZZ_CHECK(bytes.substr(r.consumed - 4, 4) == "\r\n\r\n");
      WSPUSH_FUZZ_CHECK(bytes.substr(0, r.consumed - 4).find("\r\n\r\n") == std::string_view::npos);
      const std::string_view head = bytes.substr(0, r.consumed);
      for (std::string_view v : {req.method, req.target, req.path, req.query, req.host, req.key, req.version,
                                 req.origin, req.protocol, req.token})
        WSPUSH_FUZZ_CHECK(inside(v, head));
      WSPUSH_FUZZ_CHECK(!req.path.empty() && req.path.front() == '/');
      break;
    }
    case upgrade_outcome::error:
      WSPUSH_FUZZ_CHECK(r.status == 400 || r.status == 405 || r.status == 426 || r.status == 431 || r.status == 505);
      WSPUSH_FUZZ_CHECK(!r.reason.empty());
      break;
    case upgrade_outcome::need_more:
      WSPUSH_FUZZ_CHECK(r.consumed == 0);
      break;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  const std::uint8_t control = data[0];
  const std::string_view bytes(reinterpret_cast<const char*>(data + 1), size - 1);
  const std::uint32_t max = (control & 0x80) ? 128 : 8192;

  upgrade_parser whole(max);
  upgrade_request whole_req{};
  const upgrade_result w = whole.parse(bytes, whole_req);
  check_result(w, whole_req, bytes);

  upgrade_parser inc(max);
  upgrade_request req{};
  upgrade_result r{upgrade_outcome::need_more, 0, 0, {}};
  wspush::fuzz::splitter split(control & 0x7F);
  std::size_t have = 0;
  while (have < bytes.size()) {
    have += split.next((control & 0x40) ? 3 : 64);
    if (have > bytes.size()) have = bytes.size();
    r = inc.parse(bytes.substr(0, have), req);
    check_result(r, req, bytes.substr(0, have));
    if (r.outcome != upgrade_outcome::need_more) break;
  }
  WSPUSH_FUZZ_CHECK(r.outcome == w.outcome);
  WSPUSH_FUZZ_CHECK(r.status == w.status);
  WSPUSH_FUZZ_CHECK(r.consumed == w.consumed);
  if (r.outcome == upgrade_outcome::websocket) {
    WSPUSH_FUZZ_CHECK(req.key == whole_req.key);
    WSPUSH_FUZZ_CHECK(req.token == whole_req.token);
  }
  return 0;
}
