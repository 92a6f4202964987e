#pragma once
// What a shard's connection layer counts, for the log and /metrics (docs/METRICS.md).

#include "server/base/counter.hpp"
#include "server/conn/connection.hpp"

namespace wspush::server {

struct conn_counters {
  relaxed_counter accepted, messages_in, messages_out, bytes_in, bytes_out;
  relaxed_counter sends;  // socket writes (sendmsg calls, io_uring send requests)
  relaxed_counter slow_consumer_closes, timeouts, protocol_errors;
  relaxed_counter held_input_bytes;  // read from held connections and kept (ws_phase::keep)
  relaxed_counter messages_in_compressed;  // permessage-deflate messages inflated
  // upgrades by result
  relaxed_counter upgrades_ok, upgrades_bad_request, upgrades_unauthorized, upgrades_over_capacity,
      upgrades_timeout, upgrades_error, upgrades_rate_limited, upgrades_user_limit, upgrades_revoked;
  relaxed_counter in_state[conn_state_count];  // connections by state (free is not counted)
  relaxed_counter streams_opened, streams_open;  // event streams (sse_phase): total, and now open
  relaxed_counter lifetime_closes;  // closed 1001 at --max-connection-lifetime
};

}  // namespace wspush::server
