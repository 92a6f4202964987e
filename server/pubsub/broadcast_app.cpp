#include "server/pubsub/broadcast_app.hpp"

namespace wspush::server::pubsub {

bool broadcast_app::on_open(conn_id c, const open_info&) noexcept {
  bool ok = _fanout.registry().subscribe(c, everyone) == sub_result::added;
  _fanout.count_subscriptions();
  return ok;
}

void broadcast_app::on_close(conn_id c) noexcept {
  _fanout.registry().unsubscribe_all(c);
  _fanout.count_subscriptions();
}

void broadcast_app::on_message(conn_id c, message& m) noexcept {
  if (m.op != proto::opcode::text) return;  // binary is ignored
  pool::frame_ref f = frame_message(_ops->buffers(), m);
  if (!f) return _ops->close(c, proto::close_code::internal_error);
  // A shard never waits on a sibling's crowded inbox (two waiting on each other would wait
  // forever): the sender is told to come back later.
  if (_hub.relay(std::move(f), everyone) != publish_status::ok)
    _ops->close(c, proto::close_code::try_again_later);
}

}  // namespace wspush::server::pubsub
