#pragma once
// echo: every message goes back to its sender, same opcode (a benchmark and conformance mode).

#include "server/conn/app.hpp"

namespace wspush::server {

class echo_app final : public application {
 public:
  void bind(conn_ops& ops) noexcept override { _ops = &ops; }
  bool on_open(conn_id, const open_info&) noexcept override { return true; }
  void on_message(conn_id c, message& m) noexcept override;
  void on_close(conn_id) noexcept override {}

 private:
  conn_ops* _ops = nullptr;
};

}  // namespace wspush::server
