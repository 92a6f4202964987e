#pragma once
// Plain-text logging to stderr, one line per call, written with a single write(2) so lines
// from different threads never interleave. Every line starts with "wspush: ".

#include <cstring>

namespace wspush::server {

enum class log_level : int { debug = 0, info = 1, warn = 2, error = 3 };

void set_log_level(log_level l) noexcept;
void log(log_level l, const char* fmt, ...) noexcept __attribute__((format(printf, 2, 3)));
/// Like log, but at most one line per second per call site; says how many were dropped.
#define log_ratelimited(level, ...)                                             \
  do {                                                                          \
    static thread_local ::wspush::server::log_limiter _wspush_lim;              \
    if (_wspush_lim.allow()) ::wspush::server::log(level, __VA_ARGS__);         \
  } while (0)

struct log_limiter {
  long long last_sec = -1;
  bool allow() noexcept;
};

}  // namespace wspush::server
