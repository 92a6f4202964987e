#pragma once
/// \file await.hpp
/// Bounded polling for conditions that have no event to wait on (a stats() counter
/// reaching a value). The limit is a failure bound, never a timing assertion: on a
/// loaded machine a condition may take long, and only one that never comes fails.

#include <chrono>
#include <thread>

namespace wspush::pool::test {

/// Polls `cond` until it holds or `limit` passes; returns its last value.
template <class Cond>
bool eventually(Cond&& cond, std::chrono::milliseconds limit = std::chrono::seconds(30)) {
  auto deadline = std::chrono::steady_clock::now() + limit;
  while (!cond()) {
    if (std::chrono::steady_clock::now() >= deadline) return cond();
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  return true;
}

}  // namespace wspush::pool::test
