// Fuzz target for server/bus/cluster_map (issue 21): what a Redis Cluster node answers, read as
// a slot map (CLUSTER SLOTS) and as a redirection (MOVED, ASK). Input: RESP bytes. Invariants: no
// crash; a map that loads names only masters with a port, gives each slot at most one master,
// counts as covered exactly when every slot has one, and a refused reply leaves the map as it
// was; a redirection is for a slot below 16384 and a port above 0.

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "fuzz_check.hpp"
#include "server/bus/cluster_map.hpp"

using namespace wspush::server::bus;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static cluster_map map;  // kept across inputs: a refused reply must leave it as it was
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  resp::parser p(resp::limits{.max_bulk = 4096, .max_elements = 4096, .max_depth = 4, .max_total = 1 << 20});
  const resp::result r = p.parse(in);
  if (r.st != resp::status::done) return 0;
  const resp::reply& root = p.root();
  if (root.type == resp::reply_type::error) {
    const redirect d = parse_redirect({root.str, root.len});
    if (d.kind != redirect::none) WSPUSH_FUZZ_CHECK(d.slot < cluster_slots && d.port > 0);
    return 0;
  }
  const cluster_node* before = map.master_of(0);
  const cluster_node was = before ? *before : cluster_node{};
  const bool was_covered = map.covered();
  std::string why;
  if (!map.load(root, why)) {
    WSPUSH_FUZZ_CHECK(!why.empty());
    WSPUSH_FUZZ_CHECK(map.covered() == was_covered);
    const cluster_node* after = map.master_of(0);
    WSPUSH_FUZZ_CHECK((after == nullptr) == (before == nullptr));
    if (after) WSPUSH_FUZZ_CHECK(*after == was);
    return 0;
  }
  std::uint32_t served = 0;
  for (std::uint32_t s = 0; s < cluster_slots; ++s)
    if (const cluster_node* n = map.master_of(s)) {
      ++served;
      WSPUSH_FUZZ_CHECK(n->port > 0);
    }
  WSPUSH_FUZZ_CHECK(map.covered() == (served == cluster_slots));
  for (const cluster_node& n : map.masters()) WSPUSH_FUZZ_CHECK(n.port > 0);
  return 0;
}
