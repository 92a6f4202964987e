// The worker's half of an upgrade: the token check and the 101 response. It touches nothing
// but the job block, which then goes back to the shard that owns the connection.

#include "server/conn/upgrade_runner.hpp"

#include <cstring>
#include <ctime>

#include "proto/ws_deflate.hpp"
#include "proto/ws_handshake.hpp"

namespace wspush::server {
namespace {

std::string_view text_of(upgrade_job_ref& job, std::uint32_t at, std::uint32_t len) noexcept {
  return {reinterpret_cast<const char*>(job.tail()) + at, len};
}

void refuse(upgrade_job& j, std::uint16_t status, std::string_view reason) noexcept {
  j.status = status;
  j.reason = reason.data();  // static text
  j.reason_len = std::uint32_t(reason.size());
}

/// A valid, unexpired HS256 token from the query or the cookie, whose grants and expiry are
/// appended to the job (the block may move). False with the job's status set when refused.
bool check_token(const proto::jwt_verifier& tokens, upgrade_job_ref& job, user_table* users,
                 const revocation_list* revoked) noexcept {
  std::string_view token = text_of(job, job->token_at, job->token_len);
  if (token.empty()) return refuse(*job, 401, "missing token (?token= or cookie wspush_token)"), false;
  char storage[proto::jwt_claims_storage_bytes];
  proto::jwt_claims claims;
  const auto now = std::int64_t(std::time(nullptr));
  auto r = tokens.verify(token, now, storage, claims);
  if (!r.ok()) return refuse(*job, 401, r.message), false;
  if (revoked && revoked->revoked(claims.sub, claims.iat, now)) {
    job->revoked = true;  // counted apart from other bad tokens
    return refuse(*job, 401, "token revoked"), false;
  }
  if (users) {
    if (!users->join(claims.sub, job->user))
      return refuse(*job, 429, "this user has as many connections open as this node allows\n"), false;
    job->users = users;  // from here on the job leaves the user if it goes no further
  }
  std::string_view topics = claims.topics.bytes(), pub = claims.pub.bytes();
  if (!job.reserve_tail(job->len, job->len + topics.size() + pub.size())) return refuse(*job, 500, "internal error\n"), false;
  std::uint8_t* at = job.tail() + job->len;
  if (!topics.empty()) std::memcpy(at, topics.data(), topics.size());
  if (!pub.empty()) std::memcpy(at + topics.size(), pub.data(), pub.size());
  job->grants_at = job->len;
  job->topics_len = std::uint32_t(topics.size());
  job->pub_len = std::uint32_t(pub.size());
  job->exp = claims.exp;
  job->iat = claims.iat;
  return true;
}

/// An event stream's topics are all granted (checked here, where the grants are read, so a
/// refusal is an HTTP status, not an event), and its 200 head.
void finish_stream(upgrade_job_ref& job, bool checked) noexcept {
  upgrade_job& j = *job;
  if (checked) {
    const proto::grants_view granted(text_of(job, j.grants_at, j.topics_len));
    std::string_view list = text_of(job, j.sse_at, j.sse_topics_len);
    for (std::size_t k = 0; k < j.sse_topic_count; ++k) {
      const std::size_t lf = list.find('\n');
      if (!proto::grants_match(granted, list.substr(0, lf)))
        return refuse(j, 403, "the token does not grant every topic of this stream\n");
      list.remove_prefix(lf + 1);
    }
  }
  constexpr std::string_view head =
      "HTTP/1.1 200 OK\r\n"
      "Content-Type: text/event-stream\r\n"
      "Cache-Control: no-store\r\n"
      "X-Accel-Buffering: no\r\n"  // nginx: pass each event on at once
      "\r\n";
  static_assert(head.size() <= sizeof j.response);
  std::memcpy(j.response, head.data(), head.size());
  j.response_len = std::uint32_t(head.size());
  j.status = 101;  // "go on": the stream opens
}

}  // namespace

void finish_upgrade(const proto::jwt_verifier* tokens, upgrade_job_ref& job, user_table* users,
                    const revocation_list* revoked) noexcept {
  if (tokens && !check_token(*tokens, job, users, revoked)) return;
  if (job->sse) return finish_stream(job, tokens != nullptr);
  upgrade_job& j = *job;
  std::size_t n = proto::encode_switching_protocols(text_of(job, j.key_at, j.key_len),
                                                    {reinterpret_cast<char*>(j.response), sizeof j.response},
                                                    j.deflate == 2   ? proto::deflate_response_window
                                                    : j.deflate == 1 ? proto::deflate_response
                                                                     : std::string_view{});
  if (n == 0) return refuse(j, 500, "internal error\n");
  j.response_len = std::uint32_t(n);
  j.status = 101;
}

pool_upgrade_runner::pool_upgrade_runner(loop& l, pool::task_pool& tasks, const proto::jwt_verifier* tokens,
                                         inbox_consumer<upgrade_job_ref>& done, user_table* users)
    : _tasks(tasks),
      _tokens(tokens),
      _users(users),
      _done(l, tasks.options().queue_capacity + tasks.options().max_workers + 64, done) {}

bool pool_upgrade_runner::run(upgrade_job_ref&& job) noexcept {
  struct work {
    pool_upgrade_runner* self;
    upgrade_job_ref job;
    void operator()() noexcept {
      finish_upgrade(self->_tokens, job, self->_users, self->_revoked);
      // The inbox has room for every job that can be out; it refuses only once the loop has
      // stopped, and then the connection is gone anyway (the job is dropped with the task).
      [[maybe_unused]] bool posted = self->_done.post(std::move(job));
    }
  };
  pool::task_pool::task t(work{this, std::move(job)});
  if (_held.empty() && _tasks.try_schedule_from(t)) return true;
  _held.push_back(std::move(t));  // grows once to the most ever held back, then reuses
  return false;
}

bool pool_upgrade_runner::retry() noexcept {
  std::size_t k = 0;
  while (k < _held.size() && _tasks.try_schedule_from(_held[k])) ++k;
  _held.erase(_held.begin(), _held.begin() + std::ptrdiff_t(k));
  return _held.empty();
}

}  // namespace wspush::server
