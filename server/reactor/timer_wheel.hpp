#pragma once
// A hashed timer wheel over slab indices. A connection has at most one deadline at a time
// (the one of its current stage: upgrade, message, close), so the links live inside its
// record and arming, moving and cancelling cost a few stores: no timer objects, no heap.
// Deadlines past one turn of the wheel stay in their slot and are skipped until due.

#include <cstdint>
#include <vector>

namespace wspush::server {

inline constexpr std::uint32_t no_index = UINT32_MAX;

/// The part of a record the wheel uses. `due == 0` means "not armed".
struct timer_links {
  std::uint32_t prev = no_index;
  std::uint32_t next = no_index;
  std::uint32_t due = 0;
};

template <class Links>  // Links: timer_links& operator()(std::uint32_t index)
class timer_wheel {
 public:
  timer_wheel(std::uint32_t slots, Links links) : _slots(slots, no_index), _links(links) {}

  std::uint32_t now() const noexcept { return _now; }

  /// Arms (or moves) index's deadline to `ticks` from now (at least one tick).
  void arm(std::uint32_t index, std::uint32_t ticks) noexcept {
    cancel(index);
    timer_links& l = _links(index);
    l.due = _now + (ticks ? ticks : 1);
    std::uint32_t& head = _slots[l.due % _slots.size()];
    l.prev = no_index;
    l.next = head;
    if (head != no_index) _links(head).prev = index;
    head = index;
  }

  void cancel(std::uint32_t index) noexcept {
    timer_links& l = _links(index);
    if (l.due == 0) return;
    if (l.prev != no_index) _links(l.prev).next = l.next;
    else _slots[l.due % _slots.size()] = l.next;
    if (l.next != no_index) _links(l.next).prev = l.prev;
    l = timer_links{};
  }

  bool armed(std::uint32_t index) noexcept { return _links(index).due != 0; }

  /// Moves time forward to `tick`, calling fire(index) for every deadline reached. The due
  /// entries of a slot are unlinked first, then fired, so fire may arm or cancel any timer.
  template <class Fire>
  void advance(std::uint32_t tick, Fire&& fire) noexcept {
    while (_now != tick) {
      ++_now;
      _due_now.clear();
      for (std::uint32_t i = _slots[_now % _slots.size()]; i != no_index;) {
        std::uint32_t next = _links(i).next;
        if (_links(i).due == _now) {
          cancel(i);
          _due_now.push_back(i);  // capacity kept between ticks: no allocation once warm
        }
        i = next;
      }
      for (std::uint32_t i : _due_now) fire(i);
    }
  }

 private:
  std::vector<std::uint32_t> _slots;
  Links _links;
  std::vector<std::uint32_t> _due_now;
  std::uint32_t _now = 1;  // due == 0 means unarmed, so time starts at 1
};

}  // namespace wspush::server
