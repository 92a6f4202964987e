#include "server/net/transport_tcp.hpp"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

namespace wspush::server {

bool tcp_transport::open(int fd, conn_token t) noexcept {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return _io.start_reading(fd, t);
}

void tcp_transport::shutdown_write(int fd, conn_token) noexcept { ::shutdown(fd, SHUT_WR); }

void tcp_transport::close(int fd, conn_token t, bool abort) noexcept {
  if (abort) {
    // Linger 0: close sends a reset and frees the socket with whatever it still held.
    linger l{1, 0};
    setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof l);
  }
  _io.close(fd, t);
}

}  // namespace wspush::server
