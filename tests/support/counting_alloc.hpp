#pragma once
/// \file counting_alloc.hpp
/// A test or benchmark binary that links `wspush_counting_alloc` replaces the global operator
/// new/delete (every replaceable form, aligned ones included: the buffer pool uses those) with
/// malloc-backed versions that count each allocation. A test warms up, reads a count, runs its
/// steady-state loop and asserts the count did not move: "zero heap allocations per message".

#include <cstdint>

namespace wspush::test {

/// Calls of any global operator new since the process started, on every thread.
std::uint64_t allocation_count() noexcept;
/// The same, on the calling thread only (for tests with other threads allocating meanwhile).
std::uint64_t thread_allocation_count() noexcept;

}  // namespace wspush::test
