/* countclient: a minimal, neutral WebSocket fan-out counter.
 *
 *   countclient --port P --connections N --messages M --size S --procs K
 *               [--server-pid PID] [--path /ws] [--timeout 120] [--tls] [--hold SECONDS]
 *
 * K forked processes open N receiver connections to 127.0.0.1:P (source
 * addresses 127.0.0.2..127.0.0.250, bound before connect), upgrade them, and
 * report "up" through a pipe.  The parent then opens one publisher connection
 * and writes M masked text frames of S bytes in a few big writes.  The server
 * is expected to broadcast every text message to every client (publisher
 * included).  Receivers only read, find frame boundaries and count text
 * frames.  The parent reports the time from just before the first publish
 * write to the last delivery (N*M frames at the receivers; the publisher's M
 * echoes are read but not counted), and the server's CPU time over the same
 * interval (/proc/PID/stat utime+stime, clock ticks, and the sum of
 * /proc/PID/task/x/schedstat run time in ns).
 *
 * --tls connects every connection (the publisher too) with TLS: OpenSSL, a
 * non-blocking SSL_connect driven by epoll, ALPN "http/1.1" offered, then the
 * same upgrade, reads and counting over SSL_read/SSL_write.  It loads no CA
 * and verifies nothing: a benchmark client on loopback, never for real use.
 * Without --tls no SSL object exists and the plain path is what it was.
 *
 * --hold SECONDS: with --server-pid, the server's VmRSS (/proc/PID/status) is
 * read before connecting and once all connections are up, and the delta per
 * connection printed ("server RSS delta per connection: N B"); the
 * connections are then held open SECONDS (the delta printed again after),
 * and only then is the burst published -- none with --messages 0.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common.h"

static int g_port, g_conns, g_msgs, g_size = 64, g_procs = 1, g_server_pid, g_timeout = 120;
static double g_linger = 0, g_gap = 0.5;
static int g_bursts = 1;
static const char *g_path = "/ws";
static int g_tls;           /* --tls */
static double g_hold = -1;  /* --hold SECONDS */
static SSL_CTX *g_ctx;      /* only with --tls */
static SSL **g_ssl;         /* per receiver connection, only with --tls */
static SSL *g_pub_ssl;      /* the publisher's, only with --tls */
static const char *KEY = "dGhlIHNhbXBsZSBub25jZQ==";

static void die(const char *msg) {
  fprintf(stderr, "countclient: %s\n", msg);
  exit(2);
}

/* Messages from a child to the parent. */
enum { R_READY = 1, R_FAIL, R_DONE, R_PARTIAL };
struct report {
  int type;
  int up;           /* connections up */
  long long count;  /* text frames counted */
  double last;      /* CLOCK_MONOTONIC of the last counted frame */
  char msg[96];
};

/* ------------------------------------------------------------------ receiver */

enum { S_CONNECTING, S_SENDING, S_RESPONSE, S_UP, S_DEAD, S_HANDSHAKE };
struct rconn {
  int fd;
  unsigned char state;
  unsigned short sent;    /* request bytes sent / response bytes matched */
  struct frames fr;       /* in the upgrade, fr.hlen counts the status line's bytes matched */
};

static char g_req[512];
static int g_reqlen;

/* ----------------------------------------------------------------------- TLS */

static void tls_init(void) {
  g_ctx = SSL_CTX_new(TLS_client_method());
  if (!g_ctx) die("SSL_CTX_new failed");
  /* A benchmark client on loopback: no CA loaded, the server's certificate is not verified. */
  SSL_CTX_set_verify(g_ctx, SSL_VERIFY_NONE, NULL);
  static const unsigned char alpn[] = "\x08http/1.1";
  SSL_CTX_set_alpn_protos(g_ctx, alpn, sizeof alpn - 1);
  /* read ahead (fewer reads; what it buffers is drained with SSL_has_pending), buffers freed
     while idle (19,000 connections), SSL_write returns after each record */
  SSL_CTX_set_read_ahead(g_ctx, 1);
  SSL_CTX_set_mode(g_ctx, SSL_MODE_RELEASE_BUFFERS | SSL_MODE_ENABLE_PARTIAL_WRITE |
                              SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
}

static SSL *tls_new(int fd) {
  SSL *s = SSL_new(g_ctx);
  if (!s || !SSL_set_fd(s, fd)) die("SSL_new failed");
  SSL_set_connect_state(s);
  return s;
}

/* SSL_read/SSL_peek/SSL_write with recv/send's results: > 0 bytes, 0 closed, -1 with errno
   (EAGAIN: wants to read or write, EPROTO: a TLS error). */
static ssize_t tls_io(SSL *s, void *p, size_t n, int op) {
  errno = 0;
  int r = op == 0 ? SSL_read(s, p, (int)n) : op == 1 ? SSL_peek(s, p, (int)n) : SSL_write(s, p, (int)n);
  if (r > 0) return r;
  switch (SSL_get_error(s, r)) {
  case SSL_ERROR_WANT_READ:
  case SSL_ERROR_WANT_WRITE: errno = EAGAIN; return -1;
  case SSL_ERROR_ZERO_RETURN: return 0;
  case SSL_ERROR_SYSCALL: ERR_clear_error(); if (errno == 0) return 0; return -1;
  default: ERR_clear_error(); errno = EPROTO; return -1;
  }
}
#define tls_recv(s, p, n) tls_io(s, p, n, 0)
#define tls_peek(s, p, n) tls_io(s, p, n, 1)
#define tls_send(s, p, n) tls_io(s, (void *)(p), n, 2)

/* TLS: read what a connection has and count, also what OpenSSL already buffered (which
   epoll cannot see). */
static void tls_read_conn(int ep, struct rconn *c, SSL *s, unsigned char *buf, size_t size, long long *count,
                          double *last) {
  ssize_t r;
  do {
    r = tls_recv(s, buf, size);
    if (r > 0) {
      long long f = count_frames(&c->fr, buf, r);
      if (f) { *count += f; *last = now_s(); }
    } else if (r == 0 || (errno != EAGAIN && errno != EINTR)) {
      c->state = S_DEAD;
      epoll_ctl(ep, EPOLL_CTL_DEL, c->fd, NULL);
    }
  } while (r > 0 && SSL_has_pending(s));
}

static void child(int idx0, int n, int wfd, int rfd) {
  struct report rep;
  memset(&rep, 0, sizeof rep);
  struct rconn *cs = calloc(n, sizeof *cs);
  int ep = epoll_create1(EPOLL_CLOEXEC);
  if (!cs || ep < 0) die("out of memory / epoll");
  if (g_tls && !(g_ssl = calloc(n, sizeof *g_ssl))) die("out of memory");
  struct epoll_event ev = {.events = EPOLLIN, .data.u64 = (uint64_t)-1};
  epoll_ctl(ep, EPOLL_CTL_ADD, rfd, &ev); /* parent's command pipe: EOF = quit */

  static unsigned char buf[1 << 16];
  struct epoll_event evs[1024];
  int opened = 0, up = 0, inflight = 0, dead = 0;
  const int max_inflight = 512;
  double deadline = now_s() + g_timeout;
  const char *resp = "HTTP/1.1 101";
  long long count = 0;
  double last = 0;

  /* Phase 1: connect and upgrade, at most max_inflight at a time. */
  while (up + dead < n) {
    while (opened < n && inflight < max_inflight) {
      int fd = open_conn_from(idx0 + opened, g_port);
      struct rconn *c = &cs[opened];
      if (fd < 0) {
        snprintf(rep.msg, sizeof rep.msg, "socket/bind/connect #%d: %s", idx0 + opened, strerror(errno));
        goto fail;
      }
      c->fd = fd;
      c->state = S_CONNECTING;
      if (g_tls) g_ssl[opened] = tls_new(fd);
      ev.events = EPOLLOUT;
      ev.data.u64 = opened;
      epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev);
      opened++, inflight++;
    }
    if (now_s() > deadline) {
      snprintf(rep.msg, sizeof rep.msg, "timeout: %d of %d connections up after %d s", up, n, g_timeout);
      goto fail;
    }
    int k = epoll_wait(ep, evs, 1024, 200);
    for (int i = 0; i < k; i++) {
      if (evs[i].data.u64 == (uint64_t)-1) { snprintf(rep.msg, sizeof rep.msg, "parent quit"); goto fail; }
      struct rconn *c = &cs[evs[i].data.u64];
      SSL *s = g_tls ? g_ssl[evs[i].data.u64] : NULL;
      if (evs[i].events & (EPOLLERR | EPOLLHUP)) {
        int e = 0; socklen_t el = sizeof e;
        getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &e, &el);
        snprintf(rep.msg, sizeof rep.msg, "connection #%d failed: %s", idx0 + (int)evs[i].data.u64,
                 e ? strerror(e) : "hangup");
        goto fail;
      }
      if (c->state == S_CONNECTING) c->state = s ? S_HANDSHAKE : S_SENDING;
      if (c->state == S_HANDSHAKE) {
        int r = SSL_connect(s);
        if (r != 1) {
          int e = SSL_get_error(s, r);
          if (e != SSL_ERROR_WANT_READ && e != SSL_ERROR_WANT_WRITE) {
            const char *why = ERR_reason_error_string(ERR_get_error());
            snprintf(rep.msg, sizeof rep.msg, "TLS handshake #%d: %s", idx0 + (int)evs[i].data.u64,
                     why ? why : e == SSL_ERROR_SYSCALL && errno ? strerror(errno) : "closed by the server");
            goto fail;
          }
          ev.events = e == SSL_ERROR_WANT_READ ? EPOLLIN : EPOLLOUT;
          ev.data.u64 = evs[i].data.u64;
          epoll_ctl(ep, EPOLL_CTL_MOD, c->fd, &ev);
          continue;
        }
        c->state = S_SENDING;
      }
      if (c->state == S_SENDING) {
        ssize_t w = s ? tls_send(s, g_req + c->sent, g_reqlen - c->sent)
                      : send(c->fd, g_req + c->sent, g_reqlen - c->sent, MSG_NOSIGNAL);
        if (w < 0 && errno != EAGAIN) { snprintf(rep.msg, sizeof rep.msg, "send: %s", strerror(errno)); goto fail; }
        if (w > 0) c->sent += w;
        if (s && c->sent < g_reqlen) { /* wait until writable (after the handshake it may be EPOLLIN) */
          ev.events = EPOLLOUT;
          ev.data.u64 = evs[i].data.u64;
          epoll_ctl(ep, EPOLL_CTL_MOD, c->fd, &ev);
        }
        if (c->sent == g_reqlen) {
          c->state = S_RESPONSE;
          c->sent = 0;
          ev.events = EPOLLIN;
          ev.data.u64 = evs[i].data.u64;
          epoll_ctl(ep, EPOLL_CTL_MOD, c->fd, &ev);
        }
        continue;
      }
      /* TLS: OpenSSL may hold bytes epoll cannot see, hence the loop while it has some */
      while (c->state == S_RESPONSE) {
        /* read the response byte by byte up to the blank line, so no frame
           byte that might follow is taken (responses are small: ~130 B) */
        char b[256];
        ssize_t r = s ? tls_peek(s, b, sizeof b) : recv(c->fd, b, sizeof b, MSG_PEEK);
        if (r == 0) { snprintf(rep.msg, sizeof rep.msg, "server closed during upgrade"); goto fail; }
        if (r < 0 && errno == EPROTO) { snprintf(rep.msg, sizeof rep.msg, "TLS error during upgrade"); goto fail; }
        if (r < 0) break;
        int end = -1;
        /* c->sent tracks how many of "\r\n\r\n" matched; c->fr.hlen how many of "HTTP/1.1 101" */
        for (int j = 0; j < r; j++) {
          if (c->fr.hlen < 12) {
            if (b[j] != resp[c->fr.hlen]) { snprintf(rep.msg, sizeof rep.msg, "upgrade refused: %.60s", b); goto fail; }
            c->fr.hlen++;
          }
          char want = (c->sent % 2 == 0) ? '\r' : '\n';
          if (b[j] == want) c->sent++;
          else c->sent = (b[j] == '\r') ? 1 : 0;
          if (c->sent == 4) { end = j + 1; break; }
        }
        if (s) tls_recv(s, b, end > 0 ? end : r);
        else recv(c->fd, b, end > 0 ? end : r, 0);
        if (end > 0) {
          c->state = S_UP;
          c->fr.hlen = 0;
          c->sent = 0;
          up++, inflight--;
          if (s && SSL_has_pending(s)) tls_read_conn(ep, c, s, buf, sizeof buf, &count, &last);
        }
        if (!s || !SSL_has_pending(s)) break;
      }
    }
  }
  rep.type = R_READY;
  rep.up = up;
  if (write(wfd, &rep, sizeof rep) != sizeof rep) exit(3);

  /* Phase 2: count.  Until the parent closes the command pipe. */
  long long per_burst = (long long)n * g_msgs, want = per_burst;
  int reported = 0; /* only used for the partial report on quit */
  for (;;) {
    int k = epoll_wait(ep, evs, 1024, 1000);
    for (int i = 0; i < k; i++) {
      if (evs[i].data.u64 == (uint64_t)-1) {
        if (!reported && count < want) {
          rep.type = R_PARTIAL, rep.count = count, rep.last = last;
          if (write(wfd, &rep, sizeof rep) < 0) {}
        }
        _exit(0);
      }
      struct rconn *c = &cs[evs[i].data.u64];
      if (c->state != S_UP) continue;
      if (g_tls) { tls_read_conn(ep, c, g_ssl[evs[i].data.u64], buf, sizeof buf, &count, &last); continue; }
      ssize_t r = recv(c->fd, buf, sizeof buf, 0);
      if (r > 0) {
        long long f = count_frames(&c->fr, buf, r);
        if (f) { count += f; last = now_s(); }
      } else if (r == 0 || (errno != EAGAIN && errno != EINTR)) {
        c->state = S_DEAD;
        epoll_ctl(ep, EPOLL_CTL_DEL, c->fd, NULL);
      }
    }
    while (per_burst && count >= want) { /* one report per burst, cumulative count */
      rep.type = R_DONE, rep.count = want, rep.last = last;
      if (write(wfd, &rep, sizeof rep) < 0) {}
      want += per_burst;
    }
  }
fail:
  rep.type = R_FAIL;
  rep.up = up;
  if (write(wfd, &rep, sizeof rep) < 0) {}
  _exit(1);
}

/* ------------------------------------------------------------------ parent */

/* The server's VmRSS in kB, -1 if unknown. */
static long read_rss_kb(void) {
  char p[64], line[256];
  long kb = -1;
  snprintf(p, sizeof p, "/proc/%d/status", g_server_pid);
  FILE *f = g_server_pid ? fopen(p, "r") : NULL;
  if (!f) return -1;
  while (fgets(line, sizeof line, f))
    if (sscanf(line, "VmRSS: %ld kB", &kb) == 1) break;
  fclose(f);
  return kb;
}

/* Publisher reads: the socket's bytes, with TLS also what OpenSSL already buffered. */
static ssize_t pub_recv(int fd, struct rconn *pc, unsigned char *buf, size_t size, long long *echoes) {
  ssize_t r;
  do {
    r = g_pub_ssl ? tls_recv(g_pub_ssl, buf, size) : recv(fd, buf, size, 0);
    if (r > 0) *echoes += count_frames(&pc->fr, buf, r);
  } while (r > 0 && g_pub_ssl && SSL_has_pending(g_pub_ssl));
  return r;
}

static int connect_publisher(double deadline) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, IPPROTO_TCP);
  struct sockaddr_in src = {.sin_family = AF_INET};
  src.sin_addr.s_addr = htonl((127u << 24) | 251u);
  int one = 1;
  setsockopt(fd, IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, &one, sizeof one);
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  if (bind(fd, (struct sockaddr *)&src, sizeof src) < 0) die("publisher bind");
  struct sockaddr_in dst = {.sin_family = AF_INET, .sin_port = htons(g_port)};
  dst.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  struct timeval tv = {5, 0};
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  if (connect(fd, (struct sockaddr *)&dst, sizeof dst) < 0) die("publisher connect failed");
  if (g_tls) { /* blocking, bounded by the socket timeouts */
    g_pub_ssl = tls_new(fd);
    if (SSL_connect(g_pub_ssl) != 1) die("publisher: TLS handshake failed");
    if (SSL_write(g_pub_ssl, g_req, g_reqlen) != g_reqlen) die("publisher: request write failed");
  } else if (write(fd, g_req, g_reqlen) != g_reqlen) die("publisher: request write failed");
  /* read byte by byte up to the blank line */
  char b[1024];
  int n = 0;
  while (n < (int)sizeof b - 1) {
    if (now_s() > deadline) die("publisher: upgrade timed out");
    ssize_t r = g_pub_ssl ? SSL_read(g_pub_ssl, b + n, 1) : read(fd, b + n, 1);
    if (r <= 0) die("publisher: upgrade failed (closed or timed out)");
    n++;
    if (n >= 4 && memcmp(b + n - 4, "\r\n\r\n", 4) == 0) break;
  }
  b[n] = 0;
  if (strncmp(b, "HTTP/1.1 101", 12) != 0) {
    fprintf(stderr, "countclient: publisher upgrade refused: %.80s\n", b);
    exit(2);
  }
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
  return fd;
}

static void usage(void) {
  fprintf(stderr,
          "usage: countclient --port P --connections N --messages M --size S --procs K\n"
          "                   [--server-pid PID] [--path /ws] [--timeout SECONDS] [--linger SECONDS]\n"
          "                   [--bursts B] [--gap SECONDS] [--tls] [--hold SECONDS]\n");
  exit(2);
}

int main(int argc, char **argv) {
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "--tls")) { g_tls = 1; continue; }
    if (i + 1 >= argc) usage();
    const char *v = argv[++i];
    if (!strcmp(a, "--port")) g_port = atoi(v);
    else if (!strcmp(a, "--connections")) g_conns = atoi(v);
    else if (!strcmp(a, "--messages")) g_msgs = atoi(v);
    else if (!strcmp(a, "--size")) g_size = atoi(v);
    else if (!strcmp(a, "--procs")) g_procs = atoi(v);
    else if (!strcmp(a, "--server-pid")) g_server_pid = atoi(v);
    else if (!strcmp(a, "--path")) g_path = v;
    else if (!strcmp(a, "--timeout")) g_timeout = atoi(v);
    else if (!strcmp(a, "--linger")) g_linger = atof(v);
    else if (!strcmp(a, "--bursts")) g_bursts = atoi(v);
    else if (!strcmp(a, "--gap")) g_gap = atof(v);
    else if (!strcmp(a, "--hold")) g_hold = atof(v);
    else usage();
  }
  if (g_port <= 0 || g_conns <= 0 || g_msgs < 0 || g_bursts <= 0 || g_size < 0 || g_procs <= 0 || g_timeout <= 0) usage();

  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0) { rl.rlim_cur = rl.rlim_max; setrlimit(RLIMIT_NOFILE, &rl); }
  int per = (g_conns + g_procs - 1) / g_procs;
  if ((rlim_t)per + 64 > rl.rlim_cur) {
    fprintf(stderr, "countclient: %d connections per process exceed the open-files limit %llu; use more --procs\n",
            per, (unsigned long long)rl.rlim_cur);
    return 2;
  }
  signal(SIGPIPE, SIG_IGN);
  if (g_tls) tls_init();
  long rss0 = g_hold >= 0 ? read_rss_kb() : -1;
  g_reqlen = snprintf(g_req, sizeof g_req,
                      "GET %s HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                      "Sec-WebSocket-Key: %s\r\nSec-WebSocket-Version: 13\r\n\r\n",
                      g_path, g_port, KEY);

  int *res = calloc(g_procs, sizeof *res), *cmd = calloc(g_procs, sizeof *cmd);
  pid_t *pids = calloc(g_procs, sizeof *pids);
  for (int k = 0, idx = 0; k < g_procs; k++) {
    int n = g_conns / g_procs + (k < g_conns % g_procs ? 1 : 0);
    int p1[2], p2[2];
    if (pipe2(p1, O_CLOEXEC) || pipe2(p2, O_CLOEXEC)) die("pipe");
    pid_t pid = fork();
    if (pid < 0) die("fork");
    if (pid == 0) {
      close(p1[0]), close(p2[1]);
      for (int j = 0; j < k; j++) close(res[j]), close(cmd[j]);
      child(idx, n, p1[1], p2[0]);
      _exit(0);
    }
    close(p1[1]), close(p2[0]);
    res[k] = p1[0], cmd[k] = p2[1], pids[k] = pid;
    idx += n;
  }

  int rc = 0;
  double t_setup = now_s();
  double deadline = t_setup + g_timeout;
  struct report rep;
  /* wait until every child is up */
  for (int k = 0; k < g_procs; k++) {
    struct pollfd pf = {.fd = res[k], .events = POLLIN};
    int ms = (int)((deadline - now_s()) * 1000);
    if (ms < 0 || poll(&pf, 1, ms) <= 0) {
      fprintf(stderr, "countclient: timeout: process %d not up after %d s\n", k, g_timeout);
      rc = 1;
      goto out;
    }
    if (read(res[k], &rep, sizeof rep) != sizeof rep || rep.type != R_READY) {
      fprintf(stderr, "countclient: process %d failed: %s\n", k,
              rep.type == R_FAIL ? rep.msg : "no report");
      rc = 1;
      goto out;
    }
  }
  fprintf(stderr, "countclient: %d connections up in %.2f s\n", g_conns, now_s() - t_setup);

  if (g_hold >= 0) {
    usleep(200 * 1000); /* let the server settle after the last upgrades */
    long rss1 = read_rss_kb();
    if (rss0 < 0 || rss1 < 0) fprintf(stderr, "countclient: no server RSS (--server-pid)\n");
    else printf("server RSS delta per connection: %.0f B (%ld kB -> %ld kB, %d connections)\n",
                (rss1 - rss0) * 1024.0 / g_conns, rss0, rss1, g_conns);
    fflush(stdout);
    usleep((useconds_t)(g_hold * 1e6));
    if (rss0 >= 0 && (rss1 = read_rss_kb()) >= 0)
      printf("after holding %.0f s: server RSS delta per connection %.0f B (%ld kB)\n", g_hold,
             (rss1 - rss0) * 1024.0 / g_conns, rss1);
    fflush(stdout);
    deadline = now_s() + g_timeout;
  }

  if (g_msgs > 0) {
    int pub = connect_publisher(deadline);
    usleep(200 * 1000); /* let the server settle after the last upgrades */

    /* M masked text frames, S bytes each, in one buffer */
    int hl = 2 + (g_size >= 126 ? (g_size > 65535 ? 8 : 2) : 0) + 4;
    size_t flen = (size_t)hl + g_size, total = flen * g_msgs;
    unsigned char *out = malloc(total);
    if (!out) die("out of memory");
    const unsigned char mask[4] = {0x37, 0xfa, 0x21, 0x3d};
    for (int m = 0; m < g_msgs; m++) {
      unsigned char *f = out + m * flen;
      f[0] = 0x81;
      int h = 2;
      if (g_size < 126) f[1] = 0x80 | g_size;
      else if (g_size <= 65535) { f[1] = 0x80 | 126; f[2] = g_size >> 8; f[3] = g_size; h = 4; }
      else { f[1] = 0x80 | 127; for (int i = 0; i < 8; i++) f[2 + i] = (uint64_t)g_size >> (56 - 8 * i); h = 10; }
      memcpy(f + h, mask, 4);
      for (int i = 0; i < g_size; i++) f[h + 4 + i] = ('a' + (m + i) % 26) ^ mask[i % 4];
    }

    struct rconn pc = {0};
    static unsigned char buf[1 << 16];
    long long echoes = 0, prev_total = 0;
    int nfds = g_procs + 1;
    struct pollfd *pf = calloc(nfds, sizeof *pf);
    double sum_rate = 0, sum_us = 0, sum_us_ns = 0;
    for (int b = 0; b < g_bursts && rc == 0; b++) {
      if (b > 0) usleep((useconds_t)(g_gap * 1e6));
      long ticks0, ticks1;
      long long ns0, ns1;
      read_cpu_of(g_server_pid, &ticks0, &ns0);
      double t0 = now_s();
      size_t off = 0;
      int writes = 0, done = 0;
      long long total_now = 0;
      double last = 0;
      for (int k = 0; k < g_procs; k++) pf[k].fd = res[k], pf[k].events = POLLIN;
      pf[g_procs].fd = pub;
      double pdeadline = t0 + g_timeout;
      while (done < g_procs) {
        if (off < total) {
          ssize_t w = g_pub_ssl ? tls_send(g_pub_ssl, out + off, total - off)
                                : send(pub, out + off, total - off, MSG_NOSIGNAL);
          if (w > 0) off += w, writes++;
          else if (w < 0 && errno != EAGAIN) { fprintf(stderr, "countclient: publish: %s\n", strerror(errno)); rc = 1; break; }
        }
        pf[g_procs].events = POLLIN | (off < total ? POLLOUT : 0);
        int ms = (int)((pdeadline - now_s()) * 1000);
        if (ms <= 0) break;
        if (poll(pf, nfds, ms) <= 0) break;
        if (pf[g_procs].revents & POLLIN) {
          ssize_t r = pub_recv(pub, &pc, buf, sizeof buf, &echoes);
          if (r == 0) { fprintf(stderr, "countclient: server closed the publisher\n"); pf[g_procs].fd = -1; }
        }
        for (int k = 0; k < g_procs; k++) {
          if (!(pf[k].revents & POLLIN)) continue;
          if (read(res[k], &rep, sizeof rep) != sizeof rep) {
            fprintf(stderr, "countclient: process %d died\n", k);
            rc = 1;
            goto out;
          }
          total_now += rep.count;
          if (rep.last > last) last = rep.last;
          pf[k].fd = -1;
          done++;
        }
      }
      read_cpu_of(g_server_pid, &ticks1, &ns1);
      if (done < g_procs) {
        /* timeout: collect partial counts */
        for (int k = 0; k < g_procs; k++) if (pf[k].fd >= 0) close(cmd[k]), cmd[k] = -1;
        for (int k = 0; k < g_procs; k++) {
          if (pf[k].fd < 0) continue;
          struct pollfd q = {.fd = res[k], .events = POLLIN};
          if (poll(&q, 1, 2000) > 0 && read(res[k], &rep, sizeof rep) == sizeof rep) total_now += rep.count;
        }
        fprintf(stderr,
                "countclient: burst %d: gave up after %d s: %lld of %lld deliveries counted, %zu of %zu publish bytes written\n",
                b + 1, g_timeout, total_now - prev_total, (long long)g_conns * g_msgs, off, total);
        rc = 1;
        goto out;
      }
      long long delivered = total_now - prev_total;
      prev_total = total_now;
      /* drain the publisher's echoes (not counted in deliveries) */
      while (echoes < (long long)g_msgs * (b + 1)) {
        struct pollfd q = {.fd = pub, .events = POLLIN};
        if (poll(&q, 1, 1000) <= 0) break;
        ssize_t r = pub_recv(pub, &pc, buf, sizeof buf, &echoes);
        if (r == 0 || (r < 0 && errno != EAGAIN)) break;
      }
      double secs = last - t0;
      double cpu = (ticks1 - ticks0) / (double)sysconf(_SC_CLK_TCK);
      double cpu_ns = (ns1 - ns0) * 1e-9;
      if (g_bursts > 1) printf("burst %d of %d\n", b + 1, g_bursts);
      printf("deliveries: %lld (%d connections x %d messages of %d B; publisher echoes %lld/%lld not counted; %d publish writes)\n",
             delivered, g_conns, g_msgs, g_size, echoes, (long long)g_msgs * (b + 1), writes);
      printf("seconds: %.6f\n", secs);
      printf("deliveries/s: %.0f\n", delivered / secs);
      sum_rate += delivered / secs;
      if (g_server_pid) {
        printf("server CPU seconds: %.2f (utime+stime ticks), %.6f (schedstat)\n", cpu, cpu_ns);
        printf("us server CPU per delivery: %.4f (ticks), %.4f (schedstat)\n", cpu * 1e6 / delivered,
               cpu_ns * 1e6 / delivered);
        sum_us += cpu * 1e6 / delivered, sum_us_ns += cpu_ns * 1e6 / delivered;
      }
      fflush(stdout);
    }
    if (g_bursts > 1 && rc == 0) {
      printf("mean of %d bursts: deliveries/s %.0f", g_bursts, sum_rate / g_bursts);
      if (g_server_pid)
        printf(", us server CPU per delivery %.4f (ticks), %.4f (schedstat)", sum_us / g_bursts, sum_us_ns / g_bursts);
      printf("\n");
      fflush(stdout);
    }
    if (g_linger > 0) usleep((useconds_t)(g_linger * 1e6)); /* keep every connection open a while */
    close(pub);
  }
out:
  for (int k = 0; k < g_procs; k++) if (cmd[k] >= 0) close(cmd[k]);
  for (int k = 0; k < g_procs; k++) {
    /* children exit on EOF of the command pipe; bounded wait, then SIGKILL */
    int st;
    double until = now_s() + 10;
    while (waitpid(pids[k], &st, WNOHANG) == 0) {
      if (now_s() > until) { kill(pids[k], SIGKILL); waitpid(pids[k], &st, 0); break; }
      usleep(10000);
    }
  }
  return rc;
}
