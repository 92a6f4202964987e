#include "pool/buffer_pool.hpp"

#include <atomic>
#include <catch2/catch.hpp>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "tests/support/counting_alloc.hpp"
#include "pool/mpsc_queue.hpp"
#include "pool/shared_frame.hpp"

using wspush::pool::buffer_pool;
using wspush::pool::frame_ref;
using wspush::pool::lease;
using wspush::test::allocation_count;

static_assert(sizeof(lease) == sizeof(void*));
static_assert(sizeof(frame_ref) == sizeof(void*));
static_assert(buffer_pool::max_block_size == 32u << 20);

namespace {
void fill_pattern(std::uint8_t* p, std::size_t n, std::uint8_t seed) {
  for (std::size_t i = 0; i < n; ++i) p[i] = std::uint8_t(seed + i * 7);
}
bool has_pattern(const std::uint8_t* p, std::size_t n, std::uint8_t seed) {
  for (std::size_t i = 0; i < n; ++i) {
    if (p[i] != std::uint8_t(seed + i * 7)) return false;
  }
  return true;
}
}  // namespace

TEST_CASE("buffer_pool: size classes are powers of two from 256 B to 32 MiB", "[buffer_pool]") {
  CHECK(buffer_pool::class_index(0) == 0);
  CHECK(buffer_pool::class_index(256) == 0);
  CHECK(buffer_pool::class_index(257) == 1);
  CHECK(buffer_pool::class_index(512) == 1);
  CHECK(buffer_pool::class_index(513) == 2);
  CHECK(buffer_pool::class_index(16u << 20) == 16);
  CHECK(buffer_pool::class_index((16u << 20) + 14) == 17);  // 16 MiB payload + frame header
  CHECK(buffer_pool::class_index(32u << 20) == 17);
  CHECK(buffer_pool::class_index((32u << 20) + 1) == buffer_pool::class_count);
  for (std::size_t i = 0; i < buffer_pool::class_count; ++i) {
    CHECK(buffer_pool::class_index(buffer_pool::class_size(i)) == i);
  }
}

TEST_CASE("buffer_pool: acquire gives an aligned, empty block of the right class", "[buffer_pool]") {
  buffer_pool pool;
  lease l = pool.acquire(1000);
  REQUIRE(l);
  CHECK(l.capacity() == 1024);
  CHECK(l.size() == 0);
  CHECK(l.bytes().empty());
  CHECK(reinterpret_cast<std::uintptr_t>(l.data()) % 32 == 0);
  CHECK(pool.stats(2).leased == 1);

  CHECK_FALSE(pool.acquire(buffer_pool::max_block_size + 1));
  lease big = pool.acquire(buffer_pool::max_block_size);
  REQUIRE(big);
  CHECK(big.capacity() == buffer_pool::max_block_size);

  lease empty;
  CHECK_FALSE(empty);
  CHECK(empty.data() == nullptr);
  CHECK(empty.capacity() == 0);
  CHECK(empty.size() == 0);
}

TEST_CASE("buffer_pool: size, bytes, move and reset", "[buffer_pool]") {
  buffer_pool pool;
  lease a = pool.acquire(300);
  fill_pattern(a.data(), 300, 1);
  a.set_size(300);
  CHECK(a.bytes().size() == 300);
  CHECK(a.bytes().data() == a.data());
  auto* data = a.data();

  lease b = std::move(a);
  CHECK_FALSE(a);  // NOLINT(bugprone-use-after-move): documented state
  CHECK(b.data() == data);
  CHECK(b.size() == 300);

  lease c = pool.acquire(300);
  c = std::move(b);  // the block c held goes back
  CHECK(pool.stats(1).leased == 1);
  CHECK(pool.stats(1).cached == 1);
  c.reset();
  CHECK_FALSE(c);
  CHECK(pool.stats(1).leased == 0);
  CHECK(pool.stats(1).cached == 2);

  lease again = pool.acquire(400);  // a cached block comes back with size 0
  CHECK(again.size() == 0);
  CHECK(pool.stats(1).heap_allocs == 2);
}

TEST_CASE("lease: release_raw/from_raw keeps the block leased in between", "[buffer_pool]") {
  buffer_pool pool;
  lease l = pool.acquire(100);
  fill_pattern(l.data(), 100, 5);
  l.set_size(100);
  void* raw = l.release_raw();
  CHECK_FALSE(l);
  CHECK(pool.stats(0).leased == 1);
  lease back = lease::from_raw(raw);
  CHECK(back.size() == 100);
  CHECK(has_pattern(back.data(), 100, 5));
  back.reset();
  CHECK(pool.stats(0).leased == 0);
  CHECK(pool.stats(0).cached == 1);
}

TEST_CASE("buffer_pool: reserve grows to a bigger class keeping the contents", "[buffer_pool]") {
  buffer_pool pool;
  lease l = pool.acquire(512);
  fill_pattern(l.data(), 300, 9);
  l.set_size(300);
  auto* small_data = l.data();

  CHECK(l.reserve(400));  // fits already: nothing moves
  CHECK(l.data() == small_data);

  REQUIRE(l.reserve(5000));
  CHECK(l.capacity() == 8192);
  CHECK(l.size() == 300);
  CHECK(has_pattern(l.data(), 300, 9));
  CHECK(pool.stats(1).cached == 1);  // the old block went back
  CHECK(pool.stats(5).leased == 1);

  CHECK_FALSE(l.reserve(buffer_pool::max_block_size + 1));
  CHECK(l.capacity() == 8192);  // unchanged on failure
  CHECK(has_pattern(l.data(), 300, 9));

  lease empty;
  CHECK_FALSE(empty.reserve(10));
}

TEST_CASE("buffer_pool: cached bytes per class are capped", "[buffer_pool]") {
  buffer_pool pool(buffer_pool::options{1024});  // four 256-byte blocks
  {
    std::vector<lease> leases;
    for (int i = 0; i < 10; ++i) leases.push_back(pool.acquire(100));
    CHECK(pool.stats(0).leased == 10);
  }
  auto s = pool.stats(0);
  CHECK(s.leased == 0);
  CHECK(s.cached == 4);
  CHECK(s.heap_allocs == 10);
  CHECK(pool.stats(3).block_size == 2048);
  { lease too_big_to_cache = pool.acquire(2048); }
  CHECK(pool.stats(3).cached == 0);
  CHECK(pool.prefill(100, 100) == 4);
}

TEST_CASE("buffer_pool: trim frees the blocks that sat idle a whole period, not the ones in use",
          "[buffer_pool]") {
  buffer_pool pool;
  {
    std::vector<lease> burst;
    for (int i = 0; i < 100; ++i) burst.push_back(pool.acquire(100));
  }
  REQUIRE(pool.stats(0).cached == 100);
  CHECK(pool.trim() == 0);  // the period that ends here saw them all taken: none idle throughout
  // A steady load takes and returns up to 10 at a time during the next period.
  for (int round = 0; round < 3; ++round) {
    std::vector<lease> in_use;
    for (int i = 0; i < 10; ++i) in_use.push_back(pool.acquire(100));
  }
  CHECK(pool.trim() == 90 * 256);  // 90 never left the free list
  CHECK(pool.stats(0).cached == 10);
  CHECK(pool.trim() == 10 * 256);  // and the last 10 were not needed in the period after
  CHECK(pool.stats(0).cached == 0);
  CHECK(pool.trim() == 0);
  lease again = pool.acquire(100);  // from the heap again
  CHECK(again);
  CHECK(pool.stats(0).heap_allocs == 101);
}

TEST_CASE("buffer_pool: no heap allocation per lease in steady state", "[buffer_pool][alloc]") {
  buffer_pool pool;
  const std::size_t sizes[] = {10, 256, 700, 4096, 65536, 1u << 20};
  for (auto sz : sizes) pool.prefill(sz, 4);
  auto cycle = [&] {
    for (int i = 0; i < 1000; ++i) {
      for (auto sz : sizes) {
        lease a = pool.acquire(sz);
        lease b = pool.acquire(sz);
        if (!a || !b) std::abort();
        a.set_size(1);
        frame_ref f = frame_ref::adopt(std::move(b));
        frame_ref g = f;
        (void)g;
      }
    }
  };
  cycle();  // warm-up
  std::uint64_t heap_before = 0;
  for (std::size_t i = 0; i < buffer_pool::class_count; ++i) heap_before += pool.stats(i).heap_allocs;
  auto before = allocation_count();
  cycle();
  auto after = allocation_count();
  std::uint64_t heap_after = 0;
  for (std::size_t i = 0; i < buffer_pool::class_count; ++i) heap_after += pool.stats(i).heap_allocs;
  CHECK(after - before == 0);
  CHECK(heap_after == heap_before);
}

TEST_CASE("frame_ref: adopt, copy, move, raw round trip, last one returns the block",
          "[frame_ref]") {
  buffer_pool pool;
  lease l = pool.acquire(64);
  std::memcpy(l.data(), "hello", 5);
  l.set_size(5);
  frame_ref f = frame_ref::adopt(std::move(l));
  CHECK_FALSE(l);  // NOLINT(bugprone-use-after-move): documented state
  REQUIRE(f);
  CHECK(f.use_count() == 1);
  CHECK(f.bytes().size() == 5);
  CHECK(std::memcmp(f.bytes().data(), "hello", 5) == 0);

  {
    frame_ref g = f;
    frame_ref h;
    h = g;
    CHECK(f.use_count() == 3);
    frame_ref moved = std::move(h);
    CHECK_FALSE(h);  // NOLINT
    CHECK(f.use_count() == 3);
    auto& self = moved;
    moved = self;
    CHECK(f.use_count() == 3);
  }
  CHECK(f.use_count() == 1);

  void* raw = frame_ref(f).release_raw();
  CHECK(f.use_count() == 2);
  frame_ref back = frame_ref::from_raw(raw);
  CHECK(back.bytes().data() == f.bytes().data());
  back.reset();
  CHECK(f.use_count() == 1);
  CHECK(pool.stats(0).leased == 1);
  f.reset();
  CHECK(pool.stats(0).leased == 0);
  CHECK(pool.stats(0).cached == 1);

  CHECK_FALSE(frame_ref::adopt(lease{}));
  CHECK(frame_ref{}.use_count() == 0);
  CHECK(frame_ref{}.bytes().empty());
}

TEST_CASE("frame_ref: a twin lives as long as its frame or its own last holder, and a reused block has none",
          "[frame_ref]") {
  buffer_pool pool;
  auto make = [&](std::size_t n, std::uint8_t seed) {
    lease l = pool.acquire(n);
    fill_pattern(l.data(), n, seed);
    l.set_size(n);
    return frame_ref::adopt(std::move(l));
  };
  frame_ref plain = make(200, 1);     // class 0 (up to 256 B)
  frame_ref packed = make(400, 2);    // class 1 (up to 512 B): counted apart from the plain one
  frame_ref other = make(400, 3);
  CHECK_FALSE(plain.has_twin());
  CHECK_FALSE(plain.twin());
  REQUIRE(plain.set_twin(frame_ref(packed)));
  CHECK(packed.use_count() == 2);     // ours and the one the plain frame holds
  CHECK_FALSE(plain.set_twin(frame_ref(other)));  // at most once
  CHECK(other.use_count() == 1);      // a refused twin is dropped by the caller's temporary
  CHECK_FALSE(packed.set_twin(frame_ref(other)));  // not once shared
  CHECK(packed.use_count() == 2);
  CHECK_FALSE(plain.set_twin(frame_ref(plain)));

  frame_ref shared = plain;  // whoever shares the frame shares the twin
  frame_ref t = shared.twin();
  REQUIRE(t);
  CHECK(t.bytes().data() == packed.bytes().data());
  CHECK(has_pattern(t.bytes().data(), 400, 2));
  CHECK(packed.use_count() == 3);
  packed.reset();
  t.reset();
  CHECK(pool.stats(1).leased == 2);   // the twin and `other`
  shared.reset();
  plain.reset();                      // the last holder of the frame lets its twin go
  CHECK(pool.stats(0).leased == 0);
  CHECK(pool.stats(1).leased == 1);

  // A twin held by a queue outlives the frame it came with.
  frame_ref f = make(200, 4);
  REQUIRE(f.set_twin(make(400, 5)));
  frame_ref kept = f.twin();
  f.reset();
  CHECK(pool.stats(1).leased == 2);
  CHECK(has_pattern(kept.bytes().data(), 400, 5));
  kept.reset();
  CHECK(pool.stats(1).leased == 1);

  // A cached block comes back without the free-list link it had in the cache: with two cached,
  // the one handed out linked to the other.
  frame_ref c1 = make(200, 6), c2 = make(200, 7);
  c1.reset();
  c2.reset();
  REQUIRE(pool.stats(0).cached >= 2);
  frame_ref again = make(200, 6);
  CHECK_FALSE(again.has_twin());
  lease l = pool.acquire(200);
  frame_ref from_lease = frame_ref::adopt(std::move(l));
  CHECK_FALSE(from_lease.has_twin());
}

TEST_CASE("frame_ref: references copied and dropped on many threads", "[frame_ref]") {
  buffer_pool pool;
  lease l = pool.acquire(100);
  l.set_size(100);
  frame_ref f = frame_ref::adopt(std::move(l));
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([f] {  // each thread starts with its own reference
      std::vector<frame_ref> held;
      for (int i = 0; i < 20'000; ++i) {
        held.push_back(f);
        if (held.size() == 16) held.clear();
      }
    });
  }
  for (auto& t : threads) t.join();
  CHECK(f.use_count() == 1);
  f.reset();
  CHECK(pool.stats(0).cached == 1);
  CHECK(pool.stats(0).leased == 0);
}

TEST_CASE("buffer_pool: acquired on one thread, released on another", "[buffer_pool]") {
  buffer_pool pool;
  wspush::pool::mpsc_queue<void*> handoff(64);
  constexpr int producers = 3, per_producer = 5'000;
  std::vector<std::thread> threads;
  for (int p = 0; p < producers; ++p) {
    threads.emplace_back([&pool, &handoff, p] {
      for (int i = 0; i < per_producer; ++i) {
        lease l = pool.acquire(std::size_t(100) << (i % 5));
        if (!l) std::abort();
        fill_pattern(l.data(), 64, std::uint8_t(p));
        l.set_size(64);
        void* raw = frame_ref::adopt(std::move(l)).release_raw();
        while (!handoff.try_push(raw)) std::this_thread::yield();
      }
    });
  }
  int received = 0, intact = 0;
  while (received < producers * per_producer) {
    void* raw = nullptr;
    if (!handoff.try_pop(raw)) {
      std::this_thread::yield();
      continue;
    }
    frame_ref f = frame_ref::from_raw(raw);
    for (int p = 0; p < producers; ++p) intact += has_pattern(f.bytes().data(), 64, std::uint8_t(p));
    ++received;
  }
  for (auto& t : threads) t.join();
  CHECK(intact == received);
  for (std::size_t i = 0; i < buffer_pool::class_count; ++i) CHECK(pool.stats(i).leased == 0);
}

TEST_CASE("buffer_pool: may die before its leases and frames", "[buffer_pool]") {
  auto pool = std::make_unique<buffer_pool>();
  lease l = pool->acquire(1000);
  lease cached = pool->acquire(1000);
  cached.reset();
  lease other = pool->acquire(100);
  other.set_size(10);
  frame_ref f = frame_ref::adopt(std::move(other));
  frame_ref g = f;
  pool.reset();  // frees its cache; the three blocks still out keep working

  fill_pattern(l.data(), 1000, 3);
  l.set_size(1000);
  CHECK(has_pattern(l.data(), 1000, 3));
  CHECK_FALSE(l.reserve(5000));  // no pool to grow from
  CHECK(l.capacity() == 1024);
  std::thread([f] { (void)f.bytes(); }).join();
  l.reset();
  f.reset();
  std::thread([g = std::move(g)]() mutable { g.reset(); }).join();  // the last block frees the state
}
