// The connection layer's phases over fakes of the loop and the transport (no sockets, no
// threads): the upgrade, frames to messages, control frames, the deadlines, the slow-consumer
// bound, closing while a send is in flight, and the drain.

#include <catch2/catch.hpp>

#include "server/base/clock.hpp"
#include "tests/unit/server/conn/conn_fakes.hpp"

using namespace wspush;
using namespace wspush::server;
using namespace wspush::server::test;
using proto::opcode;

TEST_CASE("phases: an upgrade dribbled byte by byte opens and frames right behind it are read after the 101") {
  harness h;
  int fd = h.accept();
  CHECK(h.open_count == 1);
  std::string req = upgrade_request + client_frame(opcode::text, "early");
  h.feed(fd, req, 1);
  h.turn();
  const std::string& w = h.wire.sockets[fd].wire;
  REQUIRE(w.rfind("HTTP/1.1 101 Switching Protocols\r\n", 0) == 0);
  CHECK(w.find("Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n") != std::string::npos);
  CHECK(h.app.opened.count(h.slot(fd)) == 1);
  REQUIRE(h.app.messages.size() == 1);
  CHECK(h.app.messages[0].second == "early");
}

TEST_CASE("phases: a bad request gets an HTTP answer, then a half-close, then the close") {
  harness h;
  int fd = h.accept();
  h.feed(fd, "GET /ws HTTP/1.1\r\nHost: x\r\n\r\n");  // no Upgrade: plain HTTP
  h.turn();
  fake_transport::socket& s = h.wire.sockets[fd];
  CHECK(s.wire.rfind("HTTP/1.1 426", 0) == 0);
  CHECK(s.shut);       // the answer is out: write side shut
  CHECK_FALSE(s.closed);  // still reading until the peer is done (or the close timeout)
  CHECK(h.app.opened.empty());
  h.conns.on_read_end(s.token, 0);
  CHECK(s.closed);
  CHECK(h.conns.size() == 0);
  CHECK(h.open_count == 0);
}

TEST_CASE("phases: messages in fragments, with a ping between, reach the application whole") {
  harness h;
  h.app.echo = true;
  int fd = h.open();
  h.feed(fd, client_frame(opcode::text, "hel", false) + client_frame(opcode::ping, "p") +
                 client_frame(opcode::continuation, "lo", true) + client_frame(opcode::binary, std::string(70000, 'b')));
  h.turn();
  auto f = h.frames(fd);
  REQUIRE(f.size() == 3);
  CHECK((f[0].opcode == 0xA && f[0].payload == "p"));
  CHECK((f[1].opcode == 0x1 && f[1].payload == "hello"));
  CHECK((f[2].opcode == 0x2 && f[2].payload.size() == 70000));
}

TEST_CASE("phases: an application holds a connection's messages while it works and they come in order after resume") {
  harness h;
  h.app.hold_on = "sub";
  int fd = h.open();
  // The held message and three more in one read; more arrive while it is held (io_uring
  // completions already on their way when reading paused), one split across reads.
  std::string more = client_frame(opcode::text, "four") + client_frame(opcode::text, std::string(5000, 'v'));
  h.feed(fd, client_frame(opcode::text, "one") + client_frame(opcode::text, "sub") + client_frame(opcode::text, "two") +
                 client_frame(opcode::text, "three"));
  CHECK_FALSE(h.wire.sockets[fd].reading);  // paused while held
  h.feed(fd, more.substr(0, 7));
  h.turn();
  CHECK_FALSE(h.wire.sockets[fd].reading);  // the flush does not resume a held connection
  h.feed(fd, more.substr(7));
  REQUIRE(h.app.messages.size() == 2);
  CHECK(h.app.messages[1].second == "sub");
  h.app.hold_on.clear();
  h.app.ops->resume(conn_id(h.app.messages[1].first));
  REQUIRE(h.app.messages.size() == 6);
  CHECK(h.app.messages[2].second == "two");
  CHECK(h.app.messages[3].second == "three");
  CHECK(h.app.messages[4].second == "four");
  CHECK(h.app.messages[5].second == std::string(5000, 'v'));  // kept in two pieces, whole again
  h.turn();
  CHECK(h.wire.sockets[fd].reading);  // reading again
  h.feed(fd, client_frame(opcode::text, "five"));
  REQUIRE(h.app.messages.size() == 7);
  CHECK(h.app.messages[6].second == "five");
}

TEST_CASE("phases: a connection held at every message hands its kept bytes over in place, in order") {
  harness h;
  int fd = h.open();
  h.app.hold_all = true;
  auto msg = [](const std::string& name) { return name + std::string(1000, 'k'); };
  std::string in;
  for (int i = 0; i < 40; ++i) in += client_frame(opcode::text, msg(std::to_string(i)));
  h.feed(fd, in);  // one read: the first is handed over, the 39 behind it kept
  REQUIRE(h.app.messages.size() == 1);
  const ws_rx& rx = *h.conns.at(h.slot(fd)).rx.ws;
  const std::uint8_t* block = rx.kept.data();
  for (std::size_t i = 1; i < 40; ++i) {
    h.app.ops->resume(conn_id(h.slot(fd)));  // one message each: held again behind it
    REQUIRE(h.app.messages.size() == i + 1);
    CHECK(h.app.messages[i].second == msg(std::to_string(i)));
    // Resuming costs what it hands over: the rest stays in its block, it is not copied.
    if (i < 39) CHECK(h.conns.at(h.slot(fd)).rx.ws->kept.data() == block);
    if (i == 20) {  // more came while held: behind what is left, in order
      std::string late;
      for (int j = 0; j < 30; ++j) late += client_frame(opcode::text, msg("late" + std::to_string(j)));
      h.feed(fd, late, 4000);
    }
  }
  for (std::size_t j = 0; j < 30; ++j) {
    h.app.ops->resume(conn_id(h.slot(fd)));
    REQUIRE(h.app.messages.size() == 41 + j);
    CHECK(h.app.messages.back().second == msg("late" + std::to_string(j)));
  }
  h.app.hold_all = false;
  h.app.ops->resume(conn_id(h.slot(fd)));
  h.turn();
  CHECK(h.wire.sockets[fd].reading);
  h.feed(fd, client_frame(opcode::text, "after"));
  CHECK(h.app.messages.back().second == "after");
}

TEST_CASE("phases: a held connection that floods past the kept bound is closed") {
  harness h;
  h.app.hold_on = "sub";
  int fd = h.open();
  h.feed(fd, client_frame(opcode::text, "sub"));
  std::string big = client_frame(opcode::binary, std::string(600000, 'x'));
  h.feed(fd, big + big);
  h.turn();
  auto f = h.frames(fd);
  REQUIRE_FALSE(f.empty());
  CHECK(f.back().opcode == 0x8);  // a close frame: 1008
}

TEST_CASE("phases: a ping flood from a peer that does not read leaves at most one pong waiting, then 1013") {
  conn_options o;
  o.max_pending_bytes = 4096;
  harness h(o);
  int fd = h.open();
  fake_transport::socket& s = h.wire.sockets[fd];
  s.how = fake_transport::mode::take_room;
  s.room = 0;  // its receive window is full: the kernel takes nothing more
  std::string flood;
  for (int k = 0; k < 2000; ++k) flood += client_frame(opcode::ping, "ping " + std::to_string(k));
  h.feed(fd, flood);
  h.turn();
  // Nothing was written; what waits is one pong, not two thousand.
  CHECK(h.frames(fd).empty());
  CHECK(h.conns.at(h.slot(fd)).tx.frames() == 1);
  // It keeps flooding with data the application answers: the backlog the kernel refused passes
  // the bound and the connection is closed as a slow consumer.
  h.app.echo = true;
  h.feed(fd, client_frame(opcode::text, std::string(3000, 'x')) + client_frame(opcode::text, std::string(3000, 'y')));
  h.turn();
  CHECK(h.conns.counters().slow_consumer_closes.get() == 1);
  CHECK(h.conns.at(h.slot(fd)).state == conn_state::closing);
}

TEST_CASE("phases: a burst over the bound that the kernel takes closes no one but a reader that refuses is closed") {
  conn_options o;
  o.max_pending_bytes = 64 * 1024;
  harness h(o);
  int fast = h.open(), slow = h.open();
  h.wire.sockets[slow].how = fake_transport::mode::take_room;
  h.wire.sockets[slow].room = 8 * 1024;
  pool::buffer_pool& b = h.buffers;
  // 100 events of 1 KiB queued within one iteration: 100 KiB each, over the 64 KiB bound.
  for (int k = 0; k < 100; ++k) {
    pool::lease l = b.acquire(message_header_room + 1024);
    l.set_size(proto::frame_in_place({l.data(), l.capacity()}, opcode::text, 1024));
    pool::frame_ref f = pool::frame_ref::adopt(std::move(l));
    conn_id both[] = {h.slot(fast), h.slot(slow)};
    send_counts n = h.conns.send_all(both, f);
    CHECK(n.queued == 2);  // not yet offered to the kernel: no verdict
  }
  CHECK(h.loop.yields > 0);  // the loop was asked to write before taking more
  h.turn();
  CHECK(h.conns.at(h.slot(fast)).state == conn_state::open);
  CHECK(h.conns.at(h.slot(fast)).tx.empty());
  CHECK(h.conns.at(h.slot(slow)).state == conn_state::closing);  // 92 KiB it would not take
  CHECK(h.conns.counters().slow_consumer_closes.get() == 1);
}

TEST_CASE("phases: one frame larger than the bound goes out while the reader takes bytes and a reader that stops is closed") {
  conn_options o;
  o.max_pending_bytes = 64 * 1024;
  harness h(o);
  int reading = h.open(), stopped = h.open();
  h.wire.next_mode = fake_transport::mode::async;
  int stopped_async = h.open();
  h.wire.complete(stopped_async, h.conns);  // the 101
  for (int fd : {reading, stopped}) {
    h.wire.sockets[fd].how = fake_transport::mode::take_room;
    h.wire.sockets[fd].room = 8 * 1024;
  }
  // One 256 KiB event, and nothing after it: no later queueing judges anyone.
  pool::lease l = h.buffers.acquire(message_header_room + 256 * 1024);
  l.set_size(proto::frame_in_place({l.data(), l.capacity()}, opcode::text, 256 * 1024));
  conn_id all[] = {h.slot(reading), h.slot(stopped), h.slot(stopped_async)};
  CHECK(h.conns.send_all(all, pool::frame_ref::adopt(std::move(l))).queued == 3);
  h.turn();
  h.turn();  // the asynchronous send has been offered: it is stuck from here on
  // The reader takes 4 KiB a tick (64 ticks for the event, well past stall_seconds); the others
  // take nothing. Both of those are closed within two ticks past stall_seconds, the reader never.
  const std::uint32_t grace = h.loop.ticks_for(connections::stall_seconds);
  for (std::uint32_t t = 1; t <= grace + 2; ++t) {
    h.wire.sockets[reading].room += 4 * 1024;
    h.conns.on_writable(h.wire.sockets[reading].token);
    h.turn();
    h.loop.advance(1, h.conns);
    h.conns.on_tick(h.loop.now());
    CHECK(h.conns.at(h.slot(reading)).state == conn_state::open);
    if (t < grace) CHECK(h.conns.counters().slow_consumer_closes.get() == 0);
  }
  CHECK(h.conns.at(h.slot(stopped)).state == conn_state::closing);
  CHECK(h.conns.at(h.slot(stopped_async)).state == conn_state::closing);
  CHECK(h.conns.counters().slow_consumer_closes.get() == 2);
  while (!h.conns.at(h.slot(reading)).tx.empty()) {
    h.wire.sockets[reading].room += 64 * 1024;
    h.conns.on_writable(h.wire.sockets[reading].token);
    h.turn();
  }
  auto f = h.frames(reading);
  REQUIRE(f.size() == 1);
  CHECK(f[0].payload.size() == 256 * 1024);
  CHECK(h.conns.at(h.slot(reading)).state == conn_state::open);
}

TEST_CASE("phases: a header or control frame trickled byte by byte meets the message timeout") {
  conn_options o;
  o.message_timeout = 2;
  o.ping_interval = 60;
  harness h(o);
  for (std::string frame : {client_frame(opcode::ping, "x"), client_frame(opcode::text, std::string(300, 'a'))}) {
    int fd = h.open();
    std::uint32_t slot = h.slot(fd);
    h.feed(fd, frame.substr(0, 1));  // one byte of the header
    REQUIRE(h.loop.deadlines.count(slot));
    CHECK(h.loop.deadlines[slot] - h.loop.now() == h.loop.ticks_for(2));
    h.loop.advance(h.loop.ticks_for(2), h.conns);
    CHECK(h.conns.at(slot).state == conn_state::closing);
    h.turn();
    auto f = h.frames(fd);
    REQUIRE(f.size() == 1);
    CHECK(f[0].opcode == 0x8);
    CHECK(f[0].payload == std::string("\x03\xf0", 2));  // 1008
  }
}

TEST_CASE("phases: keepalive pings a silent connection and closes it when nothing comes back") {
  conn_options o;
  o.ping_interval = 1;
  o.pong_timeout = 1;
  harness h(o);
  int fd = h.open();
  h.loop.advance(h.loop.ticks_for(1), h.conns);
  h.turn();
  auto f = h.frames(fd);
  REQUIRE(f.size() == 1);
  CHECK(f[0].opcode == 0x9);
  h.loop.advance(h.loop.ticks_for(1), h.conns);
  CHECK(h.wire.sockets[fd].closed);
  CHECK(h.app.closed.size() == 1);
}

TEST_CASE("phases: the application's expiry is the connection's deadline when it comes first") {
  harness h;
  h.app.exp = std::uint32_t(realtime_ms() / 1000 - 1);  // already past
  int fd = h.open();
  h.loop.advance(1, h.conns);
  CHECK(h.app.expired == 1);
  h.turn();
  auto f = h.frames(fd);
  REQUIRE(f.size() == 1);
  CHECK(f[0].payload == std::string("\x03\xf0", 2));
}

TEST_CASE("phases: a connection closed while its send is in flight is counted until the send ends") {
  conn_options o;
  o.max_connections = 1;
  harness h(o);
  h.wire.next_mode = fake_transport::mode::async;
  int fd = h.accept();
  h.feed(fd, upgrade_request);
  h.turn();
  fake_transport::socket& s = h.wire.sockets[fd];
  REQUIRE(s.in_flight > 0);  // the 101 is being sent
  h.conns.on_read_end(s.token, 0);
  CHECK(s.closed);
  CHECK(h.open_count == 1);  // the kernel still holds the socket for the send
  CHECK(h.conns.size() == 1);
  int refused = h.accept();
  CHECK(h.wire.sockets.count(refused) == 0);  // over --max-connections: never opened
  h.wire.complete(fd, h.conns);
  CHECK(h.open_count == 0);
  CHECK(h.conns.size() == 0);
}

TEST_CASE("phases: a slow consumer is reset, not left to drain its backlog into a peer that never reads") {
  conn_options o;
  o.max_pending_bytes = 4096;
  o.close_timeout = 1;
  harness h(o);
  h.app.echo = true;
  int fd = h.open();
  fake_transport::socket& s = h.wire.sockets[fd];
  s.how = fake_transport::mode::take_room;
  s.room = 0;
  for (char c : {'x', 'y', 'z'}) h.feed(fd, client_frame(opcode::text, std::string(3000, c)));
  h.turn();
  REQUIRE(h.conns.at(h.slot(fd)).state == conn_state::closing);  // 6 KB behind the first: over 4 KiB
  h.loop.advance(h.loop.ticks_for(1), h.conns);  // the close timeout: it never read our close
  CHECK(s.closed);
  CHECK(s.aborted);  // unsent bytes: reset
}

TEST_CASE("phases: a drain closes the open connections with 1001 a few at a time and refuses late upgrades") {
  harness h;
  int a = h.open(), b = h.open();
  h.runner.busy = true;  // an upgrade is with a worker when the drain starts
  int late = h.accept();
  h.feed(late, upgrade_request);
  int half = h.accept();
  h.feed(half, "GET /ws HT");
  CHECK(h.conns.on_drain_begin() == 2);
  CHECK(h.wire.sockets[half].closed);  // an upgrade still arriving has no graceful end
  CHECK(h.conns.close_some(1) == 1);
  h.turn();
  CHECK(h.frames(a).size() == 1);
  CHECK(h.frames(b).empty());
  CHECK(h.conns.close_some(5) == 1);  // one left
  h.turn();
  REQUIRE(h.frames(b).size() == 1);
  CHECK(h.frames(b)[0].payload == std::string("\x03\xe9", 2));  // 1001
  h.runner.busy = false;
  h.conns.on_turn();  // the worker's answer comes back while draining
  h.turn();
  CHECK(h.wire.sockets[late].wire.rfind("HTTP/1.1 503", 0) == 0);
}
