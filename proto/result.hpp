#pragma once
/// \file result.hpp
/// The status every resumable parser in proto returns alongside how many bytes it consumed.

#include <cstdint>

namespace wspush::proto {

/// Outcome of one parse step (picohttpparser's -2/-1, nginx's NGX_AGAIN):
/// `done` - a complete unit was parsed; `need_more` - call again with more bytes appended;
/// `error` - the input can never become valid.
enum class parse_status : std::uint8_t { done, need_more, error };

}  // namespace wspush::proto
