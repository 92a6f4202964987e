#pragma once
/// \file history.hpp
/// Per-topic bounded history for resume (`sub` with `since`), shared by every shard.
///
/// Threading: publishes come from any thread (admin listener, bus, clients' `pub` on any
/// shard), so the history is split by topic hash into `parts` parts, each behind its own
/// mutex; a call locks exactly one part at a time (never two: no lock order to get wrong).
///
/// Ids are `"<epoch>:<seq>"`. The epoch is a short random base36 tag chosen at construction,
/// so an id from before a restart (or one this process never issued) is recognised as
/// foreign. `seq` comes from a counter per part, not per topic: it increases per topic (not
/// by one), survives the topic's state being dropped when its last entry goes, and lets a
/// reactor track "what I have fanned out" with one number per part instead of one per topic.
///
/// Entries are the already-encoded WebSocket frames (`pool::frame_ref`), so a replay hands
/// out refcount bumps, never a copy or a re-encoding.
///
/// Limits: `size_per_topic` entries per topic (oldest first), `ttl_ns` of age, and
/// `max_bytes` for the whole history. With namespaces (`spaces`) each topic has its
/// namespace's size and age instead: the size is looked up at each append (a few prefix
/// compares, under no lock); the age is the topic's lane. Entries of different ages cannot
/// share one FIFO and still expire as a prefix of it (an entry of a 1 s namespace behind one
/// of a day would wait a day), and a sweep that skipped over the unexpired ones would walk the
/// whole history every second. So a part keeps one FIFO per distinct TTL, a "lane" (as many as
/// the namespaces have distinct TTLs, made at start-up; a topic's lane is fixed when its state
/// is made, namespaces never change while running): the sweep expires a prefix of each lane,
/// exactly as before, and never holds an entry past its age by more than a sweep's period.
/// An append and a replay expire the topic they touch first, by the topic's own TTL, so a
/// replay never hands out an entry older than its topic's TTL whenever the sweep runs. The
/// memory cap is unchanged: a part's oldest entry is the oldest of its lanes' oldest ones. The memory cap counts the heap the history holds: each
/// entry's whole pooled block (not only the frame's bytes in it), each topic's map node and
/// name, and each part's arrays (entry slots, map buckets) at their capacity; a part that
/// empties gives its arrays back. The memory cap evicts the globally oldest entries:
/// every entry gets a stamp from one process-wide counter, each part keeps its entries in
/// append order (a FIFO per lane, below) and publishes its oldest stamp, and an append that pushes the total
/// over the cap evicts, one part at a time, from the part whose oldest stamp is smallest.
///
/// The seam between replay and live (no gap, no duplicate): append() runs the caller's
/// frame maker under the part's lock, so the caller posts the frame to every reactor from
/// inside it and every reactor receives a part's publishes in seq order. A reactor
/// remembers, per part, the last seq it has fanned out (`fanned`). On `sub` with `since` it
/// first adds the subscription to its registry, then calls replay(..., until = fanned):
/// everything up to `fanned` reached the reactor before the subscription existed, so only
/// replay delivers it; everything after `fanned` is still in the reactor's inbox (or not yet
/// published) and reaches the connection live. Each seq is delivered exactly once.

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "pool/shared_frame.hpp"
#include "server/pubsub/namespaces.hpp"

namespace wspush::server::pubsub {

struct history_options {
  std::uint32_t size_per_topic = 100;           ///< --history-size; 0 keeps nothing (ids still issued)
  std::uint64_t ttl_ns = 300'000'000'000ull;    ///< --history-ttl; 0: no age limit
  std::size_t max_bytes = std::size_t{256} << 20;  ///< global cap (blocks + bookkeeping, as the heap holds them)
  std::uint32_t parts = 16;                     ///< parts; rounded up to a power of two
  /// --idempotency-window: a publish whose idempotency key was published on the same topic
  /// this recently is not published again (append() answers the first one's seq).
  std::uint64_t idempotency_window_ns = 300'000'000'000ull;
  /// Idempotency keys remembered in all, split evenly over the parts: past a part's share its
  /// oldest key is forgotten first (each costs 143-156 bytes measured with a 36-byte key, at most
  /// about 380 with the longest topic and key).
  std::uint32_t idempotency_keys = 1u << 17;
  std::string epoch;                            ///< empty: random; tests fix it
  /// Each topic's size and TTL from its namespace (its history_size and history_ttl), in place
  /// of size_per_topic and ttl_ns; null: those for every topic. Outlives the history.
  const namespaces* spaces = nullptr;
};

enum class evict_cause : std::uint8_t { size, ttl, memory };

struct history_stats {
  std::uint64_t entries = 0;
  std::uint64_t bytes = 0;  ///< what the memory cap counts (heap bytes held, estimated)
  std::uint64_t topics = 0;
  std::uint64_t appends = 0;
  std::uint64_t evicted_size = 0, evicted_ttl = 0, evicted_memory = 0;
  std::uint64_t idempotency_keys = 0;  ///< keys remembered now (within the window)
  std::uint64_t duplicates = 0;        ///< publishes answered with an earlier one's id
};

struct append_result {
  bool ok = false;          ///< false: the frame maker returned an empty frame, or out of memory
  bool duplicate = false;   ///< its idempotency key was published within the window: `seq` is
                            ///< that publish's, and nothing was made or appended
  std::uint32_t part = 0;   ///< the part (for the reactor's `fanned` bookkeeping)
  std::uint64_t seq = 0;
};

struct replay_result {
  bool lost = false;           ///< the history does not reach back to since_id
  std::uint32_t replayed = 0;  ///< entries handed to fn
};

/// An id formatted into a fixed buffer (no allocation).
struct history_id {
  char bytes[40];
  std::uint8_t len = 0;
  std::string_view view() const noexcept { return {bytes, len}; }
};

namespace detail {
struct history_part;
}

class history {
 public:
  static constexpr std::size_t max_epoch_bytes = 12;

  /// Start-up: may throw (std::bad_alloc, or std::invalid_argument for an epoch that is
  /// empty after all, too long, or not base36).
  explicit history(history_options o = {});
  ~history();
  history(const history&) = delete;
  history& operator=(const history&) = delete;

  std::string_view epoch() const noexcept { return _epoch; }
  std::uint32_t part_count() const noexcept { return _mask + 1; }
  std::uint32_t part_of(std::string_view topic) const noexcept;
  history_id format_id(std::uint64_t seq) const noexcept;
  /// The seq of an id of this epoch; false for a foreign epoch or a malformed id.
  bool parse_id(std::string_view id, std::uint64_t& seq) const noexcept;

  /// Appends a publish to `topic` at time `now_ns` (a monotonic clock; the caller's, so tests
  /// need no sleeping). Under the part's lock it assigns the seq and calls
  /// `make(std::string_view id, std::uint64_t seq) -> pool::frame_ref`, which encodes the event
  /// with its id and (see the seam above) posts it to the reactors. An empty frame means the
  /// publish failed: nothing is stored and the seq is not used. `make` must not call back
  /// into the history.
  ///
  /// With an `idempotency_key` (empty: none) the check is atomic with the append, under the
  /// same lock: a key published on `topic` within the window answers that publish's seq
  /// (`duplicate`) and `make` is not called; else the key is remembered with the new seq.
  template <class Make>
  append_result append(std::string_view topic, std::uint64_t now_ns, Make&& make,
                       std::string_view idempotency_key = {}) noexcept {
    using M = std::remove_reference_t<Make>;
    return append_impl(topic, now_ns, idempotency_key, &make, [](void* ctx, std::string_view id, std::uint64_t seq) noexcept {
      return (*static_cast<M*>(ctx))(id, seq);
    });
  }

  /// Calls `fn(std::uint64_t seq, const pool::frame_ref& frame)` for each retained, unexpired
  /// entry of `topic` with since < seq <= until_seq, oldest first, and says whether the
  /// history reaches back to `since_id` (lost: evicted or expired entries after it, a foreign
  /// epoch, a malformed id, or an id ahead of what the topic's part issued). A lost topic still
  /// replays all it retains up to until_seq. fn runs under the part's lock: copy the frame_ref
  /// (a refcount bump) and return; never call back into the history.
  template <class Fn>
  replay_result replay(std::string_view topic, std::string_view since_id, std::uint64_t until_seq,
                       std::uint64_t now_ns, Fn&& fn) noexcept {
    using F = std::remove_reference_t<Fn>;
    return replay_impl(topic, since_id, until_seq, now_ns, &fn,
                       [](void* ctx, std::uint64_t seq, const pool::frame_ref& f) noexcept {
                         (*static_cast<F*>(ctx))(seq, f);
                       });
  }

  /// Drops every entry older than its topic's TTL (call it from a timer, e.g. once a second).
  /// Appends and replays also expire the entries of the topic they touch. Returns the bytes
  /// (as counted against max_bytes) it released.
  std::size_t expire(std::uint64_t now_ns) noexcept;

  /// Sums every part (locks each in turn; a consistent total only when nothing runs).
  history_stats stats() const noexcept;

  /// The highest seq issued so far by part `part`.
  std::uint64_t last_seq(std::uint32_t part) const noexcept;

 private:
  using make_fn = pool::frame_ref (*)(void*, std::string_view, std::uint64_t) noexcept;
  using visit_fn = void (*)(void*, std::uint64_t, const pool::frame_ref&) noexcept;

  append_result append_impl(std::string_view topic, std::uint64_t now_ns, std::string_view idempotency_key, void* ctx,
                            make_fn make) noexcept;
  replay_result replay_impl(std::string_view topic, std::string_view since_id, std::uint64_t until_seq,
                            std::uint64_t now_ns, void* ctx, visit_fn fn) noexcept;
  void enforce_cap() noexcept;

  struct topic_limits {
    std::uint32_t size;  ///< entries kept per topic
    std::uint32_t lane;  ///< index into _lane_ttl
  };

  history_options _o;
  std::vector<topic_limits> _limits;     // by namespaces::index_of (one entry without namespaces)
  std::vector<std::uint64_t> _lane_ttl;  // each distinct TTL of a namespace (ns; 0: none)
  std::string _epoch;
  std::uint32_t _mask = 0;
  std::uint32_t _idem_per_part = 0;  // idempotency keys a part remembers at most
  std::unique_ptr<detail::history_part[]> _parts;
  std::atomic<std::uint64_t> _bytes{0};  // all parts; what max_bytes bounds
  std::atomic<std::uint64_t> _stamp{0};  // global append order, for oldest-first eviction
};

}  // namespace wspush::server::pubsub
