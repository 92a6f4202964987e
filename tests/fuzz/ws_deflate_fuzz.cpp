// Fuzz target for proto::negotiate_deflate. Input: up to four Sec-WebSocket-Extensions header
// values separated by '\n'. Invariants: no crash; the outcome is one of the enum; an offer is
// taken only if the values name permessage-deflate (in any case); the same values after an empty
// header, or each behind an empty list element, give the same outcome.

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_check.hpp"
#include "proto/ws_deflate.hpp"

using namespace wspush::proto;

namespace {

bool names_deflate(const std::vector<std::string_view>& values) {
  constexpr std::string_view name = "permessage-deflate";
  for (const std::string_view v : values) {
    const auto it = std::search(v.begin(), v.end(), name.begin(), name.end(), [](char a, char b) {
      return (a >= 'A' && a <= 'Z' ? char(a + 32) : a) == b;
    });
    if (it != v.end()) return true;
  }
  return false;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  std::vector<std::string_view> values;
  std::size_t from = 0;
  while (values.size() < 3) {
    const std::size_t nl = input.find('\n', from);
    if (nl == std::string_view::npos) break;
    values.push_back(input.substr(from, nl - from));
    from = nl + 1;
  }
  values.push_back(input.substr(from));

  const deflate_offer r = negotiate_deflate(values);
  WSPUSH_FUZZ_CHECK(r <= deflate_offer::malformed);
  if (r == deflate_offer::accepted || r == deflate_offer::declined) WSPUSH_FUZZ_CHECK(names_deflate(values));

  std::vector<std::string_view> after_empty{""};
  after_empty.insert(after_empty.end(), values.begin(), values.end());
  WSPUSH_FUZZ_CHECK(negotiate_deflate(after_empty) == r);

  std::vector<std::string> padded;
  for (const std::string_view v : values) padded.push_back(" , " + std::string(v));
  const std::vector<std::string_view> padded_views(padded.begin(), padded.end());
  WSPUSH_FUZZ_CHECK(negotiate_deflate(padded_views) == r);
  return 0;
}
