// The out queue on its own: order, partial writes, the block's lifetime, the one waiting pong,
// and the slow-consumer verdicts.

#include <catch2/catch.hpp>

#include <cstring>
#include <string>
#include <vector>

#include "pool/buffer_pool.hpp"
#include "server/conn/out_queue.hpp"

using namespace wspush;
using namespace wspush::server;

namespace {

pool::frame_ref make_frame(pool::buffer_pool& b, const std::string& bytes) {
  pool::lease l = b.acquire(bytes.size());
  std::memcpy(l.data(), bytes.data(), bytes.size());
  l.set_size(bytes.size());
  return pool::frame_ref::adopt(std::move(l));
}

std::span<const std::uint8_t> span_of(std::string_view s) {
  return {reinterpret_cast<const std::uint8_t*>(s.data()), s.size()};
}

/// What the queue would write now, as one string.
std::string pending(const out_queue& q) {
  std::vector<iovec> iov(1024);
  std::size_t offered = 0;
  int n = q.gather(iov, offered);
  std::string out;
  for (int k = 0; k < n; ++k) out.append(static_cast<const char*>(iov[k].iov_base), iov[k].iov_len);
  CHECK(out.size() == offered);
  return out;
}

std::size_t leased_blocks(const pool::buffer_pool& b) {
  std::size_t n = 0;
  for (std::size_t c = 0; c < pool::buffer_pool::class_count; ++c) n += b.stats(c).leased;
  return n;
}

}  // namespace

TEST_CASE("out_queue: frames leave in order, a partial write resumes mid-frame, the block goes back when empty") {
  pool::buffer_pool b;
  out_queue q;
  CHECK(q.empty());
  CHECK(leased_blocks(b) == 0);
  REQUIRE(q.push(b, make_frame(b, "abc")));
  REQUIRE(q.push(b, make_frame(b, "defg")));
  CHECK(q.bytes() == 7);
  CHECK(pending(q) == "abcdefg");
  q.consume(2);
  CHECK(pending(q) == "cdefg");
  CHECK(q.bytes() == 5);
  q.consume(1);
  CHECK(q.frames() == 1);  // "abc" is done and released
  CHECK(pending(q) == "defg");
  q.consume(4);
  CHECK(q.empty());
  CHECK(leased_blocks(b) == 0);  // frames and the queue's own block: all returned
}

TEST_CASE("out_queue: the ring grows past its first block, keeping order and a partly sent head") {
  pool::buffer_pool b;
  out_queue q;
  std::string all;
  for (int k = 0; k < 1000; ++k) {
    std::string s = std::to_string(k) + ",";
    all += s;
    REQUIRE(q.push(b, make_frame(b, s)));
    if (k == 10) q.consume(1), all.erase(0, 1);  // "0" of "0," went out
  }
  CHECK(q.frames() == 1000);
  std::vector<iovec> iov(2000);
  std::size_t offered = 0;
  CHECK(q.gather(iov, offered) == 1000);
  CHECK(offered == all.size());
  CHECK(pending(q).substr(0, 1023) == all.substr(0, 1023));  // gather stops at its iovec room
  q.consume(all.size());
  CHECK(q.empty());
  CHECK(leased_blocks(b) == 0);
}

TEST_CASE("out_queue: at most one pong waits, however many pings come, and one being written is left alone") {
  pool::buffer_pool b;
  out_queue q;
  REQUIRE(q.push(b, make_frame(b, "data")));
  for (int k = 0; k < 10000; ++k) {
    std::string p = "ping " + std::to_string(k);
    REQUIRE(q.push_pong(b, span_of(p)));
  }
  CHECK(q.frames() == 2);  // the data frame and one pong
  CHECK(pending(q) == std::string("data") + "\x8a\x09" + "ping 9999");

  // A send in flight covers the pong: it must not change; the next ping gets a pong of its own.
  std::size_t offered = q.bytes();
  q.sending(offered, 1);
  REQUIRE(q.push_pong(b, span_of("a")));
  REQUIRE(q.push_pong(b, span_of("b")));
  CHECK(q.frames() == 3);
  CHECK(pending(q).substr(offered) == "\x8a\x01" "b");
  q.consume(offered);  // the send ended: what it covered is gone, "b" waits
  CHECK(pending(q) == "\x8a\x01" "b");
  q.consume(1);        // "b" is partly written: a new ping queues behind it
  REQUIRE(q.push_pong(b, span_of("c")));
  CHECK(pending(q) == "\x01" "b" "\x8a\x01" "c");
}

TEST_CASE("out_queue: the bound judges the backlog behind the frame being written, and only when the kernel refused it") {
  pool::buffer_pool b;
  out_queue q;
  const std::uint64_t bound = 1000;
  REQUIRE(q.push(b, make_frame(b, std::string(5000, 'x'))));  // one message larger than the bound
  CHECK(q.backlog() == 0);
  CHECK(q.judge(bound, true) == out_queue::verdict::ok);  // it goes out at the reader's pace
  for (int k = 0; k < 9; ++k) REQUIRE(q.push(b, make_frame(b, std::string(100, 'y'))));
  CHECK(q.backlog() == 900);
  CHECK(q.judge(bound, true) == out_queue::verdict::ok);
  REQUIRE(q.push(b, make_frame(b, std::string(200, 'z'))));
  CHECK(q.judge(bound, false) == out_queue::verdict::over);  // not offered yet: write it out first
  CHECK(q.judge(bound, true) == out_queue::verdict::slow);   // offered and refused: a slow consumer
  q.consume(4000);
  CHECK(q.backlog() == 1100);  // the head is still partly unsent

  // A slow consumer keeps only what the kernel was offered: the send in flight, the partial head.
  q.sending(1500, 1);
  q.drop_unsent();
  CHECK(q.bytes() == 1500);  // the head's last 1000 and five 100-byte frames
  q.consume(1500);
  CHECK(q.empty());
  CHECK(leased_blocks(b) == 0);
}
