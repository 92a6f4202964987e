#pragma once
// The Redis bus (--bus=redis://...): how nodes share publishes and history. One thread runs
// a wspush loop (epoll) with two connections to each Redis on it (redis_link): one subscribed
// (pub/sub mode), one for commands. No other thread talks to Redis, and no shard ever waits
// for it.
//
// The bus may span several Redis (--bus=redis://a,redis://b,...: isolated shards). Each topic
// lives on exactly one of them (redis_route.hpp: shard_of), with its stream, its channel and
// that Redis's epoch; everything below happens on the topic's Redis, and a Redis that is away
// holds up only its own topics. One Redis is the case of one shard.
//
//   publish (any node's admin API, a client's pub, or a backend straight into Redis):
//     FCALL wspush_publish: XADD to the topic's stream (id assigned by Redis, trimmed by count
//     and age) and PUBLISH "<epoch>:<id> <data>" on its channel, atomically (wspush.lua)
//   every node subscribed to the channel: frames the event once, offers it to each shard's
//     event port; each shard fans it out to its own subscribers (pubsub/fanout.hpp)
//
// A node subscribes in Redis to exactly the topics some shard holds (a connection subscribed
// or waiting): on the first holder, and unsubscribes after the last, in batches of many
// channels per command, once per loop iteration.
//
// `sub` (bus_port::subscribe) is answered only once Redis has confirmed every topic's
// subscription. With `since` the seam between replay and live is exact:
//   1. the subscription is confirmed: from here every publish of the topic reaches this
//      node's subscriber connection, in order;
//   2. FCALL wspush_replay reads the stream after `since` (at a moment R), then a PUBLISH to
//      this node's own channel sends a marker, on the command connection, right behind it;
//   3. the events that arrive live from (1) on are kept aside for the request; when the marker
//      arrives on the subscriber connection every publish made before R has arrived too
//      (Redis delivers one connection's messages in the order it ran the commands);
//   4. the answer is the replay, then the kept live events newer than its last id; it goes to
//      the shard through its event inbox, behind every event this bus offered it before and
//      ahead of every later one. The shard adds the connection to its registry when it takes
//      the answer, so each event reaches the connection exactly once.
//
// When Redis goes away: the bus says down (the admin API answers 503 and /readyz 503, pubs are
// refused with `unavailable`), client connections stay, and it reconnects with backoff, loads
// the functions again and resubscribes every held topic. A `sub` made or under way meanwhile
// waits (at most max_held_subs of them, each at most held_sub_wait): it is subscribed and
// answered once Redis is back, `unavailable` only when the wait runs out.
//
// No silent gap: every topic that was subscribed before the outage is caught up, or announced
// lost, to the subscribers that stayed. Once a second (and after new subscriptions) the node
// runs wspush_mark, which publishes Redis's TIME on the node's own channel: when it arrives,
// every event published before that moment on a topic subscribed before it has arrived too.
// After a reconnect each such topic replays from the later of that mark and its last event
// (wspush_replay in mark mode); a topic subscribed after the last mark replays from its last
// event, and one with neither (subscribed within a second of the outage, no event since) is
// announced lost. What the replay cannot cover (trimmed, expired, Redis restarted empty: a new
// epoch) is announced to those subscribers as {"op":"lost","topics":[...]} before the rest.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <vector>

#include <simdjson.h>

#include "pool/buffer_pool.hpp"
#include "server/base/counter.hpp"
#include "server/bus/cluster_map.hpp"
#include "server/bus/redis_link.hpp"
#include "server/bus/redis_url.hpp"
#include "server/conn/compression.hpp"
#include "server/pubsub/bus_port.hpp"
#include "server/pubsub/event.hpp"
#include "server/pubsub/namespaces.hpp"
#include "server/pubsub/presence.hpp"
#include "server/reactor/loop.hpp"

namespace wspush::server {
class user_table;
}

namespace wspush::server::bus {


struct redis_bus_options {
  std::vector<redis_target> targets;  ///< each Redis (isolated shards, in --bus order), or a cluster's seeds: at least one
  bool cluster = false;               ///< targets are the seed nodes of a Redis Cluster
  std::uint32_t history_size = 100;  ///< --history-size: MAXLEN of each topic's stream
  double history_ttl = 300;          ///< --history-ttl: entries older than this are trimmed
  /// The largest event data: written into Redis (wspush_publish refuses more), and what
  /// bounds the replies the node accepts.
  std::size_t max_event_bytes = 1u << 20;
  std::size_t max_pub_bytes = 64u << 20;   ///< clients' pubs in flight to Redis, node-wide: past it a pub is refused
  double redis_timeout = 3;          ///< --redis-timeout: a command unanswered this long: stalled()
  /// --redis-wait-replicas: a publish is answered ok only once this many replicas of its Redis
  /// have it (WAIT after each batch); 0: once the master has it.
  std::uint32_t wait_replicas = 0;
  std::uint32_t wait_ms = 500;       ///< --redis-wait-ms: how long WAIT waits for them
  /// Sentinel (--bus=redis-sentinel://): where to ask for the master named master_name; the
  /// one target is the master (its credentials and TLS, no address).
  std::vector<redis_target> sentinels;
  std::string master_name;
  /// rediss:// targets: TLS with these settings (--redis-tls-*); null when none is rediss://.
  std::shared_ptr<const tls_client_context> tls;
  /// --idempotency-window: a publish whose idempotency key was published on the topic this
  /// recently is not published again (wspush.lua remembers the keys, in the topic's slot).
  double idempotency_window = 300;
  /// --revocation-ttl (0: off), --max-revocations: the revocation list kept in Redis too
  /// (revokes, redis_bus_revoke.cpp).
  std::uint32_t revocation_ttl = 3600;
  std::uint32_t max_revocations = 100000;
  /// Namespaces (pubsub/namespaces.hpp): their history limits are written into the library
  /// (each topic's stream gets its namespace's MAXLEN and age), the largest history size bounds
  /// replies, and a namespace without compression gets no compressed twins. Null: none.
  /// Outlives the bus.
  const pubsub::namespaces* spaces = nullptr;
  /// --presence-ttl: presence in Redis (where a namespace keeps it): each node's word on a
  /// (topic, user) lasts this long, and the node says it again every third of it, so a node that
  /// dies without a word drops out of every presence within this time.
  std::uint32_t presence_ttl_ms = 30000;
};

/// A revoke heard from Redis (bus thread): another node's (`loaded` false), or one read from
/// the list in Redis when the bus came up (`loaded`). `at` in unix seconds.
using revoke_handler = std::function<void(std::string_view sub, std::int64_t at, bool loaded)>;

struct redis_bus_counters {
  relaxed_counter events_in;       ///< publishes received from Redis (one per publish and node)
  relaxed_counter malformed;       ///< messages in Redis that were not an event: counted, skipped
  relaxed_counter reconnects;      ///< connections to Redis made again after one was lost
  relaxed_counter subscribes, unsubscribes;  ///< SUBSCRIBE / UNSUBSCRIBE commands (each many channels)
  relaxed_counter publish_calls;   ///< FCALL wspush_publish_batch commands (each many publishes)
  relaxed_counter dropped;         ///< events a shard's inbox refused
  relaxed_counter catchup_events;  ///< events replayed to subscribers that stayed through an outage
  relaxed_counter topics;          ///< gauge: channels subscribed
  relaxed_counter pending;         ///< gauge: subs and catch-ups under way (waiting for Redis)
  relaxed_counter paced;           ///< gauge: paced replays waiting for their client to read a page
  relaxed_counter held;            ///< gauge: subs waiting for Redis to come back
  relaxed_counter lost_notices;    ///< topics announced lost to their subscribers after an outage
  relaxed_counter marks;           ///< marks heard back on the subscriber connection (wspush_mark)
  relaxed_counter pubs_refused;    ///< clients' pubs refused at once: the node's bound on pubs in flight
  relaxed_counter protocol_errors; ///< replies that broke RESP, a bound or the order: link dropped
  relaxed_counter unreplicated;    ///< publishes run but not on wait_replicas replicas in time: answered timeout
  relaxed_counter joins, leaves;   ///< join/leave events Redis announced, handed to the shards
};

/// What publish_wait says. unavailable: it never reached Redis (a retry is safe); unknown:
/// it went to Redis and no answer came (the link broke, or the wait ran out): Redis may
/// still run it, so a retry may publish it twice.
enum class bus_publish : std::uint8_t { ok, unavailable, refused, unknown };

/// Told the ticket of a queued admin publish once it is settled (redis_bus::publish_queue).
using publish_notify = std::function<void(std::span<const std::uint64_t> tickets)>;

class redis_bus final : public pubsub::bus_port, private loop_handler, private redis_link::listener {
 public:
  redis_bus(redis_bus_options o, pool::buffer_pool& buffers);
  ~redis_bus() override;
  redis_bus(const redis_bus&) = delete;
  redis_bus& operator=(const redis_bus&) = delete;

  /// Start-up: one event port per shard (the same as the hub's).
  void attach(std::vector<pubsub::event_port*> ports) { _ports = std::move(ports); }
  /// Start-up: events (live and replayed) get their compressed twin here, once per process.
  void set_compression(compression& z) noexcept { _compression = &z; }
  /// Starts the bus thread; it connects (and keeps reconnecting) by itself. False: no loop.
  bool start(std::string& why);
  /// Ends the thread (after the shards have stopped).
  void stop();

  // bus_port
  /// Every Redis of the bus is connected and ready.
  bool up() const noexcept override;
  /// Any thread: at least one Redis is up (the node can serve some topics).
  bool any_up() const noexcept;
  /// Any thread: why the first Redis that is down is down ("<url>: <why>"), or empty.
  std::string down_reason() const;
  /// Any thread: the Redis that holds `topic` is up.
  bool up_for(std::string_view topic) const noexcept;
  /// Any thread: a command has waited longer than redis_timeout for a Redis's answer (updated
  /// every tick by the bus thread).
  bool stalled() const noexcept { return _stalled.load(std::memory_order_acquire); }
  bool subscribe(std::unique_ptr<pubsub::bus_sub> s) noexcept override;
  void release(std::uint32_t shard, std::string_view topic) noexcept override;
  void withdraw(std::uint32_t shard, std::uint64_t request) noexcept override;
  void more(std::uint32_t shard, std::uint64_t request, std::uint64_t room) noexcept override;
  bool readable_since(std::string_view id) const noexcept override;
  bool publish(std::uint32_t shard, std::uint64_t tag, std::string_view topic, std::string_view data,
               std::string_view idempotency_key) noexcept override;
  void presence_set(std::string_view topic, std::string_view user, std::uint32_t connections,
                    bool announce) noexcept override;
  bool presence_get(std::uint32_t shard, conn_id conn, std::uint64_t request, std::string_view topic,
                    bool count_only) noexcept override;
  /// Any thread but the bus's (GET /presence): `topic`'s presence across the nodes, waiting at
  /// most `timeout` for Redis (every user listed; count_only: none). Not ok: down, or no answer.
  pubsub::presence_answer presence_wait(std::string_view topic, bool count_only, std::chrono::milliseconds timeout);
  /// Start-up, before start(): the node's presence (the shards count it, the bus says it again to
  /// Redis every presence_refresh_seconds) and the names of its users.
  void set_presence(const pubsub::presence_table& table, const user_table& users) noexcept {
    _presence = &table;
    _presence_users = &users;
  }

  /// Any thread but the bus's (the admin API): publishes and waits for Redis's answer, at most
  /// `timeout`. ok: `id` holds the event's id; refused: Redis said no (`id` holds why). A
  /// publish still queued when the wait runs out is withdrawn (unavailable); one already
  /// handed to Redis is unknown.
  bus_publish publish_wait(std::string_view topic, std::string_view data, std::string& id,
                           std::chrono::milliseconds timeout);
  /// Any thread: what publish_queue(..., true) calls with the ticket once the publish is
  /// settled (on the bus thread, or in publish_queue when the bus is down). Set before such
  /// publishes; an empty one (once nobody listens) calls nothing. Kept once here, not per
  /// publish.
  void set_publish_notify(publish_notify notify) noexcept;
  /// Queues a publish whose answer publish_collect() takes (a batch: all go to Redis back to
  /// back). `idempotency_key`: empty (none) or valid; a key published on the topic within the
  /// window (in Redis: across nodes) is answered ok with that publish's id, and not published
  /// again. Returns a ticket. With `notify`, the publish notify is told the ticket once it is
  /// settled, so that a caller need not wait: it collects with a zero timeout then. It is not
  /// told of a publish withdrawn by a collect that gave up before it was sent.
  /// Without `wake`, the bus thread is not woken for it: wake_for_posts() does, once for all.
  std::uint64_t publish_queue(std::string_view topic, std::string_view data, std::string_view idempotency_key,
                              bool notify = false, bool wake = true);
  /// Wakes the bus thread if publish_queue(..., false) queued anything since it last did.
  void wake_for_posts() noexcept;
  /// The answer to a queued publish, waiting at most `timeout` (0: not at all); the ticket is
  /// spent either way. Past the wait: unknown when it was handed to Redis, else unavailable
  /// (withdrawn: it is never sent).
  bus_publish publish_collect(std::uint64_t ticket, std::string& id, std::chrono::milliseconds timeout);

  /// Start-up, before start(): where revokes heard from Redis go.
  void set_revoke_handler(revoke_handler h) { _on_revoke = std::move(h); }
  /// Any thread: a revoke made on this node (POST /disconnect), for every other node: recorded
  /// in Redis's revocation list and announced on the control channel. Made while the Redis
  /// that keeps them is away, it is sent once it is back.
  void revoke(std::string_view sub, std::int64_t at) noexcept;

  const redis_bus_counters& counters() const noexcept { return _n; }
  /// How many Redis the bus spans, each one's address, and whether it is up (any thread). 0
  /// under Redis Cluster: its masters come and go.
  std::size_t redis_count() const noexcept { return _o.cluster ? 0 : _o.targets.size(); }
  const redis_target& target(std::size_t k) const noexcept { return _o.targets[k]; }
  bool up_at(std::size_t k) const noexcept;

  // Internal (the links' callbacks).
  struct op;
  struct batched_pub;
  void on_reply(op* o, const resp::reply* r) noexcept;

 private:
  struct waiter;
  struct request;
  struct topic_state;
  struct pending;
  struct instance;  // one Redis: its links and their state (redis_bus_parts.hpp)

  void notify_settled(std::uint64_t ticket) noexcept;  // a waiter's: tells _notify (batched on the bus thread)
  void flush_settled() noexcept;

  // loop_handler (the bus's loop has no connections)
  void on_accept(int) noexcept override {}
  void on_data(conn_token, std::span<std::uint8_t>) noexcept override {}
  void on_read_end(conn_token, int) noexcept override {}
  void on_read_paused(conn_token) noexcept override {}
  void on_send_done(conn_token, int) noexcept override {}
  void on_writable(conn_token) noexcept override {}
  void on_timer(std::uint32_t) noexcept override {}
  void on_flush(std::uint32_t) noexcept override {}
  void on_turn() noexcept override;
  void on_tick(std::uint32_t tick) noexcept override;
  void on_ready(std::uint64_t key, bool r, bool w) noexcept override;
  std::uint64_t on_drain_begin() noexcept override;
  std::uint64_t close_some(std::uint64_t) noexcept override { return 0; }
  bool empty() const noexcept override { return true; }

  // redis_link::listener
  void on_link_up(redis_link& l) noexcept override;
  void on_link_down(redis_link& l, const std::string& why) noexcept override;
  void on_push(redis_link& l, const resp::reply& r) noexcept override;
  void watch_stall() noexcept;

  std::uint32_t home_of(std::string_view topic) const noexcept;  // the Redis that holds it (none: not known yet)
  instance* home(std::string_view topic) noexcept;
  instance& of_link(const redis_link& l) noexcept;
  void refresh_up() noexcept;
  // Names in Redis: a topic's stream key and channel, a Redis's own channel for this node.
  void name_into(std::string& out, std::uint32_t slot, std::string_view what, std::string_view topic) const;
  std::string stream_key(std::string_view topic) const;
  std::string channel_of(std::string_view topic) const;
  std::string_view topic_of_channel(std::string_view channel) const noexcept;
  // Redis Cluster (redis_bus_cluster.cpp).
  void ask_map() noexcept;
  // Sentinel (redis_bus_sentinel.cpp)
  bool sentinel() const noexcept { return !_o.master_name.empty(); }
  /// A Redis of the bus for the log (bus thread): its URL; under Sentinel the address it was
  /// given and the master's name.
  std::string where(const instance& in) const;
  void ask_sentinel() noexcept;
  void sentinel_answered(const resp::reply* r) noexcept;
  void sentinel_failed(const std::string& why) noexcept;
  void sentinel_link_down(redis_link& l, const std::string& why) noexcept;
  void watch_sentinels() noexcept;
  void watch_failed(const std::string& why) noexcept;
  void watch_up() noexcept;
  void sentinel_message(const resp::reply& r) noexcept;
  void map_arrived(const resp::reply* r) noexcept;
  void apply_map(const cluster_map& m, const std::string& from_host);
  void rehome(const std::string& topic, std::uint32_t to) noexcept;
  void unsettle(std::uint64_t pid, std::vector<std::uint64_t>& subs) noexcept;
  void lose_subscription(topic_state& ts, const std::string& topic) noexcept;
  void moved_off(instance& in, const std::string& topic) noexcept;
  topic_state& state_of(const std::string& topic);
  bool post(request&& r, std::string_view topic = {}, std::string_view data = {}, bool wake = true,
            std::string_view idempotency_key = {}) noexcept;
  void take_requests() noexcept;
  void handle(request& r) noexcept;
  void handle_sub(std::unique_ptr<pubsub::bus_sub> s) noexcept;
  void handle_release(std::uint32_t shard, const std::string& topic) noexcept;
  void gather_publish(request& r) noexcept;
  void send_publishes() noexcept;  // every Redis's
  void send_publishes(instance& in) noexcept;
  void send_batch(instance& in, std::span<request* const> run) noexcept;
  void publish_refused(request& r) noexcept;
  void publishes_answered(op& o, const resp::reply* r) noexcept;
  void replicas_answered(op& o, const resp::reply* r) noexcept;
  void follow_with_wait(instance& in, op& o) noexcept;
  void drop_next_wait(instance& in) noexcept;
  void settle_pub(batched_pub& b, bus_publish result, std::string_view text) noexcept;
  void on_sub_message(instance& in, const resp::reply* r) noexcept;
  void confirmed(instance& in, const std::string& topic) noexcept;
  void unsubscribed(instance& in, const std::string& topic) noexcept;
  void advance(std::uint64_t pid) noexcept;
  void start_replay(std::uint64_t pid) noexcept;
  static std::uint32_t next_part(const pending& p, std::uint32_t from) noexcept;
  void queue_page(std::uint64_t pid, std::uint32_t part) noexcept;
  void pump_pages(instance& in) noexcept;
  void maybe_finish(std::uint64_t pid) noexcept;
  void finish(std::uint64_t pid, pending& p) noexcept;
  void fail_pending(pending& p) noexcept;
  void drop_pending(std::uint64_t pid) noexcept;
  void unhook(const pending& p) noexcept;
  void enlist(std::uint64_t pid) noexcept;
  bool all_up(const pending& p) const noexcept;
  void park(std::uint64_t pid) noexcept;
  void unpark_ready() noexcept;
  void expire_held() noexcept;
  void send_mark(instance& in) noexcept;
  void mark_arrived(instance& in, std::string_view payload) noexcept;
  void announce_lost(const std::string& topic) noexcept;
  void forget(std::unordered_map<std::uint64_t, pending>::iterator it) noexcept;
  void handle_withdraw(std::uint32_t shard, std::uint64_t request) noexcept;
  // Presence (redis_bus_presence.cpp).
  struct presence_waiter;
  void gather_presence(request& r) noexcept;
  void send_presence(instance& in) noexcept;
  void handle_presence_get(request& r) noexcept;
  void presence_got(op& o, const resp::reply* r) noexcept;
  void answer_presence(std::uint32_t shard, conn_id conn, std::uint64_t request, bool count_only, std::string topic,
                       pubsub::presence_answer a) noexcept;
  void refresh_presence() noexcept;
  void join_leave(std::string_view topic, std::string_view payload) noexcept;
  // Revokes (redis_bus_revoke.cpp).
  bool revokes_shared() const noexcept;
  bool control_home(const instance& in) const noexcept;
  std::uint32_t control_index() const noexcept;
  void subscribe_control(instance& in) noexcept;
  void control_moved() noexcept;
  void handle_revoke(std::string sub, std::int64_t at) noexcept;
  bool send_revoke(instance& in, const std::string& sub, std::int64_t at) noexcept;
  void control_up(instance& in) noexcept;
  void read_revocations(instance& in, std::int64_t from, std::uint32_t skip) noexcept;
  void revocations_loaded(const op& o, const resp::reply* r) noexcept;
  void control_message(std::string_view payload) noexcept;
  void handle_more(std::uint32_t shard, std::uint64_t request, std::uint64_t room) noexcept;
  void send_page(std::uint64_t pid, pending& p, std::uint32_t next) noexcept;
  pool::frame_ref lost_frame(std::string_view topic) noexcept;
  void answer_sub(pending& p, std::unique_ptr<pubsub::bus_reply> r, pubsub::bus_reply::kind_t kind) noexcept;
  void pub_failed(std::uint32_t shard, std::uint64_t tag, std::string topic, bool maybe = false) noexcept;
  void pub_answered(std::size_t bytes) noexcept;
  void live(std::string_view topic, std::string_view payload) noexcept;
  void marker(std::string_view payload) noexcept;
  void send_batches(instance& in) noexcept;
  void connect_links(instance& in) noexcept;
  void went_down(instance& in, const std::string& why, redis_link* gone = nullptr) noexcept;
  void setup_command_link(instance& in) noexcept;
  void setup_subscriber_link(instance& in) noexcept;
  void ready_check(instance& in) noexcept;
  void setup_refused(instance& in, std::string_view error) noexcept;
  void start_catchup(const std::string& topic) noexcept;
  void note_catchup_start(topic_state& ts, const std::string& topic) noexcept;
  std::string mark_moment(const instance& in, std::string_view topic) const;
  void add_positions(const pending& p, pubsub::bus_reply& r);
  bool command(instance& in, std::initializer_list<std::string_view> args, op* o) noexcept;
  void send_auth(redis_link& link, instance& in) noexcept;
  bool command_on(redis_link& link, instance& in, std::span<const std::string_view> args, op* o,
                  bool delete_unsent = true) noexcept;
  bool command(instance& in, std::span<const std::string_view> args, op* o) noexcept;
  void offer(std::uint32_t shard, pubsub::event&& e) noexcept;
  void offer_all(const pool::frame_ref& frame, std::string_view topic) noexcept;
  void offer_at(const pool::frame_ref& frame, std::size_t topic_offset, std::size_t topic_size) noexcept;
  pool::frame_ref frame_event(std::string_view topic, std::string_view id, std::string_view data) noexcept;
  bool valid_data(std::string_view data) noexcept;

  redis_bus_options _o;
  pool::buffer_pool& _buffers;
  compression* _compression = nullptr;
  std::vector<pubsub::event_port*> _ports;
  std::vector<std::deque<pubsub::event>> _backlog;  // per shard: what its inbox refused, in order
  std::vector<std::vector<std::uint64_t>> _pubs_done;  // per shard: clients' pubs Redis took this turn
  std::atomic<std::size_t> _pub_bytes{0};  // clients' pubs queued or sent, not yet answered (bytes)
  loop _loop;
  std::thread _thread;
  std::atomic<bool> _running{false};
  std::atomic<bool> _stalled{false};
  std::atomic<bool> _all_up{false}, _any_up{false};  // refresh_up()

  // Requests from other threads.
  std::mutex _req_m;
  std::vector<request> _requests, _taking;
  std::atomic<bool> _unwoken{false};  // publish_queue posted without waking the loop
  bool _node_bytes_asked = false;      // stream-node-max-bytes is asked of the first Redis set up
  // Scratch for a command's arguments (command(): kept, so that a command allocates nothing
  // once warm).
  std::vector<std::string_view> _argv;
  std::vector<const char*> _argp;
  std::vector<std::size_t> _argl;

  // The bus thread's state.
  std::vector<std::unique_ptr<instance>> _instances;  // each Redis, in --bus order (a cluster: each master seen)
  std::atomic<std::uint32_t> _instance_count{0};      // any thread reads the instances below it
  std::string _node_id;       // this node's, in its own channels
  std::string _node_channel;  // this node's own channel on each Redis (markers, marks; a cluster: per master)
  std::string _node_suffix;   // ":node:<id>": how each of its channels ends
  // Redis Cluster: which master serves each slot (any thread reads it: up_for), the link that
  // asks a node for the map, the addresses it asks in turn, each slot's epoch as last seen in an
  // id, and the library with the limits written in.
  std::unique_ptr<std::atomic<std::uint16_t>[]> _slot_owner;
  std::unique_ptr<redis_link> _probe;  // a cluster's map link, or the link a Sentinel is asked on
  std::unique_ptr<redis_link> _watch;  // Sentinel: subscribed to +switch-master
  std::size_t _sentinel_at = 0;        // the Sentinel asked (in turn, past one that fails)
  bool _sentinel_asking = false;
  std::uint32_t _sentinel_asked_tick = 0;
  std::size_t _watch_at = 0;           // the Sentinel watched
  std::uint32_t _watch_retry = 0, _watch_connect_tick = 0;
  std::vector<std::pair<std::string, std::uint16_t>> _map_sources;
  std::size_t _next_source = 0;
  std::string _probe_host;  // the host the map link is connected to
  bool _map_wanted = true, _map_in_flight = false;
  std::uint32_t _next_map_tick = 0;
  bool _map_covered = false;
  std::vector<std::string> _slot_epoch;
  std::string _library;  // wspush.lua with the namespaces (and under Redis Cluster the limits) written in
  std::vector<std::string> _keys;  // scratch: a batch's stream keys
  mutable std::mutex _why_m;       // guards each instance's why_down
  std::string _wait_args[2];       // WAIT's replicas and milliseconds (durable publishes)
  std::string_view _wait_argv[3];  // WAIT <replicas> <ms>
  std::string _window_ms;          // the idempotency window, as keyed batches pass it
  std::uint32_t _tick = 0;
  std::size_t _revocations_read = 0;  // the list's entries read so far, page after page
  const pubsub::presence_table* _presence = nullptr;  // set_presence: what the node says again
  const user_table* _presence_users = nullptr;
  std::uint32_t _presence_part = 0;       // the refresh's next part of the table
  std::uint32_t _presence_next_tick = 0;  // when it goes on
  std::unordered_map<std::string, topic_state> _topics;
  std::unordered_map<std::uint64_t, pending> _pending;
  std::unordered_map<std::uint64_t, std::uint64_t> _pid_of_request;  // a sub's request_key -> its pending
  std::deque<std::uint64_t> _held_subs;   // subs waiting for a Redis to come back, oldest first
  std::atomic<std::uint32_t> _held{0};    // how many (any thread reads it: the bound)
  std::uint64_t _order = 0;               // counts marks and last events, to tell which came later
  std::uint64_t _next_pid = 1;
  std::unordered_map<std::uint64_t, std::shared_ptr<waiter>> _tickets;  // admin publishes under way
  std::mutex _tickets_m;
  std::uint64_t _next_ticket = 1;
  std::mutex _notify_m;  // set_publish_notify on the admin's starting thread, calls on the bus thread
  publish_notify _notify;
  std::vector<std::uint64_t> _settled;  // bus thread: tickets settled this turn, told at its end
  std::atomic<std::thread::id> _bus_thread{};  // whose notify_settled calls are batched
  revoke_handler _on_revoke;
  std::deque<std::pair<std::string, std::int64_t>> _unsent_revokes;  // made while the control's Redis was away
  std::uint32_t _control_at = 0xFFFF;  // under Redis Cluster: the instance whose subscriber link has the control channel
  simdjson::dom::parser _json;
  std::string _scratch;
  redis_bus_counters _n;
};

}  // namespace wspush::server::bus
