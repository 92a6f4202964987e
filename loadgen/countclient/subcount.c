/* subcount: a minimal, neutral pub/sub fan-out counter for wspush.
 *
 *   subcount --port P --admin-port A --connections N --messages M --size S --procs K
 *            [--server-pid PID] [--topic T] [--pipeline 32] [--settle-ms 250] [--path /ws] [--timeout 60]
 *
 * The pub/sub twin of countclient, doing the work of wspush-loadgen's `fanout` burst with
 * nothing but reading and counting, so the two can be compared on the same server.  K forked
 * processes open N connections to 127.0.0.1:P (source addresses 127.0.0.2..127.0.0.250), upgrade,
 * send {"op":"sub","topics":["T"]} and wait for one text frame (the subbed reply).  Once all are
 * up the parent waits --settle-ms (as the load generator's default --hold: the TCP timers the
 * set-up armed run out over about 200 ms), then POSTs M events to the admin API at 127.0.0.1:A
 * (/publish on one keep-alive connection, at most --pipeline requests in flight: the loadgen's
 * default 32), each body {"topic":"T","data":{"s":K,"t":NS,"p":"..."}} with data padded to S
 * bytes as the loadgen pads its payload.  Receivers read, find frame boundaries and count text
 * frames; nothing else.
 * Reported: the time from just before the first publish write to the last counted frame
 * (CLOCK_MONOTONIC of the read that counted it), deliveries/s, and the server's CPU time over
 * the same interval (/proc/PID/stat ticks and the sum of /proc/PID/task/x/schedstat).
 * Every phase is bounded by --timeout.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common.h"

static int g_port, g_admin_port, g_conns, g_msgs, g_size = 64, g_procs = 1, g_server_pid, g_timeout = 60;
static int g_pipeline = 32, g_settle_ms = 250;
static const char *g_path = "/ws", *g_topic = "lg-fanout";
static char g_req[512], g_sub[256];
static int g_reqlen, g_sublen;

static void die(const char *msg) {
  fprintf(stderr, "subcount: %s\n", msg);
  exit(2);
}

/* A child's report to the parent. */
enum { R_READY = 1, R_FAIL, R_DONE };
struct report {
  int type;
  long long count; /* text frames counted after the subbed replies */
  double last;     /* CLOCK_MONOTONIC of the read that counted the last one */
  char msg[96];
};

/* ---------------------------------------------------------------- receivers */

enum { S_CONNECTING, S_RESPONSE, S_SUBSCRIBING, S_UP };
struct rconn {
  int fd;
  unsigned char state;
  unsigned char matched; /* response: bytes of "\r\n\r\n" matched */
  struct frames fr;      /* in the upgrade, fr.hlen says the status line was checked */
};

/* One readable event during set-up: the 101 head (the server sends nothing behind it before
   the sub), then the subbed reply. Returns 1 when the connection is up, -1 on failure. */
static int setup_read(struct rconn *c, unsigned char *buf, size_t size) {
  ssize_t r = recv(c->fd, buf, size, 0);
  if (r < 0) return errno == EAGAIN || errno == EINTR ? 0 : -1;
  if (r == 0) return -1;
  size_t at = 0;
  if (c->state == S_RESPONSE) {
    if (c->matched == 0 && c->fr.hlen == 0 && (r < 12 || memcmp(buf, "HTTP/1.1 101", 12) != 0)) return -1;
    c->fr.hlen = 1; /* the status line was checked */
    while (at < (size_t)r && c->matched < 4) {
      char want = c->matched % 2 == 0 ? '\r' : '\n';
      c->matched = buf[at] == want ? c->matched + 1 : buf[at] == '\r';
      at++;
    }
    if (c->matched < 4) return 0;
    c->fr.hlen = 0;
    if (send(c->fd, g_sub, g_sublen, MSG_NOSIGNAL) != g_sublen) return -1;
    c->state = S_SUBSCRIBING;
  }
  if (count_frames(&c->fr, buf + at, r - at) == 0) return 0;
  c->state = S_UP;
  return 1;
}

/* One event during set-up; returns 1 when that connection is up, -1 on failure. */
static int setup_event(int ep, struct rconn *c, uint64_t tag, uint32_t events, unsigned char *buf, size_t size) {
  if (events & (EPOLLERR | EPOLLHUP)) return -1;
  if (c->state == S_CONNECTING) {
    struct epoll_event ev = {.events = EPOLLIN, .data.u64 = tag};
    c->state = S_RESPONSE;
    epoll_ctl(ep, EPOLL_CTL_MOD, c->fd, &ev);
    return send(c->fd, g_req, g_reqlen, MSG_NOSIGNAL) == g_reqlen ? 0 : -1;
  }
  return c->state == S_UP ? 0 : setup_read(c, buf, size);
}

/* Connects, upgrades and subscribes n connections, at most 512 at a time; 0, or -1 with
   rep->msg set. */
static int subscribe_all(int ep, struct rconn *cs, int idx0, int n, unsigned char *buf, size_t size, struct report *rep) {
  struct epoll_event evs[1024];
  int opened = 0, up = 0, inflight = 0;
  double deadline = now_s() + g_timeout;
  while (up < n) {
    while (opened < n && inflight < 512) {
      int fd = open_conn_from(idx0 + opened, g_port);
      if (fd < 0) return snprintf(rep->msg, sizeof rep->msg, "socket/bind/connect: %s", strerror(errno)), -1;
      struct epoll_event ev = {.events = EPOLLOUT, .data.u64 = (uint64_t)opened};
      cs[opened++].fd = fd;
      epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev);
      inflight++;
    }
    if (now_s() > deadline) return snprintf(rep->msg, sizeof rep->msg, "timeout: %d of %d subscribed", up, n), -1;
    int k = epoll_wait(ep, evs, 1024, 200);
    for (int i = 0; i < k; i++) {
      uint64_t tag = evs[i].data.u64;
      if (tag == (uint64_t)-1) return snprintf(rep->msg, sizeof rep->msg, "parent quit"), -1;
      int r = setup_event(ep, &cs[tag], tag, evs[i].events, buf, size);
      if (r < 0) return snprintf(rep->msg, sizeof rep->msg, "connection #%d failed in upgrade or sub", idx0 + (int)tag), -1;
      if (r > 0) up++, inflight--;
    }
  }
  return 0;
}

/* Reads and counts until the parent closes the pipe; reports once all n * M arrived (or what
   arrived, when told to quit before). */
static void count_all(int ep, struct rconn *cs, int n, unsigned char *buf, size_t size, int wfd) {
  struct report rep = {.type = R_DONE};
  struct epoll_event evs[1024];
  long long want = (long long)n * g_msgs;
  for (;;) {
    int k = epoll_wait(ep, evs, 1024, 1000);
    for (int i = 0; i < k; i++) {
      if (evs[i].data.u64 == (uint64_t)-1) {
        if (want && write(wfd, &rep, sizeof rep)) {}
        _exit(0);
      }
      struct rconn *c = &cs[evs[i].data.u64];
      ssize_t r = recv(c->fd, buf, size, 0);
      if (r > 0) {
        long long f = count_frames(&c->fr, buf, r);
        if (f) rep.count += f, rep.last = now_s();
      } else if (r == 0 || (errno != EAGAIN && errno != EINTR)) {
        epoll_ctl(ep, EPOLL_CTL_DEL, c->fd, NULL);
      }
    }
    if (want && rep.count >= want) {
      if (write(wfd, &rep, sizeof rep)) {}
      want = 0; /* reported; keep reading until told to quit */
    }
  }
}

static void child(int idx0, int n, int wfd, int rfd) {
  static unsigned char buf[1 << 16];
  struct report rep = {.type = R_READY};
  struct rconn *cs = calloc(n, sizeof *cs);
  int ep = epoll_create1(EPOLL_CLOEXEC);
  if (!cs || ep < 0) die("out of memory / epoll");
  struct epoll_event ev = {.events = EPOLLIN, .data.u64 = (uint64_t)-1};
  epoll_ctl(ep, EPOLL_CTL_ADD, rfd, &ev); /* the parent's pipe: EOF = quit */
  if (subscribe_all(ep, cs, idx0, n, buf, sizeof buf, &rep) < 0) {
    rep.type = R_FAIL;
    if (write(wfd, &rep, sizeof rep)) {}
    _exit(1);
  }
  if (write(wfd, &rep, sizeof rep) != sizeof rep) _exit(3);
  count_all(ep, cs, n, buf, sizeof buf, wfd);
}

/* ---------------------------------------------------------------- parent */

/* Appends one POST /publish whose data is the loadgen's payload shape, padded to g_size. */
static size_t encode_publish(char *out, int k) {
  char data[4096];
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  int n = snprintf(data, sizeof data, "{\"s\":%d,\"t\":%lld", k, ts.tv_sec * 1000000000LL + ts.tv_nsec);
  if (g_size >= n + 1 + 7 && g_size < (int)sizeof data - 2) {
    n += snprintf(data + n, sizeof data - n, ",\"p\":\"");
    int dots = g_size - n - 2;
    memset(data + n, '.', dots), n += dots;
    data[n++] = '"';
  }
  data[n++] = '}';
  char body[4200];
  int bl = snprintf(body, sizeof body, "{\"topic\":\"%s\",\"data\":%.*s}", g_topic, n, data);
  return (size_t)sprintf(out, "POST /publish HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nContent-Type: application/json\r\n"
                              "Content-Length: %d\r\n\r\n%s", g_admin_port, bl, body);
}

/* Takes complete responses off the front of `in`; returns how many, -1 on a non-200. */
static int take_responses(char *in, size_t *len) {
  int got = 0;
  for (;;) {
    in[*len] = 0;
    char *end = strstr(in, "\r\n\r\n");
    if (!end) return got;
    if (strncmp(in, "HTTP/1.1 200", 12) != 0) return -1;
    char *cl = strcasestr(in, "\r\ncontent-length:");
    size_t head = end + 4 - in, body = cl && cl < end ? strtoul(cl + 17, NULL, 10) : 0;
    if (*len < head + body) return got;
    memmove(in, in + head + body, *len - head - body + 1);
    *len -= head + body;
    got++;
  }
}

static int connect_admin(void) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, IPPROTO_TCP), one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  struct sockaddr_in dst = {.sin_family = AF_INET, .sin_port = htons(g_admin_port)};
  dst.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, (struct sockaddr *)&dst, sizeof dst) < 0) die("admin connect failed");
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
  return fd;
}

/* Publishes and waits for every child's count; returns 0 when all of them got everything. */
static int burst(int *res, double deadline) {
  int pub = connect_admin(), sent = 0, answered = 0, done = 0;
  usleep(g_settle_ms * 1000); /* the set-up's TCP timers run out first */
  static char out[1 << 20], in[1 << 16];
  size_t off = 0, olen = 0, ilen = 0;
  long long total = 0;
  double last = 0;
  long t0c, t1c;
  long long t0n, t1n;
  read_cpu_of(g_server_pid, &t0c, &t0n);
  double t0 = now_s();
  struct pollfd *pf = calloc(g_procs + 1, sizeof *pf);
  for (int k = 0; k < g_procs; k++) pf[k].fd = res[k], pf[k].events = POLLIN;
  pf[g_procs].fd = pub;
  while ((done < g_procs || answered < g_msgs) && now_s() < deadline) {
    if (off == olen) off = olen = 0;
    while (sent < g_msgs && sent - answered < g_pipeline && olen + 8192 < sizeof out) olen += encode_publish(out + olen, sent++);
    if (off < olen) {
      ssize_t w = send(pub, out + off, olen - off, MSG_NOSIGNAL);
      if (w > 0) off += w;
      else if (errno != EAGAIN) die("admin send failed");
    }
    pf[g_procs].events = POLLIN | (off < olen ? POLLOUT : 0);
    if (poll(pf, g_procs + 1, 100) <= 0) continue;
    if (pf[g_procs].revents & POLLIN) {
      ssize_t r = recv(pub, in + ilen, sizeof in - 1 - ilen, 0);
      if (r == 0 || (r < 0 && errno != EAGAIN)) die("admin connection lost");
      if (r > 0) {
        ilen += r;
        int got = take_responses(in, &ilen);
        if (got < 0) die("a publish was refused");
        answered += got;
      }
    }
    for (int k = 0; k < g_procs; k++) {
      struct report rep;
      if (!(pf[k].revents & POLLIN)) continue;
      if (read(res[k], &rep, sizeof rep) != sizeof rep || rep.type != R_DONE) die("a receiver process died");
      total += rep.count;
      if (rep.last > last) last = rep.last;
      pf[k].fd = -1, done++;
    }
  }
  read_cpu_of(g_server_pid, &t1c, &t1n);
  close(pub);
  long long want = (long long)g_conns * g_msgs;
  printf("deliveries: %lld of %lld (%d connections x %d messages of %d B, %d publishes answered)\n", total, want,
         g_conns, g_msgs, g_size, answered);
  if (done < g_procs || total < want) return 1;
  double secs = last - t0, cpu = (t1c - t0c) / (double)sysconf(_SC_CLK_TCK), cpu_ns = (t1n - t0n) * 1e-9;
  printf("seconds: %.6f\ndeliveries/s: %.0f\n", secs, total / secs);
  if (g_server_pid)
    printf("us server CPU per delivery: %.4f (ticks), %.4f (schedstat)\n", cpu * 1e6 / total, cpu_ns * 1e6 / total);
  return 0;
}

static void usage(void) {
  fprintf(stderr, "usage: subcount --port P --admin-port A --connections N --messages M --size S --procs K\n"
                  "                [--server-pid PID] [--topic T] [--pipeline 32] [--settle-ms 250] [--path /ws]\n"
                  "                [--timeout 60]\n");
  exit(2);
}

int main(int argc, char **argv) {
  if (argc % 2 == 0) usage();
  for (int i = 1; i + 1 < argc; i += 2) {
    const char *a = argv[i], *v = argv[i + 1];
    if (!strcmp(a, "--port")) g_port = atoi(v);
    else if (!strcmp(a, "--admin-port")) g_admin_port = atoi(v);
    else if (!strcmp(a, "--connections")) g_conns = atoi(v);
    else if (!strcmp(a, "--messages")) g_msgs = atoi(v);
    else if (!strcmp(a, "--size")) g_size = atoi(v);
    else if (!strcmp(a, "--procs")) g_procs = atoi(v);
    else if (!strcmp(a, "--server-pid")) g_server_pid = atoi(v);
    else if (!strcmp(a, "--topic")) g_topic = v;
    else if (!strcmp(a, "--pipeline")) g_pipeline = atoi(v);
    else if (!strcmp(a, "--settle-ms")) g_settle_ms = atoi(v);
    else if (!strcmp(a, "--path")) g_path = v;
    else if (!strcmp(a, "--timeout")) g_timeout = atoi(v);
    else usage();
  }
  if (g_port <= 0 || g_admin_port <= 0 || g_conns <= 0 || g_msgs <= 0 || g_size < 0 || g_size > 4000 ||
      g_procs <= 0 || g_pipeline <= 0 || g_settle_ms < 0 || g_settle_ms > 60000 || g_timeout <= 0 || strlen(g_topic) > 90)
    usage();
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0) { rl.rlim_cur = rl.rlim_max; setrlimit(RLIMIT_NOFILE, &rl); }
  if ((rlim_t)(g_conns / g_procs + 64) > rl.rlim_cur) die("too many connections per process for the open-files limit; raise --procs");
  signal(SIGPIPE, SIG_IGN);
  g_reqlen = snprintf(g_req, sizeof g_req,
                      "GET %s HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                      "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n", g_path, g_port);
  /* the sub message in one masked text frame (mask 0: the payload goes as it is) */
  int pl = snprintf(g_sub + 6, sizeof g_sub - 6, "{\"op\":\"sub\",\"topics\":[\"%s\"]}", g_topic);
  g_sub[0] = (char)0x81, g_sub[1] = (char)(0x80 | pl), memset(g_sub + 2, 0, 4);
  g_sublen = 6 + pl;

  int *res = calloc(g_procs, sizeof *res), *cmd = calloc(g_procs, sizeof *cmd);
  pid_t *pids = calloc(g_procs, sizeof *pids);
  for (int k = 0, idx = 0; k < g_procs; k++) {
    int n = g_conns / g_procs + (k < g_conns % g_procs), p1[2], p2[2];
    if (pipe2(p1, O_CLOEXEC) || pipe2(p2, O_CLOEXEC)) die("pipe");
    pids[k] = fork();
    if (pids[k] < 0) die("fork");
    if (pids[k] == 0) {
      close(p1[0]), close(p2[1]);
      for (int j = 0; j < k; j++) close(res[j]), close(cmd[j]);
      child(idx, n, p1[1], p2[0]);
    }
    close(p1[1]), close(p2[0]);
    res[k] = p1[0], cmd[k] = p2[1], idx += n;
  }
  int rc = 0;
  double t_setup = now_s(), deadline = t_setup + g_timeout;
  for (int k = 0; k < g_procs && rc == 0; k++) {
    struct pollfd pf = {.fd = res[k], .events = POLLIN};
    struct report rep = {0};
    int ms = (int)((deadline - now_s()) * 1000);
    if (ms <= 0 || poll(&pf, 1, ms) <= 0 || read(res[k], &rep, sizeof rep) != sizeof rep || rep.type != R_READY) {
      fprintf(stderr, "subcount: process %d not ready: %s\n", k, rep.type == R_FAIL ? rep.msg : "timeout");
      rc = 1;
    }
  }
  if (rc == 0) {
    fprintf(stderr, "subcount: %d connections subscribed in %.2f s\n", g_conns, now_s() - t_setup);
    rc = burst(res, now_s() + g_timeout);
  }
  fflush(stdout);
  for (int k = 0; k < g_procs; k++) close(cmd[k]);
  for (int k = 0; k < g_procs; k++) { /* children quit on EOF; bounded wait, then SIGKILL */
    double until = now_s() + 10;
    while (waitpid(pids[k], NULL, WNOHANG) == 0) {
      if (now_s() > until) { kill(pids[k], SIGKILL); waitpid(pids[k], NULL, 0); break; }
      usleep(10000);
    }
  }
  return rc;
}
