/* What the two counting clients (countclient.c, subcount.c) share: the clock, connecting from
 * the spread of loopback source addresses, counting text frames across reads, and reading the
 * server's CPU time. Kept to plain C and a few lines each, so both stay what they are: small,
 * neutral clients anyone can read in one sitting. */
#ifndef WSPUSH_COUNTCLIENT_COMMON_H
#define WSPUSH_COUNTCLIENT_COMMON_H

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#ifndef IP_BIND_ADDRESS_NO_PORT
#define IP_BIND_ADDRESS_NO_PORT 24
#endif

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* A non-blocking connect to 127.0.0.1:port from 127.0.0.(2 + idx % 249), so one process can
   hold more connections than one source address has ports. -1 on failure. */
static int open_conn_from(int idx, int port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, IPPROTO_TCP);
  if (fd < 0) return -1;
  int one = 1;
  setsockopt(fd, IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, &one, sizeof one);
  struct sockaddr_in src = {.sin_family = AF_INET};
  src.sin_addr.s_addr = htonl((127u << 24) | (uint32_t)(2 + idx % 249));
  if (bind(fd, (struct sockaddr *)&src, sizeof src) < 0) { close(fd); return -1; }
  struct sockaddr_in dst = {.sin_family = AF_INET, .sin_port = htons(port)};
  dst.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, (struct sockaddr *)&dst, sizeof dst) < 0 && errno != EINPROGRESS) {
    close(fd);
    return -1;
  }
  return fd;
}

/* A connection's place in its stream of frames. */
struct frames {
  unsigned char hlen;  /* header bytes gathered */
  unsigned char hneed; /* header size once known */
  unsigned char op;    /* opcode of the current frame */
  unsigned char hdr[14];
  uint64_t skip; /* payload bytes left in the current frame */
};

/* Consumes frame bytes (any split); returns the text frames completed. */
static long long count_frames(struct frames *c, const unsigned char *p, size_t n) {
  long long done = 0;
  while (n > 0) {
    if (c->skip > 0) {
      size_t k = n < c->skip ? n : (size_t)c->skip;
      p += k, n -= k, c->skip -= k;
      if (c->skip == 0 && c->op == 1) done++;
      continue;
    }
    c->hdr[c->hlen++] = *p++, n--;
    if (c->hlen == 2) {
      unsigned l = c->hdr[1] & 0x7f;
      c->hneed = 2 + (l == 126 ? 2 : l == 127 ? 8 : 0) + ((c->hdr[1] & 0x80) ? 4 : 0);
    }
    if (c->hlen >= 2 && c->hlen == c->hneed) {
      unsigned l = c->hdr[1] & 0x7f;
      uint64_t len = l;
      if (l == 126) len = ((uint64_t)c->hdr[2] << 8) | c->hdr[3];
      else if (l == 127) { len = 0; for (int i = 2; i < 10; i++) len = (len << 8) | c->hdr[i]; }
      c->op = c->hdr[0] & 0x0f;
      c->hlen = 0;
      c->skip = len;
      if (len == 0 && c->op == 1) done++;
    }
  }
  return done;
}

/* The CPU time of process `pid`: utime + stime in clock ticks (/proc/PID/stat) and the sum of
   its threads' run time in ns (/proc/PID/task/x/schedstat). Both 0 without a pid; -1 when the
   process cannot be read. */
static int read_cpu_of(int pid, long *ticks, long long *ns) {
  char p[64], b[1024];
  *ticks = 0, *ns = 0;
  if (!pid) return 0;
  snprintf(p, sizeof p, "/proc/%d/stat", pid);
  FILE *f = fopen(p, "r");
  if (!f) return -1;
  size_t r = fread(b, 1, sizeof b - 1, f);
  fclose(f);
  b[r] = 0;
  char *s = strrchr(b, ')');
  if (!s) return -1;
  long ut = 0, st = 0;
  /* after ")": state(3) ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime(14) stime(15) */
  if (sscanf(s + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %ld %ld", &ut, &st) != 2) return -1;
  *ticks = ut + st;
  snprintf(p, sizeof p, "/proc/%d/task", pid);
  DIR *d = opendir(p);
  if (d) {
    struct dirent *e;
    while ((e = readdir(d))) {
      if (e->d_name[0] == '.') continue;
      char q[320];
      snprintf(q, sizeof q, "/proc/%d/task/%s/schedstat", pid, e->d_name);
      FILE *g = fopen(q, "r");
      if (!g) continue;
      long long v = 0;
      if (fscanf(g, "%lld", &v) == 1) *ns += v;
      fclose(g);
    }
    closedir(d);
  }
  return 0;
}

#endif
