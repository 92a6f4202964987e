#pragma once
// Allocations per operation for a benchmark: the binary links wspush_counting_alloc (the
// counting global operator new of tests/support), and a probe counts around the measured calls
// only, leaving out the benchmark framework's own bookkeeping.

#include <cstdint>

#include "tests/support/counting_alloc.hpp"

namespace wspush::bench {

/// Wrap each measured call in `begin()`/`end()`; `per(ops)` is allocations per operation.
struct alloc_probe {
  std::uint64_t counted = 0, mark = 0;
  void begin() noexcept { mark = wspush::test::allocation_count(); }
  void end() noexcept { counted += wspush::test::allocation_count() - mark; }
  double per(std::uint64_t ops) const noexcept { return ops ? double(counted) / double(ops) : 0.0; }
};

}  // namespace wspush::bench
