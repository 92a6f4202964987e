#pragma once
// Giving memory freed in bulk back to the system when the allocator would sit on it.
//
// Under mimalloc (the server's allocator) a block freed by a thread other than the one that
// allocated it waits on its page until the allocating thread next looks at that page, and a
// page that empties is decommitted only after a delay, at a later touch of its segment. A
// thread that went quiet after a burst never looks again: the admin thread after a flood of
// publishes, whose events the history frees on a shard once they expire, would keep the whole
// flood resident. So code that frees a lot of other threads' memory says so, and every loop
// thread, about once a second, collects its own heap when something was said since it last
// looked. Where mimalloc is not the allocator (sanitizer builds) both calls do nothing.

#include <cstddef>

namespace wspush::server {

/// `bytes` of memory, possibly allocated by other threads, were just freed. Releases under
/// 1 MiB in total are not worth a collect; they add up until they are.
void heap_released(std::size_t bytes) noexcept;

/// Called by each long-lived thread's loop about once a second: if memory was released since
/// this thread's last call, collects its heap (blocks other threads freed, emptied pages back
/// to the system). Otherwise one atomic load.
void heap_collect() noexcept;

}  // namespace wspush::server
