// The fanout: events taken in one pass over the inbox, delivered to the topic's subscribers;
// consecutive events of one topic joined into one block, and never reordered across topics.

#include <catch2/catch.hpp>

#include <map>
#include <string>
#include <vector>

#include "pool/buffer_pool.hpp"
#include "server/pubsub/fanout.hpp"
#include "server/reactor/loop.hpp"

using namespace wspush;
using namespace wspush::server;
using namespace wspush::server::pubsub;

namespace {

/// Records each send_all: which connections, what bytes, how many messages.
struct recorded_conns final : conn_ops {
  explicit recorded_conns(pool::buffer_pool& b) : buffers_(b) {}
  struct call {
    std::vector<conn_id> to;
    std::string bytes;
    std::uint32_t messages;
  };
  std::vector<call> calls;
  std::map<conn_id, std::string> stream;  // what each connection got, in order
  bool send(conn_id, pool::frame_ref) noexcept override { return true; }
  send_counts send_all(std::span<const conn_id> cs, const pool::frame_ref& f, std::uint32_t messages) noexcept override {
    std::string b(reinterpret_cast<const char*>(f.bytes().data()), f.bytes().size());
    calls.push_back({{cs.begin(), cs.end()}, b, messages});
    for (conn_id c : cs) stream[c] += b;
    return {cs.size(), 0, 0};
  }
  void close(conn_id, proto::close_code) noexcept override {}
  bool is_open(conn_id) const noexcept override { return true; }
  std::size_t unsent_bytes(conn_id) const noexcept override { return 0; }
  void expiry_changed(conn_id) noexcept override {}
  std::uint8_t app_bits(conn_id) const noexcept override { return 0; }
  void set_app_bits(conn_id, std::uint8_t) noexcept override {}
  pool::buffer_pool& buffers() noexcept override { return buffers_; }
  void hold(conn_id) noexcept override {}
  void resume(conn_id) noexcept override {}
  pool::buffer_pool& buffers_;
};

event make_event(pool::buffer_pool& b, std::string_view topic, std::string bytes, std::uint64_t seq) {
  pool::lease l = b.acquire(bytes.size());
  std::memcpy(l.data(), bytes.data(), bytes.size());
  l.set_size(bytes.size());
  return event{pool::frame_ref::adopt(std::move(l)), topic, seq, 0, {}};
}

}  // namespace

TEST_CASE("fanout: a run of one topic goes out as one block and topics interleaved stay in order") {
  pool::buffer_pool b;
  loop l{loop_options{}};
  fanout f(l, 64, 1, registry_options{8, 128, 1});
  recorded_conns conns(b);
  f.bind(conns);
  REQUIRE(f.registry().subscribe(1, "a") == sub_result::added);
  REQUIRE(f.registry().subscribe(2, "a") == sub_result::added);
  REQUIRE(f.registry().subscribe(2, "b") == sub_result::added);

  // One pass: a a a b a
  f.on_item(make_event(b, "a", "A1", 1));
  f.on_item(make_event(b, "a", "A2", 2));
  f.on_item(make_event(b, "a", "A3", 3));
  f.on_item(make_event(b, "b", "B4", 4));
  f.on_item(make_event(b, "a", "A5", 5));
  f.on_pass_end();

  REQUIRE(conns.calls.size() == 3);
  CHECK(conns.calls[0].bytes == "A1A2A3");  // joined once for every subscriber
  CHECK(conns.calls[0].messages == 3);
  CHECK(conns.calls[1].bytes == "B4");
  CHECK(conns.calls[2].bytes == "A5");
  CHECK(conns.stream[1] == "A1A2A3A5");
  CHECK(conns.stream[2] == "A1A2A3B4A5");  // B4 between A3 and A5, as handed over
  CHECK(f.counters().deliveries.get() == 2 * 3 + 1 + 2);
  CHECK(f.fanned(0) == 5);

  // A run is cut at max_run_bytes.
  conns.calls.clear();
  std::string big(fanout::max_run_bytes / 2 + 1, 'x');
  for (std::uint64_t k = 6; k < 9; ++k) f.on_item(make_event(b, "a", big, k));
  f.on_pass_end();
  CHECK(conns.calls.size() == 3);
  CHECK(f.fanned(0) == 8);
}
