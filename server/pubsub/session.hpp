#pragma once
/// \file session.hpp
/// The pub/sub protocol of one shard (DESIGN.md "Wire protocol"), as the application its
/// connections run: client messages (sub, unsub, pub) parsed where they lie and answered in
/// order; resume from the history with an exact seam; what each connection's token granted,
/// and its expiry. Events reach the subscribers through the shard's fanout.

#include <atomic>
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
#include "server/base/revocation_list.hpp"
#include "server/base/user_table.hpp"
#include "server/conn/app.hpp"
#include <unordered_map>

#include "server/pubsub/bus_port.hpp"
#include "server/pubsub/fanout.hpp"
#include "server/pubsub/hub.hpp"
#include "server/pubsub/namespaces.hpp"
#include "server/pubsub/presence.hpp"
#include "server/pubsub/session_table.hpp"

namespace wspush::server::pubsub {

class session final : public application, private bus_reply_handler {
 public:
  /// `tokens`: connections carry token grants, refreshed in-band with `auth` (null with
  /// --auth=none: everyone may subscribe to anything). `expire_history`: this shard sweeps the
  /// history's TTL (one shard does). `tokens` must outlive the session.
  session(const session_options& o, const proto::jwt_verifier* tokens, hub& h, fanout& f,
          std::uint32_t max_message_bytes, bool expire_history, user_table* users = nullptr);
  /// With a bus outside the process (Redis): subs, pubs and history go through it, and this
  /// shard (number `shard`) holds in it the topics its connections want (bus_port.hpp). A long
  /// replay is sent while a connection has less than half of `max_pending_bytes` unsent.
  void use_bus(bus_port& bus, std::uint32_t shard, std::uint64_t max_pending_bytes) noexcept;
  /// Presence and join/leave where the topic's namespace keeps them (the hub's namespaces):
  /// this shard's subscribes and unsubscribes of such topics are counted in `table`
  /// (process-wide), and the `presence` ops read it. It must outlive the session.
  void use_presence(presence_table& table) noexcept { _presence = &table; }
  /// The users revoked lately: an in-band `auth` with a token they revoked is refused.
  void use_revocations(const revocation_list* r) noexcept { _revoked = r; }
  /// --client-message-rate and --client-message-burst (0: no limit): at construction, and again
  /// from any thread on SIGHUP; each connection's next message keeps to the new ones.
  void set_client_message_rate(double per_second, std::uint32_t burst) noexcept;
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
  void client_presence(conn_id c) noexcept;
  /// `c` subscribed to `topic` (joined) or left it: counted in presence where its namespace
  /// keeps it, and a user's first or last connection announced where it asks for join/leave.
  void present(conn_id c, std::string_view topic, bool joined) noexcept;
  void announce(bool join, std::string_view topic, std::uint32_t user) noexcept;
  void send_presence(conn_id c, bool list, std::string_view topic, std::uint64_t user_count,
                     std::uint64_t connections) noexcept;
  void presence_answered(bus_reply& r) noexcept;
  /// `of`: the op it answers when the client cannot tell otherwise ("pub": see encode_error).
  void client_error(conn_id c, proto::client_error e, std::string_view topic, std::string_view of = {}) noexcept;
  template <class Encode>
  bool reply(conn_id c, std::size_t bound, Encode&& encode) noexcept;
  bool send_subbed(conn_id c, const bus_reply& r) noexcept;
  std::uint32_t replay_since(std::span<const std::string_view> topics, std::uint32_t added,
                             std::string_view* lost) noexcept;
  proto::grants_view grants_of(conn_id c, bool pub) const noexcept;
  // With a bus (Redis).
  void bus_sub(conn_id c) noexcept;
  void bus_pub(conn_id c) noexcept;
  void on_bus_reply(std::unique_ptr<bus_reply> r) noexcept override;
  bool holds(std::string_view topic) const noexcept;
  void release_if_unheld(std::string_view topic) noexcept;
  void unsubscribe_all(conn_id c) noexcept;
  void wait_for(const std::string& topic);
  void stop_waiting_for(const std::string& topic) noexcept;
  void pub_answered(std::uint64_t tag, proto::client_error failed, std::string_view topic) noexcept;
  struct waiting_sub;
  void pace(std::uint64_t request, waiting_sub& w) noexcept;
  std::uint64_t room(conn_id c) const noexcept;
  bool within_rate(conn_id c) noexcept;
  void revoke(revoke_order& o) noexcept;

  const session_options& _o;
  const proto::jwt_verifier* const _tokens;
  user_table* const _users;  // with tokens: each connection's user, left at its close
  const revocation_list* _revoked = nullptr;
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
  presence_table* _presence = nullptr;
  presence_table::reading _reading;      // scratch: a presence op's answer
  std::vector<proto::presence_user> _listed;
  std::string _presence_names;           // scratch: the names _listed points into
  // With a bus: the presence op each connection waits for (at most one: it is held meanwhile).
  std::unordered_map<conn_id, std::uint64_t> _presence_asks;
  // With a bus: the subs it has not answered yet, and per topic how many of them want it.
  struct waiting_sub {
    conn_id conn = 0;
    bool closed = false;                // the connection went away meanwhile
    std::vector<std::string> counted;   // topics it added to _waiting_topics
    // A replay paced by the client's reads (bus_reply::more): `subbed` went out, the
    // connection is held and joins its topics at replay_done. The page received and not all
    // sent yet, and whether the next one was asked (bus_port::more).
    bool paced = false, asked = false;
    std::vector<pool::frame_ref> page;
    std::size_t page_sent = 0;
  };
  bus_port* _bus = nullptr;
  std::uint32_t _shard = 0;
  std::uint64_t _next_request = 1;
  std::uint64_t _pending_bound = 0;  // --max-pending-bytes
  std::uint32_t _paced = 0;          // waiting subs that are paced (on_tick looks at them)
  std::unordered_map<std::uint64_t, waiting_sub> _waiting_subs;
  // The sub each open connection waits for (at most one: the connection is held meanwhile),
  // so that a close finds it without a scan (many wait while Redis is away).
  std::unordered_map<conn_id, std::uint64_t> _waiting_of;
  std::unordered_map<std::string, std::uint32_t> _waiting_topics;
  // With a bus: per connection with pubs Redis has not answered, how many. At
  // max_pubs_in_flight the connection is held (read no further) until one is answered. A pub's
  // tag is its connection and this entry's number, so that an answer finds no one once the
  // connection has closed, even if its slot is taken again.
  struct pub_flow {
    std::uint32_t number = 0;
    std::uint16_t in_flight = 0;
    bool held = false;
  };
  std::unordered_map<conn_id, pub_flow> _pubs;
  std::uint32_t _next_flow = 1;
  // --client-message-rate, per slot: when the connection's next message is due at its rate
  // (the generic cell rate algorithm, in microseconds of the monotonic clock: 48 bits) and how
  // many it sent past the rate since it last kept to it (16 bits). Only with the option; a slot
  // is reset on each open once the vector holds it.
  std::vector<std::uint64_t> _rate;
  bool rate_slot(conn_id c) noexcept;
  std::atomic<std::uint64_t> _rate_interval_us{0}, _rate_tolerance_us{0};  // set_client_message_rate
};

}  // namespace wspush::server::pubsub
