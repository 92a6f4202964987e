#include "server/bus/cluster_map.hpp"

#include <charconv>

namespace wspush::server::bus {
namespace {

std::string_view text(const resp::reply* r) noexcept {
  return r && (r->type == resp::reply_type::string || r->type == resp::reply_type::status)
             ? std::string_view(r->str, r->len)
             : std::string_view{};
}

bool number(std::string_view s, std::uint64_t max, std::uint64_t& v) noexcept {
  if (s.empty()) return false;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  return ec == std::errc() && end == s.data() + s.size() && v <= max;
}

}  // namespace

bool cluster_map::load(const resp::reply& r, std::string& why) {
  if (r.type != resp::reply_type::array) return why = "CLUSTER SLOTS did not answer an array", false;
  std::vector<cluster_node> masters;
  std::array<std::uint16_t, cluster_slots> owner;
  owner.fill(none);
  std::uint32_t served = 0;
  for (std::size_t k = 0; k < r.elements; ++k) {
    const resp::reply* range = r.element[k];
    if (range->type != resp::reply_type::array || range->elements < 3) return why = "a slot range is not [start, end, master...]", false;
    const resp::reply *from = range->element[0], *to = range->element[1], *node = range->element[2];
    if (from->type != resp::reply_type::integer || to->type != resp::reply_type::integer || from->integer < 0 ||
        to->integer < from->integer || to->integer >= cluster_slots)
      return why = "a slot range is out of order or past 16383", false;
    if (node->type != resp::reply_type::array || node->elements < 2 || node->element[1]->type != resp::reply_type::integer ||
        node->element[1]->integer <= 0 || node->element[1]->integer > 65535)
      return why = "a slot range's master has no host and port", false;
    cluster_node n{std::string(text(node->element[0])), std::uint16_t(node->element[1]->integer),
                   node->elements > 2 ? std::string(text(node->element[2])) : std::string()};
    if (n.host == "?") n.host.clear();  // an unknown endpoint: the host the reply came from
    std::size_t at = 0;
    while (at < masters.size() && !(masters[at].host == n.host && masters[at].port == n.port)) ++at;
    if (at == masters.size()) masters.push_back(std::move(n));
    for (auto s = std::uint32_t(from->integer); s <= std::uint32_t(to->integer); ++s) {
      if (owner[s] != none) return why = "a slot is claimed twice", false;
      owner[s] = std::uint16_t(at);
      ++served;
    }
  }
  _masters = std::move(masters);
  _owner = owner;
  _served = served;
  _loaded = true;
  return true;
}

const cluster_node* cluster_map::master_of(std::uint32_t slot) const noexcept {
  if (!_loaded || slot >= cluster_slots || _owner[slot] == none) return nullptr;
  return &_masters[_owner[slot]];
}

redirect parse_redirect(std::string_view error) noexcept {
  redirect r;
  redirect::kind_t kind;
  if (error.starts_with("MOVED ")) kind = redirect::moved, error.remove_prefix(6);
  else if (error.starts_with("ASK ")) kind = redirect::ask, error.remove_prefix(4);
  else return r;
  const auto space = error.find(' ');
  const auto colon = error.rfind(':');
  std::uint64_t slot = 0, port = 0;
  if (space == std::string_view::npos || colon == std::string_view::npos || colon < space ||
      !number(error.substr(0, space), cluster_slots - 1, slot) || !number(error.substr(colon + 1), 65535, port) || port == 0)
    return r;
  r.kind = kind;
  r.slot = std::uint32_t(slot);
  r.host = std::string(error.substr(space + 1, colon - space - 1));
  r.port = std::uint16_t(port);
  return r;
}

}  // namespace wspush::server::bus
