#pragma once
/// \file namespaces.hpp
/// Options per kind of topic. A topic takes the options of the longest namespace prefix it
/// starts with (`mailbox:` for `mailbox:42`), or the global ones. Built at start-up, read-only
/// afterwards: any thread may ask. A lookup compares the topic with each prefix, longest first
/// (a deployment has a handful), and is made once per publish or subscribe, never per
/// subscriber.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <utility>
#include <vector>

#include "server/base/options.hpp"

namespace wspush::server::pubsub {

class namespaces {
 public:
  namespaces() = default;
  namespaces(topic_options defaults, std::vector<topic_namespace> list)
      : _defaults(defaults), _list(std::move(list)) {
    std::stable_sort(_list.begin(), _list.end(),
                     [](const topic_namespace& a, const topic_namespace& b) { return a.prefix.size() > b.prefix.size(); });
    for (const topic_namespace& n : _list) {
      _any_presence |= n.options.presence || n.options.join_leave;
      _any_join_leave |= n.options.join_leave;
    }
    _any_presence |= _defaults.presence || _defaults.join_leave;
    _any_join_leave |= _defaults.join_leave;
  }

  const topic_options& of(std::string_view topic) const noexcept {
    for (const topic_namespace& n : _list)
      if (topic.starts_with(n.prefix)) return n.options;
    return _defaults;
  }
  /// The namespace's prefix for `topic` ("" for the global options).
  std::string_view prefix_of(std::string_view topic) const noexcept {
    for (const topic_namespace& n : _list)
      if (topic.starts_with(n.prefix)) return n.prefix;
    return {};
  }
  /// The namespace's place in list() for `topic`, or list().size() for the global options:
  /// what tables indexed that way (history.cpp) find a topic's entry by.
  std::size_t index_of(std::string_view topic) const noexcept {
    for (std::size_t k = 0; k < _list.size(); ++k)
      if (topic.starts_with(_list[k].prefix)) return k;
    return _list.size();
  }
  /// The options at index_of's place.
  const topic_options& at(std::size_t index) const noexcept {
    return index < _list.size() ? _list[index].options : _defaults;
  }
  /// The most events any topic keeps (what bounds a whole replay).
  std::uint32_t max_history_size() const noexcept {
    std::uint32_t n = _defaults.history_size;
    for (const topic_namespace& x : _list) n = std::max(n, x.options.history_size);
    return n;
  }
  const topic_options& defaults() const noexcept { return _defaults; }
  /// Longest prefix first.
  const std::vector<topic_namespace>& list() const noexcept { return _list; }
  /// Some topic keeps presence (join/leave needs it too): subscribes and closes track users.
  bool any_presence() const noexcept { return _any_presence; }
  bool any_join_leave() const noexcept { return _any_join_leave; }

 private:
  topic_options _defaults;
  std::vector<topic_namespace> _list;
  bool _any_presence = false, _any_join_leave = false;
};

}  // namespace wspush::server::pubsub
