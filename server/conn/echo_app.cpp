#include "server/conn/echo_app.hpp"

namespace wspush::server {

void echo_app::on_message(conn_id c, message& m) noexcept {
  pool::frame_ref f = frame_message(_ops->buffers(), m);
  if (!f) return _ops->close(c, proto::close_code::internal_error);
  if (_compression && _ops->compresses(c)) _compression->attach(_ops->buffers(), f);
  _ops->send(c, std::move(f));
}

}  // namespace wspush::server
