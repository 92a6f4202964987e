#pragma once
/// \file probe.hpp
/// Readings of the server process and the kernel from /proc (same machine): resident memory,
/// CPU time and the slab (kernel objects: sockets and their buffers live there).

#include <cstdint>

namespace wspush::loadgen {

struct proc_reading {
  bool ok = false;
  std::uint64_t vmrss = 0;          ///< bytes, /proc/PID/status VmRSS
  std::uint64_t private_dirty = 0;  ///< bytes, /proc/PID/smaps_rollup
  std::uint64_t cpu_ns = 0;         ///< utime + stime
  std::uint64_t slab = 0;           ///< bytes, /proc/meminfo Slab (system wide)
};

/// Reads the process `pid` (memory, CPU) and the system's slab. ok is false when the process
/// cannot be read (gone, or not ours to read).
proc_reading read_proc(int pid);

}  // namespace wspush::loadgen
