/// \file probe.cpp
#include "loadgen/probe.hpp"

#include <unistd.h>

#include <fstream>
#include <sstream>
#include <string>

namespace wspush::loadgen {
namespace {

/// The kB value of the line starting with `key` in a /proc file, in bytes (0: not found).
std::uint64_t kb_field(const std::string& path, const std::string& key) {
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (line.compare(0, key.size(), key) != 0) continue;
    std::istringstream fields(line.substr(key.size()));
    std::uint64_t kb = 0;
    fields >> kb;
    return kb * 1024;
  }
  return 0;
}

bool cpu_ns_of(int pid, std::uint64_t& out) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string text;
  if (!std::getline(in, text)) return false;
  const auto paren = text.rfind(')');   // the command name may contain spaces
  if (paren == std::string::npos || paren + 2 > text.size()) return false;
  std::istringstream fields(text.substr(paren + 2));
  std::string skip;
  for (int f = 3; f < 14; ++f) fields >> skip;
  unsigned long long utime = 0, stime = 0;
  if (!(fields >> utime >> stime)) return false;
  out = (utime + stime) * (1'000'000'000ull / static_cast<unsigned long long>(sysconf(_SC_CLK_TCK)));
  return true;
}

}  // namespace

proc_reading read_proc(int pid) {
  proc_reading r;
  r.slab = kb_field("/proc/meminfo", "Slab:");
  if (pid <= 0) return r;
  const std::string base = "/proc/" + std::to_string(pid);
  r.vmrss = kb_field(base + "/status", "VmRSS:");
  r.private_dirty = kb_field(base + "/smaps_rollup", "Private_Dirty:");
  r.ok = cpu_ns_of(pid, r.cpu_ns) && r.vmrss != 0;
  return r;
}

}  // namespace wspush::loadgen
