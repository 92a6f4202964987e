// The default backend: io_uring completions.
//   - accept: one multishot accept per listener;
//   - reads: one multishot recv per connection that picks its buffer from a provided-buffer
//     ring shared by the whole loop, so an idle connection holds no buffer at all; one plain
//     recv at a time instead where connections may be paused (bound_read_ahead);
//   - writes: sendmsg requests gathered during a loop iteration and submitted together, one
//     io_uring_enter for many sockets. The msghdr and iovec arrays live in a per-iteration
//     arena: with IORING_FEAT_SUBMIT_STABLE the kernel has copied them once submitted.

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <vector>

#include <liburing.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include "server/reactor/io_backend.hpp"

namespace wspush::server {
namespace {

constexpr std::uint64_t tag_shift = 56;
constexpr std::uint64_t tag_accept = 1, tag_recv = 2, tag_send = 3, tag_wake = 4, tag_ignore = 5;
constexpr std::uint64_t low_mask = (std::uint64_t{1} << tag_shift) - 1;
constexpr unsigned buffer_group = 0;
constexpr std::size_t max_iov_per_batch = 65536;

std::uint64_t pack(std::uint64_t tag, std::uint64_t low) noexcept { return (tag << tag_shift) | (low & low_mask); }

class uring_backend final : public io_backend {
 public:
  bool init(const backend_options& o, std::string& why) noexcept;
  ~uring_backend() override;
  const char* name() const noexcept override { return "uring"; }

  bool add_listener(int fd, int listener) noexcept override;
  void pause_accept(int listener) noexcept override;
  void resume_accept(int listener) noexcept override;
  bool start_reading(int fd, conn_token t) noexcept override;
  void stop_reading(int fd, conn_token t) noexcept override;
  void bound_read_ahead() noexcept override { _one_recv = true; }
  send_result send(int fd, conn_token t, const iovec* iov, int iovcnt) noexcept override;
  void wait_writable(int, conn_token) noexcept override {}  // sends complete asynchronously
  void close(int fd, conn_token t) noexcept override;
  void poll(io_handler& h, int timeout_ms) noexcept override;
  void wake() noexcept override {
    // One write until the loop has taken it: the wakers between two loop turns (a burst of
    // publishes, shards' replies) cost one system call, not one each.
    if (_wake_pending.exchange(true)) return;
    std::uint64_t one = 1;
    [[maybe_unused]] auto r = ::write(_wakefd, &one, sizeof one);
  }

 private:
  struct listener_state {
    int fd = -1;
    bool armed = false;
    bool paused = false;
  };

  bool setup_ring(const backend_options& o, std::string& why) noexcept;
  bool setup_buffers(const backend_options& o, std::string& why) noexcept;
  bool probe(std::string& why) noexcept;
  io_uring_sqe* get_sqe() noexcept;
  void arm_accept(int listener) noexcept;
  void arm_wake() noexcept;
  void recycle(unsigned bid) noexcept;
  void handle(io_handler& h, const io_uring_cqe& cqe) noexcept;
  void on_recv(io_handler& h, conn_token t, const io_uring_cqe& cqe) noexcept;
  void on_accept_cqe(io_handler& h, int listener, const io_uring_cqe& cqe) noexcept;
  void reset_arena() noexcept { _msgs_used = 0, _iov_used = 0; }

  io_uring _ring{};
  bool _ring_ok = false;
  int _wakefd = -1;
  std::uint64_t _wake_value = 0;
  std::atomic<bool> _wake_pending{false};  // a wake-up is written and not taken yet
  io_uring_buf_ring* _br = nullptr;
  std::size_t _br_bytes = 0;
  std::uint8_t* _bufs = nullptr;
  std::size_t _bufs_bytes = 0;
  unsigned _buf_count = 0, _buf_size = 0;
  bool _one_recv = false;  // bound_read_ahead: single-shot recvs
  std::vector<listener_state> _listeners;
  std::vector<msghdr> _msgs;  // per-iteration arena, see the file comment
  std::vector<iovec> _iov;
  std::size_t _msgs_used = 0, _iov_used = 0;
};

bool uring_backend::init(const backend_options& o, std::string& why) noexcept {
  if (const char* f = std::getenv("WSPUSH_TEST_FAIL_URING"); f && *f && *f != '0') {
    why = "io_uring_queue_init: Operation not permitted (WSPUSH_TEST_FAIL_URING)";
    return false;
  }
  if (!setup_ring(o, why) || !setup_buffers(o, why) || !probe(why)) return false;
  _wakefd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (_wakefd < 0) {
    why = std::string("eventfd: ") + std::strerror(errno);
    return false;
  }
  _msgs.resize(o.ring_entries);
  _iov.resize(max_iov_per_batch);
  arm_wake();
  return true;
}

bool uring_backend::setup_ring(const backend_options& o, std::string& why) noexcept {
  // Completions are only reaped by this thread, at its own pace: DEFER_TASKRUN saves the
  // interrupts. Kernels before 6.1 lack it; plain flags then.
  io_uring_params p{};
  p.flags = IORING_SETUP_SUBMIT_ALL | IORING_SETUP_COOP_TASKRUN | IORING_SETUP_SINGLE_ISSUER |
            IORING_SETUP_DEFER_TASKRUN | IORING_SETUP_CQSIZE;
  p.cq_entries = o.ring_entries * 4;
  int r = io_uring_queue_init_params(o.ring_entries, &_ring, &p);
  if (r < 0) {
    p = {};
    p.flags = IORING_SETUP_CQSIZE;
    p.cq_entries = o.ring_entries * 4;
    r = io_uring_queue_init_params(o.ring_entries, &_ring, &p);
  }
  if (r < 0) {
    why = std::string("io_uring_queue_init: ") + std::strerror(-r);
    return false;
  }
  _ring_ok = true;
  if (!(p.features & IORING_FEAT_SUBMIT_STABLE) || !(p.features & IORING_FEAT_FAST_POLL)) {
    why = "io_uring lacks SUBMIT_STABLE/FAST_POLL (kernel too old)";
    return false;
  }
  return true;
}

bool uring_backend::setup_buffers(const backend_options& o, std::string& why) noexcept {
  // The receive buffers are touched now (MAP_POPULATE): a fixed cost of the loop, paid at
  // start, not a cost that grows with connections.
  _buf_count = o.buffer_count;
  _buf_size = o.buffer_size;
  _br_bytes = _buf_count * sizeof(io_uring_buf);
  _bufs_bytes = std::size_t(_buf_count) * _buf_size;
  void* ring_mem = mmap(nullptr, _br_bytes, PROT_READ | PROT_WRITE, MAP_ANONYMOUS | MAP_PRIVATE, -1, 0);
  void* buf_mem = mmap(nullptr, _bufs_bytes, PROT_READ | PROT_WRITE, MAP_ANONYMOUS | MAP_PRIVATE | MAP_POPULATE, -1, 0);
  if (ring_mem == MAP_FAILED || buf_mem == MAP_FAILED) {
    if (ring_mem != MAP_FAILED) munmap(ring_mem, _br_bytes);
    if (buf_mem != MAP_FAILED) munmap(buf_mem, _bufs_bytes);
    why = "cannot map receive buffers";
    return false;
  }
  _br = static_cast<io_uring_buf_ring*>(ring_mem);
  _bufs = static_cast<std::uint8_t*>(buf_mem);
  io_uring_buf_reg reg{};
  reg.ring_addr = reinterpret_cast<std::uint64_t>(_br);
  reg.ring_entries = _buf_count;
  reg.bgid = buffer_group;
  if (int r = io_uring_register_buf_ring(&_ring, &reg, 0); r < 0) {
    why = std::string("io_uring_register_buf_ring: ") + std::strerror(-r);
    return false;
  }
  io_uring_buf_ring_init(_br);
  for (unsigned i = 0; i < _buf_count; ++i)
    io_uring_buf_ring_add(_br, _bufs + std::size_t(i) * _buf_size, _buf_size, i, io_uring_buf_ring_mask(_buf_count), i);
  io_uring_buf_ring_advance(_br, _buf_count);
  return true;
}

bool uring_backend::probe(std::string& why) noexcept {
  io_uring_probe* p = io_uring_get_probe_ring(&_ring);
  bool ok = p && io_uring_opcode_supported(p, IORING_OP_SENDMSG) && io_uring_opcode_supported(p, IORING_OP_SEND) &&
            io_uring_opcode_supported(p, IORING_OP_RECV) && io_uring_opcode_supported(p, IORING_OP_ACCEPT) &&
            io_uring_opcode_supported(p, IORING_OP_ASYNC_CANCEL);
  if (p) io_uring_free_probe(p);
  if (!ok) why = "io_uring lacks accept/recv/send/sendmsg/cancel";
  return ok;
}

uring_backend::~uring_backend() {
  if (_ring_ok) io_uring_queue_exit(&_ring);
  if (_br) munmap(_br, _br_bytes);
  if (_bufs) munmap(_bufs, _bufs_bytes);
  if (_wakefd >= 0) ::close(_wakefd);
}

io_uring_sqe* uring_backend::get_sqe() noexcept {
  io_uring_sqe* sqe = io_uring_get_sqe(&_ring);
  while (!sqe) {  // submission queue full: hand what we have to the kernel
    io_uring_submit(&_ring);
    reset_arena();
    sqe = io_uring_get_sqe(&_ring);
  }
  return sqe;
}

void uring_backend::arm_wake() noexcept {
  io_uring_sqe* sqe = get_sqe();
  io_uring_prep_read(sqe, _wakefd, &_wake_value, sizeof _wake_value, 0);
  io_uring_sqe_set_data64(sqe, pack(tag_wake, 0));
}

bool uring_backend::add_listener(int fd, int listener) noexcept {
  if (static_cast<std::size_t>(listener) >= _listeners.size()) _listeners.resize(listener + 1);
  _listeners[listener].fd = fd;
  arm_accept(listener);
  return true;
}

void uring_backend::arm_accept(int listener) noexcept {
  auto& l = _listeners[listener];
  io_uring_sqe* sqe = get_sqe();
  io_uring_prep_multishot_accept(sqe, l.fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
  io_uring_sqe_set_data64(sqe, pack(tag_accept, unsigned(listener)));
  l.armed = true;
}

void uring_backend::pause_accept(int listener) noexcept {
  auto& l = _listeners[listener];
  if (l.paused) return;
  l.paused = true;
  if (!l.armed) return;
  io_uring_sqe* sqe = get_sqe();
  io_uring_prep_cancel64(sqe, pack(tag_accept, unsigned(listener)), 0);
  io_uring_sqe_set_data64(sqe, pack(tag_ignore, 0));
}

void uring_backend::resume_accept(int listener) noexcept {
  auto& l = _listeners[listener];
  if (!l.paused) return;
  l.paused = false;
  if (!l.armed) arm_accept(listener);  // else the cancel's completion re-arms it
}

bool uring_backend::start_reading(int fd, conn_token t) noexcept {
  // A single-shot recv ends with its one buffer (no CQE_F_MORE): on_recv reports the pause,
  // and the loop arms the next at its flush, unless the connection is held by then.
  io_uring_sqe* sqe = get_sqe();
  if (_one_recv) io_uring_prep_recv(sqe, fd, nullptr, 0, 0);
  else io_uring_prep_recv_multishot(sqe, fd, nullptr, 0, 0);
  sqe->flags |= IOSQE_BUFFER_SELECT;
  sqe->buf_group = buffer_group;
  io_uring_sqe_set_data64(sqe, pack(tag_recv, t));
  return true;
}

void uring_backend::stop_reading(int, conn_token t) noexcept {
  io_uring_sqe* sqe = get_sqe();
  io_uring_prep_cancel64(sqe, pack(tag_recv, t), 0);
  io_uring_sqe_set_data64(sqe, pack(tag_ignore, 0));
}

send_result uring_backend::send(int fd, conn_token t, const iovec* iov, int iovcnt) noexcept {
  if (iovcnt == 1) {  // the common fan-out case: one frame, no msghdr to copy
    io_uring_sqe* sqe = get_sqe();
    io_uring_prep_send(sqe, fd, iov[0].iov_base, iov[0].iov_len, MSG_NOSIGNAL);
    io_uring_sqe_set_data64(sqe, pack(tag_send, t));
    return {send_outcome::pending, 0, 0};
  }
  if (_msgs_used == _msgs.size() || _iov_used + iovcnt > _iov.size()) {
    io_uring_submit(&_ring);
    reset_arena();
  }
  io_uring_sqe* sqe = get_sqe();  // may submit and reset the arena: take arena slots after it
  iovec* v = &_iov[_iov_used];
  std::memcpy(v, iov, sizeof(iovec) * iovcnt);
  _iov_used += iovcnt;
  msghdr* m = &_msgs[_msgs_used++];
  *m = msghdr{};
  m->msg_iov = v;
  m->msg_iovlen = iovcnt;
  io_uring_prep_sendmsg(sqe, fd, m, MSG_NOSIGNAL);
  io_uring_sqe_set_data64(sqe, pack(tag_send, t));
  return {send_outcome::pending, 0, 0};
}

void uring_backend::close(int fd, conn_token t) noexcept {
  // Every request in flight holds a reference to the socket, and the socket lives until the
  // last one ends: closing the descriptor alone would leave a send to a peer that never reads
  // waiting forever (and the socket ESTABLISHED with it). Cancel the multishot recv and any
  // send; the send's completion (-ECANCELED, or its result if it was already done) still
  // reaches on_send_done, which is when the loop may reuse the slot.
  for (std::uint64_t tag : {tag_recv, tag_send}) {
    io_uring_sqe* sqe = get_sqe();
    io_uring_prep_cancel64(sqe, pack(tag, t), 0);
    io_uring_sqe_set_data64(sqe, pack(tag_ignore, 0));
  }
  // The descriptor is closed by the ring, behind what is queued for it. A send prepared in
  // this turn and not yet submitted names the socket by its number: closed here at once, the
  // number could go to a socket another thread opens meanwhile (the admin listener's next
  // connection), and the send would write into that one. Requests are issued in order, so the
  // send takes its reference to this socket before the close.
  io_uring_sqe* sqe = get_sqe();
  io_uring_prep_close(sqe, fd);
  io_uring_sqe_set_data64(sqe, pack(tag_ignore, 0));
}

void uring_backend::recycle(unsigned bid) noexcept {
  io_uring_buf_ring_add(_br, _bufs + std::size_t(bid) * _buf_size, _buf_size, bid, io_uring_buf_ring_mask(_buf_count), 0);
  io_uring_buf_ring_advance(_br, 1);
}

void uring_backend::poll(io_handler& h, int timeout_ms) noexcept {
  io_uring_cqe* cqe = nullptr;
  if (timeout_ms < 0) {
    io_uring_submit_and_wait(&_ring, 1);
  } else {
    __kernel_timespec ts{timeout_ms / 1000, (timeout_ms % 1000) * 1000000LL};
    io_uring_submit_and_wait_timeout(&_ring, &cqe, 1, &ts, nullptr);
  }
  h.on_poll_woke();
  reset_arena();
  // Handlers queue new requests while we walk the completions; that is fine, the walk only
  // reads the completion queue. Batches are bounded so a flood cannot starve the timers.
  for (int batch = 0; batch < 8; ++batch) {
    unsigned head, seen = 0;
    io_uring_for_each_cqe(&_ring, head, cqe) {
      handle(h, *cqe);
      ++seen;
    }
    io_uring_cq_advance(&_ring, seen);
    if (seen == 0) break;
  }
}

void uring_backend::handle(io_handler& h, const io_uring_cqe& cqe) noexcept {
  std::uint64_t tag = cqe.user_data >> tag_shift;
  std::uint64_t low = cqe.user_data & low_mask;
  switch (tag) {
    case tag_recv: on_recv(h, low, cqe); break;
    case tag_send: h.on_send_done(low, cqe.res); break;
    case tag_accept: on_accept_cqe(h, int(low), cqe); break;
    case tag_wake:
      // The read has taken every write so far: cleared before the loop looks at its queues, so
      // that whoever queues after this wakes it again. An exchange, so that what a waker that
      // found the flag set (and wrote nothing) queued is visible here.
      _wake_pending.exchange(false);
      arm_wake();
      h.on_wake();
      break;
    default: break;
  }
}

void uring_backend::on_recv(io_handler& h, conn_token t, const io_uring_cqe& cqe) noexcept {
  bool more = cqe.flags & IORING_CQE_F_MORE;
  if (cqe.res > 0) {
    unsigned bid = cqe.flags >> IORING_CQE_BUFFER_SHIFT;
    h.on_data(t, {_bufs + std::size_t(bid) * _buf_size, std::size_t(cqe.res)});
    recycle(bid);
    if (!more) h.on_read_paused(t);
  } else if (cqe.res == 0) {
    h.on_read_end(t, 0);
  } else if (cqe.res == -ENOBUFS) {
    h.on_read_paused(t);
  } else if (cqe.res != -ECANCELED) {
    h.on_read_end(t, cqe.res);
  }
}

void uring_backend::on_accept_cqe(io_handler& h, int listener, const io_uring_cqe& cqe) noexcept {
  auto& l = _listeners[listener];
  if (!(cqe.flags & IORING_CQE_F_MORE)) {
    l.armed = false;
    if (!l.paused) arm_accept(listener);
  }
  if (cqe.res != -ECANCELED) h.on_accept(listener, cqe.res);  // cancelled: paused on purpose
}

}  // namespace

std::unique_ptr<io_backend> make_uring_backend(const backend_options& o, std::string& why) noexcept {
  auto b = std::make_unique<uring_backend>();
  if (!b->init(o, why)) return nullptr;
  return b;
}

}  // namespace wspush::server
