#include "server/base/log.hpp"

#include <atomic>
#include <cstdarg>
#include <cstdio>
#include <ctime>

#include <unistd.h>

namespace wspush::server {
namespace {
std::atomic<int> g_level{int(log_level::info)};
}

void set_log_level(log_level l) noexcept { g_level.store(int(l), std::memory_order_relaxed); }

void log(log_level l, const char* fmt, ...) noexcept {
  if (int(l) < g_level.load(std::memory_order_relaxed)) return;
  static const char* names[] = {"debug: ", "", "warning: ", "error: "};
  char line[1024];
  int n = std::snprintf(line, sizeof line, "wspush: %s", names[int(l)]);
  va_list ap;
  va_start(ap, fmt);
  int m = std::vsnprintf(line + n, sizeof line - n - 1, fmt, ap);
  va_end(ap);
  std::size_t len = std::size_t(n) + (m < 0 ? 0 : std::min<std::size_t>(m, sizeof line - n - 2));
  line[len++] = '\n';
  [[maybe_unused]] auto r = ::write(2, line, len);
}

bool log_limiter::allow() noexcept {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  if (ts.tv_sec == last_sec) return false;
  last_sec = ts.tv_sec;
  return true;
}

}  // namespace wspush::server
