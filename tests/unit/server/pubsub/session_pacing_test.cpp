// The pub/sub session's paced replay with a bus outside the process (bus_port.hpp): a replay
// longer than a page goes out as the client reads it. A recording bus stands in for Redis, and
// a fake connection layer counts what each connection has unsent (what send() queued, less what
// the test lets the client read), so the test decides when a reader has caught up.
// The bus's replies travel the shard's fanout, as they do in the server.

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "pool/buffer_pool.hpp"
#include "proto/ws_frame.hpp"
#include "server/pubsub/bus_port.hpp"
#include "server/pubsub/fanout.hpp"
#include "server/pubsub/hub.hpp"
#include "server/pubsub/session.hpp"
#include "server/reactor/loop.hpp"
#include "tests/unit/server/pubsub/fake_conns.hpp"

using namespace wspush;
using namespace wspush::server;
using namespace wspush::server::pubsub;

namespace {

using testing::fake_conns;

/// A bus that answers nothing by itself: it records what the session asks, and the test
/// answers through the fanout (reply()).
class recording_bus final : public bus_port {
 public:
  struct more_call {
    std::uint32_t shard;
    std::uint64_t request, room;
    bool operator==(const more_call&) const = default;
  };
  bool up() const noexcept override { return true; }
  bool subscribe(std::unique_ptr<bus_sub> s) noexcept override {
    subs.push_back(std::move(s));
    return true;
  }
  void release(std::uint32_t, std::string_view topic) noexcept override { released.emplace_back(topic); }
  void withdraw(std::uint32_t shard, std::uint64_t request) noexcept override {
    withdrawn.push_back({shard, request, 0});
  }
  void more(std::uint32_t shard, std::uint64_t request, std::uint64_t room) noexcept override {
    mores.push_back({shard, request, room});
  }
  bool readable_since(std::string_view) const noexcept override { return true; }
  bool publish(std::uint32_t, std::uint64_t tag, std::string_view, std::string_view, std::string_view) noexcept override {
    if (take_pubs) pub_tags.push_back(tag);
    return take_pubs;
  }

  std::vector<std::unique_ptr<bus_sub>> subs;
  std::vector<std::string> released;
  std::vector<more_call> withdrawn;  // room unused
  std::vector<more_call> mores;
  bool take_pubs = false;  // false: refused at once (down)
  std::vector<std::uint64_t> pub_tags;
  void presence_set(std::string_view, std::string_view, std::uint32_t, bool) noexcept override {}
  bool presence_get(std::uint32_t, conn_id, std::uint64_t, std::string_view, bool) noexcept override { return false; }
};

/// The hub's port of the one shard: the event goes to the fanout at once (live events).
struct direct_port final : event_port {
  fanout* f = nullptr;
  bool offer(event&& e, bool) noexcept override {
    f->on_item(std::move(e));
    f->on_pass_end();
    return true;
  }
  void wake() noexcept override {}
  bool crowded() const noexcept override { return false; }
};

constexpr std::uint32_t shard = 3;
constexpr std::uint64_t bound = 1000, half = bound / 2;  // --max-pending-bytes

struct fixture {
  pool::buffer_pool buffers;
  session_options opts;
  loop l{loop_options{}};  // hosts the fanout's inbox; never run here
  hub h{history_options{.size_per_topic = 8, .epoch = "ep"}, buffers};
  fanout f{l, 64, h.events().part_count(), registry_options{8, 128, 1}};
  direct_port port;
  fake_conns conns{buffers};
  recording_bus bus;
  session s{opts, nullptr, h, f, 64 * 1024, false};
  std::uint32_t tick = 1;

  fixture() {
    port.f = &f;
    h.attach({&port});
    s.bind(conns);
    s.use_bus(bus, shard, bound);
  }
  void open(conn_id c) { REQUIRE(s.on_open(c, open_info{})); }
  void say(conn_id c, std::string text) {
    message m{proto::opcode::text, {reinterpret_cast<std::uint8_t*>(text.data()), text.size()}, text.size(), nullptr};
    s.on_message(c, m);
  }
  /// `c` subscribes to "t" resuming after an id; returns the request the bus got.
  std::uint64_t sub_since(conn_id c) {
    const std::size_t before = bus.subs.size();
    say(c, R"({"op":"sub","topics":["t"],"since":{"t":"ep:1"}})");
    REQUIRE(bus.subs.size() == before + 1);
    return bus.subs.back()->request;
  }
  /// A replay frame of `bytes` bytes in all (header included) whose payload starts with `name`.
  pool::frame_ref frame(const std::string& name, std::size_t bytes) {
    const std::size_t header = bytes - 2 < 126 ? 2 : 4;
    const std::size_t n = bytes - header;
    REQUIRE(name.size() <= n);
    std::string payload = name + std::string(n - name.size(), '.');
    pool::lease l = buffers.acquire(proto::max_server_header_size + n);
    REQUIRE(l);
    std::memcpy(l.data() + proto::max_server_header_size, payload.data(), n);
    l.set_size(proto::frame_in_place({l.data(), l.capacity()}, proto::opcode::text, n));
    pool::frame_ref f = pool::frame_ref::adopt(std::move(l));
    REQUIRE(f.bytes().size() == bytes);
    return f;
  }
  /// Frames named `prefix`1.. of `bytes` bytes each.
  std::vector<pool::frame_ref> page(const std::string& prefix, int count, std::size_t bytes) {
    std::vector<pool::frame_ref> out;
    for (int k = 1; k <= count; ++k) out.push_back(frame(prefix + std::to_string(k), bytes));
    return out;
  }
  /// The bus answers `request` of `c` (in the shard's inbox, as Redis's answers come).
  void reply(bus_reply::kind_t kind, conn_id c, std::uint64_t request, std::vector<pool::frame_ref> frames = {},
             bool more = false) {
    auto r = std::make_unique<bus_reply>();
    r->kind = kind;
    r->more = more;
    r->conn = c;
    r->request = request;
    r->topics = {"t"};
    r->new_hold = {1};
    r->frames = std::move(frames);
    event e;
    e.reply = std::move(r);
    f.on_item(std::move(e));
    f.on_pass_end();
  }
  /// The bus fails the pub tagged `tag`: `maybe`, it was sent and no answer came.
  void pub_failed(std::uint64_t tag, std::string topic, bool maybe) {
    auto r = std::make_unique<bus_reply>();
    r->kind = bus_reply::pub_failed;
    r->pub_tag = tag;
    r->pub_topic = std::move(topic);
    r->maybe = maybe;
    event e;
    e.reply = std::move(r);
    f.on_item(std::move(e));
    f.on_pass_end();
  }
  void on_tick() { s.on_tick(tick++); }
  void publish(std::string_view data) {
    history_id id;
    REQUIRE(h.publish("t", data, id, true) == publish_status::ok);
  }
  std::vector<std::string>& got(conn_id c) { return conns.sent[c]; }
  /// The names of what `c` got (a payload's text before its padding).
  std::vector<std::string> names(conn_id c) {
    std::vector<std::string> out;
    for (const std::string& m : got(c)) out.push_back(m.substr(0, m.find('.')));
    return out;
  }
};

const std::string subbed_t = R"({"op":"subbed","topics":["t"],"lost":[]})";

}  // namespace

template <>
struct Catch::StringMaker<recording_bus::more_call> {
  static std::string convert(const recording_bus::more_call& m) {
    return "{shard " + std::to_string(m.shard) + ", request " + std::to_string(m.request) + ", room " +
           std::to_string(m.room) + "}";
  }
};

TEST_CASE("session pacing: a sub with since asks the bus for half the bound less what the connection has unsent") {
  fixture x;
  x.open(1);
  x.open(2);
  x.open(3);
  x.conns.unsent[1] = 120;
  x.conns.unsent[2] = half;  // at half: a page of at least one event
  x.conns.unsent[3] = bound + 50;
  x.sub_since(1);
  x.sub_since(2);
  x.sub_since(3);
  REQUIRE(x.bus.subs.size() == 3);
  const bus_sub& s = *x.bus.subs[0];
  CHECK(s.shard == shard);
  CHECK(s.conn == 1);
  CHECK(s.topics == std::vector<std::string>{"t"});
  CHECK(s.since == std::vector<std::string>{"ep:1"});
  CHECK(s.room == half - 120);
  CHECK(x.bus.subs[1]->room == 1);
  CHECK(x.bus.subs[2]->room == 1);
  CHECK(x.conns.held == std::set<conn_id>{1, 2, 3});  // until the bus answers
  CHECK(x.bus.subs[0]->request != x.bus.subs[1]->request);
}

TEST_CASE("session pacing: subbed with more sends subbed and the first page, holds the connection and asks once") {
  fixture x;
  x.open(1);
  x.say(1, "nope");  // a refusal: the app bits count it
  REQUIRE(x.conns.bits[1] == 1);
  x.got(1).clear();
  x.conns.drain(1);
  const std::uint64_t request = x.sub_since(1);
  x.reply(bus_reply::subbed, 1, request, x.page("a", 3, 100), true);
  CHECK(x.names(1) == std::vector<std::string>{subbed_t, "a1", "a2", "a3"});
  CHECK(x.conns.unsent[1] < half);
  // Below half the bound after the page: the next page is asked at once, with the room now.
  REQUIRE(x.bus.mores.size() == 1);
  CHECK(x.bus.mores[0] == recording_bus::more_call{shard, request, half - x.conns.unsent[1]});
  // Not a subscriber yet: a live event waits for replay_done (the bus keeps it aside).
  CHECK(x.f.registry().subscriber_count("t") == 0);
  x.publish("1");
  CHECK(x.got(1).size() == 4);
  // Still held (its next messages wait for the replay), and `subbed` counts as a good message.
  CHECK(x.conns.held.count(1) == 1);
  CHECK(x.conns.resumes[1] == 0);
  CHECK(x.conns.bits[1] == 0);
  // One more() per page: ticks ask no more, however much the client reads.
  x.conns.drain(1);
  x.on_tick();
  x.on_tick();
  CHECK(x.bus.mores.size() == 1);
}

TEST_CASE("session pacing: while half the bound is unsent more is not asked, and on_tick asks it once the client reads") {
  fixture x;
  x.open(1);
  const std::uint64_t request = x.sub_since(1);
  x.reply(bus_reply::subbed, 1, request, x.page("a", 5, 100), true);
  REQUIRE(x.got(1).size() == 6);  // all of a page sized by the room goes
  const std::size_t unsent = x.conns.unsent[1];
  REQUIRE(unsent >= half);
  CHECK(x.bus.mores.empty());
  x.on_tick();
  CHECK(x.bus.mores.empty());
  x.conns.drain(1, unsent - half);  // exactly half: still not
  x.on_tick();
  CHECK(x.bus.mores.empty());
  x.conns.drain(1, 200);
  x.on_tick();
  REQUIRE(x.bus.mores.size() == 1);
  CHECK(x.bus.mores[0] == recording_bus::more_call{shard, request, 200});
  x.conns.drain(1);
  x.on_tick();
  CHECK(x.bus.mores.size() == 1);
  // The next page: again held back by the reader, asked once it reads.
  x.reply(bus_reply::replay_more, 1, request, x.page("b", 6, 100), false);
  CHECK(x.got(1).size() == 12);
  CHECK(x.bus.mores.size() == 1);
  x.conns.drain(1);
  x.on_tick();
  x.on_tick();
  REQUIRE(x.bus.mores.size() == 2);
  CHECK(x.bus.mores[1] == recording_bus::more_call{shard, request, half});
}

TEST_CASE("session pacing: a frame that would take the connection past its bound waits until the client reads") {
  fixture x;
  x.open(1);
  const std::uint64_t request = x.sub_since(1);
  x.reply(bus_reply::subbed, 1, request, x.page("a", 4, 300), true);
  // subbed and three frames: one more would pass the bound.
  CHECK(x.names(1) == std::vector<std::string>{subbed_t, "a1", "a2", "a3"});
  const std::size_t unsent = x.conns.unsent[1];
  REQUIRE(unsent + 300 > bound);
  x.on_tick();
  CHECK(x.got(1).size() == 4);
  x.conns.drain(1, unsent + 300 - bound - 1);  // one byte short
  x.on_tick();
  CHECK(x.got(1).size() == 4);
  CHECK(x.bus.mores.empty());  // the page is not out yet
  x.conns.drain(1, 1);
  x.on_tick();
  CHECK(x.names(1).back() == "a4");
  CHECK(x.conns.unsent[1] == bound);
  CHECK(x.bus.mores.empty());  // all of it out, but the client has not read it
  x.conns.drain(1);
  x.on_tick();
  REQUIRE(x.bus.mores.size() == 1);
  CHECK(x.bus.mores[0].room == half);

  // A frame larger than the bound waits while anything is unsent, and goes alone.
  x.reply(bus_reply::replay_more, 1, request, {x.frame("b1", 100), x.frame("b2", bound + 500)});
  CHECK(x.names(1).back() == "b1");
  x.on_tick();
  CHECK(x.names(1).back() == "b1");
  x.conns.drain(1);
  x.on_tick();
  CHECK(x.names(1).back() == "b2");
  CHECK(x.bus.mores.size() == 1);
}

TEST_CASE("session pacing: pages follow in order, replay_done brings the live events after them and only then the connection joins") {
  fixture x;
  x.open(1);
  const std::uint64_t request = x.sub_since(1);
  x.reply(bus_reply::subbed, 1, request, x.page("a", 2, 100), true);
  x.conns.drain(1);
  x.publish("1");  // live while the replay goes: not to this connection yet
  x.reply(bus_reply::replay_more, 1, request, x.page("b", 2, 100));
  x.conns.drain(1);
  x.reply(bus_reply::replay_more, 1, request, x.page("c", 1, 100));
  x.conns.drain(1);
  CHECK(x.names(1) == std::vector<std::string>{subbed_t, "a1", "a2", "b1", "b2", "c1"});
  REQUIRE(x.bus.mores.size() == 3);  // once per page
  for (const auto& m : x.bus.mores) CHECK((m.shard == shard && m.request == request));
  CHECK(x.f.registry().subscriber_count("t") == 0);
  CHECK(x.conns.held.count(1) == 1);

  x.reply(bus_reply::replay_done, 1, request, {x.frame("live1", 60), x.frame("live2", 60)});
  CHECK(x.names(1) == std::vector<std::string>{subbed_t, "a1", "a2", "b1", "b2", "c1", "live1", "live2"});
  CHECK(x.f.registry().subscriber_count("t") == 1);
  CHECK(x.conns.held.count(1) == 0);
  CHECK(x.conns.resumes[1] == 1);
  CHECK(x.bus.released.empty());  // the shard holds "t" for its subscriber now
  x.publish("2");
  REQUIRE(x.got(1).size() == 9);
  CHECK(x.got(1).back().find(R"("topic":"t")") != std::string::npos);
  CHECK(x.got(1).back().find(R"("data":2})") != std::string::npos);
  x.conns.drain(1);
  x.on_tick();
  CHECK(x.bus.mores.size() == 3);  // nothing paced remains
}

TEST_CASE("session pacing: sub_failed after a paced subbed closes with 1013, before subbed it is unavailable") {
  fixture x;
  x.open(1);
  x.open(2);
  const std::uint64_t paced = x.sub_since(1);
  const std::uint64_t unanswered = x.sub_since(2);
  x.reply(bus_reply::subbed, 1, paced, x.page("a", 2, 100), true);
  REQUIRE(x.got(1).size() == 3);
  x.reply(bus_reply::sub_failed, 1, paced);
  CHECK(x.conns.closed[1] == std::uint16_t(proto::close_code::try_again_later));
  CHECK(x.got(1).size() == 3);  // no error after subbed: the close says it
  CHECK(x.f.registry().subscriber_count("t") == 0);
  // Connection 2 still waits for "t": the shard holds it.
  CHECK(x.bus.released.empty());

  x.reply(bus_reply::sub_failed, 2, unanswered);
  CHECK(x.conns.closed.count(2) == 0);
  CHECK(x.got(2) == std::vector<std::string>{R"({"op":"error","code":"unavailable","topic":"t"})"});
  CHECK(x.conns.resumes[2] == 1);
  CHECK(x.bus.released == std::vector<std::string>{"t"});  // no one holds it any more
}

TEST_CASE("session pacing: a connection that closes mid-replay withdraws its sub and later pages find no one") {
  fixture x;
  x.open(1);
  const std::uint64_t request = x.sub_since(1);
  x.reply(bus_reply::subbed, 1, request, x.page("a", 4, 300), true);
  REQUIRE(x.got(1).size() == 4);  // a4 waits for the reader
  x.conns.closed[1] = 1006;       // gone, then the layer tells the application
  x.s.on_close(1);
  REQUIRE(x.bus.withdrawn.size() == 1);
  CHECK((x.bus.withdrawn[0].shard == shard && x.bus.withdrawn[0].request == request));
  x.s.on_close(1);  // a second close of the slot withdraws nothing more
  CHECK(x.bus.withdrawn.size() == 1);

  // The slot is taken by another connection: what was meant for the old one never reaches it.
  x.conns.closed.erase(1);
  x.conns.sent.erase(1);
  x.conns.unsent.erase(1);
  x.open(1);
  x.on_tick();
  x.reply(bus_reply::replay_more, 1, request, x.page("b", 2, 100));
  x.on_tick();
  CHECK(x.got(1).empty());
  CHECK(x.bus.mores.empty());
  // The bus's answer to the withdrawal: "t" is held by no one now.
  x.reply(bus_reply::sub_failed, 1, request);
  CHECK(x.got(1).empty());
  CHECK(x.conns.closed.count(1) == 0);
  CHECK(x.conns.resumes[1] == 0);
  CHECK(x.bus.released == std::vector<std::string>{"t"});
}

TEST_CASE("session pacing: a pub lost in flight is answered timeout, one not sent unavailable, both of pub") {
  fixture x;
  x.opts.allow_client_publish = true;
  x.open(1);
  const pubsub_counters& n = x.f.counters();
  x.bus.take_pubs = true;
  x.say(1, R"({"op":"pub","topic":"p","data":1})");
  x.say(1, R"({"op":"pub","topic":"q","data":2})");
  REQUIRE(x.bus.pub_tags.size() == 2);
  CHECK(x.got(1).empty());  // a pub is answered only when it fails
  x.pub_failed(x.bus.pub_tags[0], "p", true);
  CHECK(x.got(1) == std::vector<std::string>{R"({"op":"error","code":"timeout","topic":"p","of":"pub"})"});
  x.pub_failed(x.bus.pub_tags[1], "q", false);
  CHECK(x.got(1).back() == R"({"op":"error","code":"unavailable","topic":"q","of":"pub"})");
  x.bus.take_pubs = false;
  x.say(1, R"({"op":"pub","topic":"r","data":3})");  // refused at once
  CHECK(x.got(1).back() == R"({"op":"error","code":"unavailable","topic":"r","of":"pub"})");
  CHECK(n.client_pubs_timeout.get() == 1);
  CHECK(n.client_pubs_unavailable.get() == 2);
  // The node's state, not the client's fault: however many in a row, the connection stays.
  x.bus.take_pubs = true;
  for (int k = 0; k < 20; ++k) {
    x.say(1, R"({"op":"pub","topic":"p","data":1})");
    x.pub_failed(x.bus.pub_tags.back(), "p", true);
  }
  CHECK(x.got(1).size() == 23);
  CHECK(x.conns.closed.count(1) == 0);
  CHECK(n.client_pubs_timeout.get() == 21);
}
