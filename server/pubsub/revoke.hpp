#pragma once
/// \file revoke.hpp
/// A revoke (POST /disconnect) on its way to the shards. Whoever revokes (the admin thread, or
/// the Redis bus's for another node's revoke) makes one order for the user and hands each shard
/// a share of it through the shard's event inbox, the way the bus's replies travel (event.hpp):
/// nothing is looked at per event for it. On its thread the shard's session closes that user's
/// connections (close 4403, "revoked"; a stream ends with a `refused` event) and adds them to
/// the order's count. A share says its shard is done when it goes, whether the session took it
/// or it was dropped (a shard that stopped), so the revoker can wait for every shard.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

namespace wspush::server::pubsub {

struct revoke_order {
  revoke_order(std::string s, std::uint32_t u, std::uint32_t shares) : sub(std::move(s)), user(u), left(shares) {}
  const std::string sub;
  const std::uint32_t user;  ///< its number in the user_table when the order was made (checked again by each shard)
  std::atomic<std::uint32_t> closed{0};  ///< connections the shards closed

  /// Waits until every share is done, at most `timeout`; false when the wait ran out.
  bool wait(std::chrono::milliseconds timeout) {
    std::unique_lock lock(_m);
    return _cv.wait_for(lock, timeout, [this] { return left == 0; });
  }
  void share_done() noexcept {
    std::lock_guard lock(_m);
    if (left > 0 && --left == 0) _cv.notify_all();
  }

 private:
  std::mutex _m;
  std::condition_variable _cv;
  std::uint32_t left;
};

/// One shard's part of an order: done when it is destroyed.
class revoke_share {
 public:
  revoke_share() noexcept = default;
  explicit revoke_share(std::shared_ptr<revoke_order> o) noexcept : _o(std::move(o)) {}
  revoke_share(revoke_share&&) noexcept = default;
  revoke_share& operator=(revoke_share&& other) noexcept {
    if (this != &other) {
      if (_o) _o->share_done();
      _o = std::move(other._o);
    }
    return *this;
  }
  ~revoke_share() {
    if (_o) _o->share_done();
  }
  revoke_order* order() const noexcept { return _o.get(); }

 private:
  std::shared_ptr<revoke_order> _o;
};

}  // namespace wspush::server::pubsub
