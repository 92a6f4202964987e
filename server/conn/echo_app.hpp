#pragma once
// echo: every message goes back to its sender, same opcode (a benchmark and conformance mode).

#include "server/conn/app.hpp"
#include "server/conn/compression.hpp"

namespace wspush::server {

class echo_app final : public application {
 public:
  /// With `z`, a message of at least its min_bytes goes back compressed to a sender that
  /// negotiated permessage-deflate (compressed for each message: echo has nothing to share;
  /// not at all for a sender that did not negotiate).
  explicit echo_app(compression* z = nullptr) noexcept : _compression(z) {}
  void bind(conn_ops& ops) noexcept override { _ops = &ops; }
  bool on_open(conn_id, const open_info&) noexcept override { return true; }
  void on_message(conn_id c, message& m) noexcept override;
  void on_close(conn_id) noexcept override {}

 private:
  conn_ops* _ops = nullptr;
  compression* _compression;
};

}  // namespace wspush::server
