#include "server/pubsub/fanout.hpp"

namespace wspush::server::pubsub {

fanout::fanout(loop& l, std::size_t inbox_capacity, std::uint32_t parts, registry_options o)
    : _registry(o), _fanned(parts, 0), _inbox(l, inbox_capacity, *this) {}

std::uint64_t fanout::on_item(event&& e) noexcept {
  // send_all holds back on_close (and so every registry change) until it has walked the array.
  send_counts n = _ops->send_all(_registry.subscribers(e.topic), e.frame);
  if (e.part < _fanned.size()) _fanned[e.part] = e.seq;
  _n.deliveries.add(n.queued);
  if (n.slow) _n.drops_slow.add(n.slow);
  if (n.closing) _n.drops_closed.add(n.closing);
  return n.queued + n.closing + n.slow + 1;
}

void fanout::count_subscriptions() noexcept {
  _n.topics.set(_registry.topic_count());
  _n.subscriptions.set(_registry.subscription_count());
}

}  // namespace wspush::server::pubsub
