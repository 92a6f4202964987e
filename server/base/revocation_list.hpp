#pragma once
// The users revoked lately (POST /disconnect): each `sub` with the time of its revoke, kept
// --revocation-ttl seconds. A token of such a user issued no later than the revoke (its `iat`
// not after it, or no `iat` at all) is refused: at the upgrade (401) and in an in-band `auth`
// (`unauthorized`). A token minted after the revoke is accepted, so the backend decides when
// the user may come back. At most --max-revocations entries: past it the oldest revoke is
// forgotten first.
//
// Times are unix seconds: a token issued in the second of the revoke is refused too (its iat
// cannot tell it came after); a backend that reissues at once mints with a later iat.
//
// Any thread: upgrades check it on the task pool, `auth` on the shards, revokes come from the
// admin thread and the bus's. A mutex guards it; while it is empty (the usual case) a check
// takes no lock, and a check is made once per upgrade or `auth`, never per message.

#include <atomic>
#include <cstdint>
#include <functional>
#include <mutex>
#include <set>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>

namespace wspush::server {

class revocation_list {
 public:
  /// `ttl_seconds` 0 or `max_entries` 0: the list is off (nothing is recorded, nothing refused).
  revocation_list(std::uint32_t ttl_seconds, std::uint32_t max_entries) noexcept
      : _ttl(ttl_seconds), _max(max_entries) {}

  bool enabled() const noexcept { return _ttl > 0 && _max > 0; }
  std::uint32_t ttl() const noexcept { return _ttl; }

  /// Records that `sub` was revoked at `at` (unix seconds), at `now`. True when that is news:
  /// the list held no revoke of `sub` as late (false too when the list is off, or `at` is
  /// older than the ttl already). Entries older than the ttl are forgotten here.
  bool record(std::string_view sub, std::int64_t at, std::int64_t now) {
    // A time ahead of ours (another node's clock, or Redis written by hand) counts as now: a
    // revoke never reaches into the future, and `at + ttl` stays far from overflowing.
    if (at > now) at = now;
    if (!enabled() || sub.empty() || at < 0 || at + _ttl <= now) return false;
    std::lock_guard lock(_m);
    prune(now);
    auto it = _at.find(sub);
    if (it != _at.end()) {
      if (it->second >= at) return false;
      _by_time.erase({it->second, &it->first});
      it->second = at;
      _by_time.insert({at, &it->first});
      return true;
    }
    while (_at.size() >= _max) forget_oldest();
    it = _at.emplace(std::string(sub), at).first;
    _by_time.insert({at, &it->first});
    _count.store(_at.size(), std::memory_order_release);
    return true;
  }

  /// Whether the list holds anyone (no lock: an upgrade asks this first).
  bool any() const noexcept { return _count.load(std::memory_order_acquire) > 0; }

  /// Whether a token of `sub` issued at `iat` (0: it has no iat) is refused at `now`.
  bool revoked(std::string_view sub, std::int64_t iat, std::int64_t now) const {
    if (_count.load(std::memory_order_acquire) == 0 || sub.empty()) return false;
    std::lock_guard lock(_m);
    auto it = _at.find(sub);
    if (it == _at.end() || it->second + _ttl <= now) return false;
    return iat == 0 || iat <= it->second;
  }

  /// Entries now (those past the ttl forgotten first): the wspush_revocations gauge.
  std::size_t size(std::int64_t now) {
    std::lock_guard lock(_m);
    prune(now);
    return _at.size();
  }

 private:
  struct name_hash {
    using is_transparent = void;
    std::size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
  };
  void forget_oldest() {
    auto first = _by_time.begin();
    auto it = _at.find(*first->second);
    _by_time.erase(first);
    _at.erase(it);
  }
  void prune(std::int64_t now) {
    while (!_by_time.empty() && _by_time.begin()->first + _ttl <= now) forget_oldest();
    _count.store(_at.size(), std::memory_order_release);
  }

  const std::int64_t _ttl;
  const std::size_t _max;
  mutable std::mutex _m;
  std::unordered_map<std::string, std::int64_t, name_hash, std::equal_to<>> _at;  // sub -> revoked at
  std::set<std::pair<std::int64_t, const std::string*>> _by_time;  // oldest first; keys of _at (node-based: stable)
  std::atomic<std::size_t> _count{0};
};

}  // namespace wspush::server
