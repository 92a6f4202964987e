#pragma once
/// \file broadcast_app.hpp
/// broadcast: every text message to every connection of every shard, the sender included
/// (a benchmark mode, the protocol the peers in tests/bench/peers speak). It delivers through
/// the same path as a publish: the hub hands the framed message to every shard's fanout, which
/// sends it to the subscribers of one topic that every connection holds.

#include "server/conn/app.hpp"
#include "server/pubsub/fanout.hpp"
#include "server/pubsub/hub.hpp"

namespace wspush::server::pubsub {

class broadcast_app final : public application {
 public:
  /// The topic every connection holds: `*` is no valid topic, so no client can name it.
  static constexpr std::string_view everyone = "*";

  broadcast_app(hub& h, fanout& f) noexcept : _hub(h), _fanout(f) {}
  void bind(conn_ops& ops) noexcept override {
    _ops = &ops;
    _fanout.bind(ops);
  }
  bool on_open(conn_id c, const open_info&) noexcept override;
  void on_message(conn_id c, message& m) noexcept override;
  void on_close(conn_id c) noexcept override;

 private:
  hub& _hub;
  fanout& _fanout;
  conn_ops* _ops = nullptr;
};

}  // namespace wspush::server::pubsub
