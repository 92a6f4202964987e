#pragma once
/// \file namespaces.hpp
/// Options per kind of topic. A topic takes the options of the longest namespace prefix it
/// starts with (`mailbox:` for `mailbox:42`), or the global ones. Built at start-up, read-only
/// afterwards: any thread may ask. A lookup compares the topic with each prefix, longest first
/// (a deployment has a handful), and is made once per publish or subscribe, never per
/// subscriber.

#include <algorithm>
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
