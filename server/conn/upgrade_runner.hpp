#pragma once
// The costly half of an upgrade (the token's signature, the accept key's SHA-1) runs off the
// loop, on the task pool; the job block goes to a worker and comes back through the loop's
// inbox. The http phase sees only this interface, so its tests run jobs inline.

#include <atomic>
#include <cstdint>
#include <vector>

#include "pool/task_pool.hpp"
#include "proto/jwt.hpp"
#include "server/base/revocation_list.hpp"
#include "server/conn/connection.hpp"
#include "server/reactor/inbox.hpp"

namespace wspush::server {

class upgrade_runner {
 public:
  virtual ~upgrade_runner() = default;
  /// Starts `job` on a worker; it comes back to the consumer given at construction. When no
  /// worker has room the runner holds the job back and returns false: the shard should stop
  /// accepting until retry() says everything held has started.
  virtual bool run(upgrade_job_ref&& job) noexcept = 0;
  /// Tries the held-back jobs again, oldest first; false while some remain.
  virtual bool retry() noexcept = 0;
};

/// The worker's part, on its own (tests call it inline): checks the token (none when `tokens`
/// is null) and writes the 101 response; sets job->status.
/// With `users`, the token's `sub` is counted there (429 past --max-connections-per-user).
/// With `revoked`, a token of a user revoked since it was issued is refused 401 (job->revoked).
void finish_upgrade(const proto::jwt_verifier* tokens, upgrade_job_ref& job, user_table* users = nullptr,
                    const revocation_list* revoked = nullptr) noexcept;

/// The real runner: jobs on the task pool, back through an inbox of the shard's loop.
class pool_upgrade_runner final : public upgrade_runner {
 public:
  /// All must outlive the runner. The inbox holds as many jobs as can be out at once (the pool's
  /// queue and workers), so a worker's post back never finds it full.
  pool_upgrade_runner(loop& l, pool::task_pool& tasks, const proto::jwt_verifier* tokens,
                      inbox_consumer<upgrade_job_ref>& done, user_table* users = nullptr);
  bool run(upgrade_job_ref&& job) noexcept override;
  bool retry() noexcept override;
  /// Start-up: the revoked users (POST /disconnect), whose older tokens are refused.
  void set_revocations(const revocation_list* r) noexcept { _revoked = r; }

 private:
  pool::task_pool& _tasks;
  const proto::jwt_verifier* _tokens;
  user_table* _users;
  const revocation_list* _revoked = nullptr;
  inbox<upgrade_job_ref> _done;
  std::vector<pool::task_pool::task> _held;  // jobs no worker had room for, oldest first
};

}  // namespace wspush::server
