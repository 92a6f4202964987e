#pragma once
/// \file counting_alloc.hpp
/// The pool tests' binary replaces the global operator new/delete (counting_alloc.cpp)
/// with malloc-backed versions that count every allocation, on every thread. A test
/// warms up, reads the count, runs its steady-state loop, and asserts the count did not
/// move: "zero heap allocations per task / per lease".

#include <cstdint>

namespace wspush::pool::test {

/// Calls of any global operator new since the process started.
std::uint64_t allocation_count() noexcept;

}  // namespace wspush::pool::test
