#include "server/pubsub/fanout.hpp"

#include <cstring>

namespace wspush::server::pubsub {

fanout::fanout(loop& l, std::size_t inbox_capacity, std::uint32_t parts, registry_options o)
    : _registry(o), _fanned(parts, 0), _inbox(l, inbox_capacity, *this) {
  _run.reserve(1024);
}

std::uint64_t fanout::on_item(event&& e) noexcept {
  if (e.reply) {  // a bus's answer: after the events before it, before the events after it
    deliver_run();
    if (_replies) _replies->on_bus_reply(std::move(e.reply));
    return 1;
  }
  std::size_t size = e.frame.bytes().size();
  if (!_run.empty() && (e.topic != _run.front().topic || _run_bytes + size > max_run_bytes)) deliver_run();
  // The budget counts what the work will cost: a run's first event, a pass over the topic's
  // subscribers; every other event of the run, a copy into the joined block.
  if (_run.empty()) _run_subs = _registry.subscribers(e.topic);  // no subscription changes during a pass
  std::uint64_t cost = _run.empty() ? _run_subs.size() + 1 : 1;
  _run_bytes += size;
  _run.push_back(std::move(e));  // grows once to the longest run, then reuses its capacity
  return cost;
}

/// The run's frames back to back in one block, and when some of them have a compressed twin,
/// the twins (or the plain frames of those that have none) back to back as its twin. Empty
/// when out of memory.
pool::frame_ref fanout::join_run() noexcept {
  auto join = [this](bool twins, std::size_t bytes) {
    pool::lease l = _ops->buffers().acquire(bytes);
    if (!l) return pool::frame_ref{};
    std::size_t at = 0;
    for (const event& e : _run) {
      auto b = twins && e.frame.has_twin() ? e.frame.twin_bytes() : e.frame.bytes();
      std::memcpy(l.data() + at, b.data(), b.size());
      at += b.size();
    }
    l.set_size(at);
    return pool::frame_ref::adopt(std::move(l));
  };
  pool::frame_ref joined = join(false, _run_bytes);
  bool some_twin = false;
  std::size_t twin_bytes = 0;
  for (const event& e : _run) {
    some_twin |= e.frame.has_twin();
    twin_bytes += (e.frame.has_twin() ? e.frame.twin_bytes() : e.frame.bytes()).size();
  }
  // Without memory for the twin, everyone gets the plain frames: valid with the extension too.
  if (joined && some_twin)
    if (pool::frame_ref twin = join(true, twin_bytes)) joined.set_twin(std::move(twin));
  return joined;
}

void fanout::deliver_run() noexcept {
  if (_run.empty()) return;
  // send_all holds back on_close (and so every registry change) until it has walked the array.
  std::span<const conn_id> subs = _run_subs;
  if (!subs.empty()) {
    pool::frame_ref joined = _run.size() > 1 ? join_run() : pool::frame_ref{};
    if (joined || _run.size() == 1) {
      const pool::frame_ref& f = joined ? joined : _run.front().frame;
      count(_ops->send_all(subs, f, std::uint32_t(_run.size())), _run.size());
    } else {
      for (const event& e : _run) count(_ops->send_all(subs, e.frame), 1);  // no memory to join: one by one
    }
  }
  const event& last = _run.back();
  if (last.part < _fanned.size()) _fanned[last.part] = last.seq;  // one topic: one history part
  _run.clear();
  _run_bytes = 0;
}

void fanout::count(const send_counts& n, std::uint64_t events) noexcept {
  _n.deliveries.add(n.queued * events);
  if (n.slow) _n.drops_slow.add(n.slow * events);
  if (n.closing) _n.drops_closed.add(n.closing * events);
}

void fanout::count_subscriptions() noexcept {
  _n.topics.set(_registry.topic_count());
  _n.subscriptions.set(_registry.subscription_count());
}

}  // namespace wspush::server::pubsub
