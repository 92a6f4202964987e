#pragma once
/// \file session.hpp
/// The pub/sub protocol of one shard (DESIGN.md "Wire protocol"), as the application its
/// connections run: client messages (sub, unsub, pub) parsed where they lie and answered in
/// order; resume from the history with an exact seam; what each connection's token granted,
/// and its expiry. Events reach the subscribers through the shard's fanout.

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "pool/shared_frame.hpp"
#include "proto/envelope.hpp"
#include "proto/jwt.hpp"
#include "proto/topic.hpp"
#include "server/base/options.hpp"
#include "server/conn/app.hpp"
#include "server/pubsub/fanout.hpp"
#include "server/pubsub/hub.hpp"
#include "server/pubsub/session_table.hpp"

namespace wspush::server::pubsub {

class session final : public application {
 public:
  /// `tokens`: connections carry token grants, refreshed in-band with `auth` (null with
  /// --auth=none: everyone may subscribe to anything). `expire_history`: this shard sweeps the
  /// history's TTL (one shard does). `tokens` must outlive the session.
  session(const session_options& o, const proto::jwt_verifier* tokens, hub& h, fanout& f,
          std::uint32_t max_message_bytes, bool expire_history);
  ~session() override;

  void bind(conn_ops& ops) noexcept override;
  bool on_open(conn_id c, const open_info& info) noexcept override;
  void on_message(conn_id c, message& m) noexcept override;
  void on_close(conn_id c) noexcept override;
  std::uint32_t expiry(conn_id c) const noexcept override { return _tokens ? _sessions.get(c).exp : 0; }
  void on_expired(conn_id c) noexcept override;
  void on_tick(std::uint32_t tick) noexcept override;

 private:
  void client_sub(conn_id c) noexcept;
  void client_unsub(conn_id c) noexcept;
  void client_pub(conn_id c) noexcept;
  void client_auth(conn_id c) noexcept;
  void client_error(conn_id c, proto::client_error e, std::string_view topic) noexcept;
  template <class Encode>
  bool reply(conn_id c, std::size_t bound, Encode&& encode) noexcept;
  std::uint32_t replay_since(std::uint32_t added, std::string_view* lost) noexcept;
  proto::grants_view grants_of(conn_id c, bool pub) const noexcept;

  const session_options& _o;
  const proto::jwt_verifier* const _tokens;
  const bool _expire_history;
  hub& _hub;
  fanout& _fanout;
  conn_ops* _ops = nullptr;
  session_table _sessions;
  proto::envelope_parser _parser;
  std::unique_ptr<proto::envelope> _env;
  std::vector<pool::frame_ref> _replay;  // scratch: a sub's replayed events
  std::string _names;                    // scratch: topic names an auth removes (the registry forgets them)
  std::vector<std::string_view> _gone;   // scratch: views into _names
};

}  // namespace wspush::server::pubsub
