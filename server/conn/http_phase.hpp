#pragma once
// The upgrade phase: from the first byte of a connection to the 101 (or an HTTP error and a
// close). The loop gathers the request and parses it (cheap, and it must know where the request
// ends); a complete upgrade goes to a worker for the costly part and comes back; then the
// connection is handed to the WebSocket phase with any bytes that came behind the request.
// When no worker has room the shard stops accepting until one has, as the Go design this
// descends from did: new connections wait in the kernel's backlog, not in our memory.

#include <cstdint>
#include <span>
#include <string_view>

#include "server/conn/connection.hpp"

namespace wspush::server {

class connections;
class static_site;
struct static_file;
class upgrade_runner;
class ws_phase;

class http_phase {
 public:
  http_phase(connections& c, ws_phase& ws) noexcept;
  void set_runner(upgrade_runner& r) noexcept { _runner = &r; }
  /// The files plain GETs are answered from (none: every path but the WebSocket one is 404).
  void set_site(const static_site& s) noexcept { _site = &s; }

  /// Request bytes for a connection in `upgrading`.
  void on_bytes(std::uint32_t slot, std::span<const std::uint8_t> bytes) noexcept;
  /// Bytes for a connection whose request is with a worker: kept (bounded) until it is back.
  void on_early_bytes(std::uint32_t slot, std::span<const std::uint8_t> bytes) noexcept;
  /// A worker finished a job.
  void on_upgraded(upgrade_job_ref&& job) noexcept;
  /// Once per loop iteration: jobs no worker had room for get another try.
  void retry() noexcept;
  /// Bytes kept from a client whose request is with a worker. Reading stops when the request
  /// goes to the worker; what still arrives was already on its way (with io_uring, completions
  /// of the receive buffer ring queued before the stop took effect: 4 MiB at most).
  static constexpr std::uint32_t max_early_bytes = 4u << 20;
  /// Answers with an HTTP status and closes (after the answer is out and the peer is done).
  void answer(std::uint32_t slot, std::uint16_t status, std::string_view body,
              std::string_view extra_headers = {}, std::string_view content_type = "text/plain") noexcept;

 private:
  std::uint8_t negotiate(const proto::upgrade_request& req) noexcept;  // upgrade_job::deflate
  void open_stream(std::uint32_t slot, const proto::upgrade_request& req, std::uint32_t consumed) noexcept;
  void start_stream(std::uint32_t slot, const upgrade_job_ref& job, pool::lease&& response) noexcept;
  void dispatch(std::uint32_t slot) noexcept;
  void serve(std::uint32_t slot, const struct static_file& f, std::string_view method,
             std::string_view if_none_match) noexcept;
  void count_refusal(std::uint16_t status) noexcept;
  void log_refusal(std::uint16_t status, std::string_view why) noexcept;
  bool over_rate(std::uint32_t slot) noexcept;
  void respond(std::uint32_t slot, std::uint16_t status, std::string_view body, std::string_view extra_headers,
               std::string_view content_type) noexcept;

  connections& _c;
  ws_phase& _ws;
  upgrade_runner* _runner = nullptr;
  const static_site* _site = nullptr;
  bool _held_back = false;  // the runner holds jobs back: accepting stays paused
  std::uint64_t _rand;      // Retry-After's jitter
};

}  // namespace wspush::server
