#pragma once
/// \file bus_port.hpp
/// What a shard's session asks of a bus outside the process (Redis, for many nodes), and what
/// comes back. With the embedded bus there is no bus_port: the hub and the history live in
/// the process and a `sub` is answered at once. With one, a `sub` is a request: the bus makes
/// sure the subscription is active on the bus (and reads the history for `since`), then
/// answers through the shard's event inbox, in order with the events it hands the shard, so
/// the seam between replay and live stays exact (bus/redis_bus.hpp says how).
///
/// A shard "holds" a topic while any of its connections is subscribed to it or waiting for a
/// `sub` of it; the bus is subscribed to a topic while any shard holds it. A `sub` says which
/// of its topics the shard starts holding with it; release() says when a shard stops.

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "pool/shared_frame.hpp"
#include "server/conn/app.hpp"
#include "server/pubsub/revoke.hpp"

namespace wspush::server::pubsub {

/// Users a presence answer lists at most (every one is counted): a client that wants more asks
/// for the counts (`presence_count`).
inline constexpr std::size_t max_presence_users = 1000;

/// A topic's presence across the nodes of the bus: its users (at most as many as asked) with
/// their connections, and the counts of all of them.
struct presence_answer {
  bool ok = false;  ///< false: the bus could not answer (down, or no answer in time)
  std::vector<std::pair<std::string, std::uint32_t>> users;
  std::uint64_t user_count = 0, connections = 0;
};

/// A connection's `sub` on its way to the bus.
struct bus_sub {
  std::uint32_t shard = 0;
  conn_id conn = 0;
  std::uint64_t request = 0;          ///< the session's number for it (a reused slot cannot take the answer)
  std::vector<std::string> topics;     ///< what the client asked for, in its order
  std::vector<std::string> since;      ///< per topic: the id to resume after; empty: none
  std::vector<std::uint8_t> new_hold;  ///< per topic: the shard starts holding it with this sub
  std::vector<std::uint8_t> joins;     ///< per topic: new to the connection (it joins with the answer)
  std::uint64_t room = 0;              ///< what the connection can take now (bytes): a longer
                                       ///< replay goes in pages of about that much, paced
};

/// What comes back for a bus_sub, or for clients' pubs (each pub is answered: done, in a batch,
/// or failed, alone).
///
/// A replay longer than a page is paced by the client's reads: `subbed` with `more` set brings
/// the first page (the connection does not join the topics' subscribers yet); each more() asked
/// brings the next page (replay_more), or, once every page is out, replay_done with the live
/// events kept aside meanwhile, newer than the replay: then the connection joins. A sub_failed
/// may come instead of any of them.
///
/// `revoke` is no answer of the bus but travels the same way, with either bus: a revoked user's
/// connections are to be closed on the shard (revoke.hpp).
struct bus_reply {
  enum kind_t : std::uint8_t { subbed, sub_failed, pub_failed, pubs_done, replay_more, replay_done, revoke, presence } kind = subbed;
  bool more = false;                     ///< subbed: pages follow (replay_more ..., replay_done)
  bool maybe = false;                    ///< pub_failed: sent, and no answer came: it may have been published
  conn_id conn = 0;
  std::uint64_t request = 0;
  std::vector<std::string> topics;       ///< the sub's topics (its holds stay held: see session)
  std::vector<std::uint8_t> new_hold;    ///< as in the bus_sub
  std::vector<std::string> lost;         ///< topics whose history did not reach back to `since`
                                         ///< (replay_done: found so after `subbed`)
  std::vector<std::string> at;           ///< subbed: beside `topics`, each one's position ("": none)
  std::vector<pool::frame_ref> frames;   ///< the replay, oldest first, topic after topic
  std::string pub_topic;                 ///< pub_failed: the topic of the pub
  std::uint64_t pub_tag = 0;             ///< pub_failed: the tag the session gave it
  std::vector<std::uint64_t> done_tags;  ///< pubs_done: the tags of pubs Redis took
  revoke_share revoked;                  ///< revoke: the shard's share of the order
  presence_answer present;               ///< presence: the answer (`request`, `conn`: the ask's; topics[0]: its topic)
  bool count_only = false;               ///< presence: presence_count was asked
};

/// Receives the bus's replies on the shard's thread (the session).
class bus_reply_handler {
 public:
  virtual ~bus_reply_handler() = default;
  virtual void on_bus_reply(std::unique_ptr<bus_reply> r) noexcept = 0;
};

class bus_port {
 public:
  virtual ~bus_port() = default;
  /// The bus is connected and ready (any thread). While it is not, subs and pubs are refused.
  virtual bool up() const noexcept = 0;
  /// Shard thread. False: refused (the bus is down); nothing was taken.
  virtual bool subscribe(std::unique_ptr<bus_sub> s) noexcept = 0;
  /// Shard thread: the shard no longer holds `topic`. Never refused.
  virtual void release(std::uint32_t shard, std::string_view topic) noexcept = 0;
  /// Shard thread: the connection of the sub numbered `request` (bus_sub::request) closed
  /// while it waits. The bus may give up on it now, answering sub_failed, rather than when it
  /// would have answered; the answer comes either way. Never refused.
  virtual void withdraw(std::uint32_t shard, std::uint64_t request) noexcept = 0;
  /// Shard thread: the connection of the sub numbered `request`, answered `subbed` with `more`
  /// set, has `room` bytes for the next page of its replay (asked once per page received; a
  /// page holds about that much, and at least one event). Never refused.
  virtual void more(std::uint32_t shard, std::uint64_t request, std::uint64_t room) noexcept = 0;
  /// Any thread: whether the bus can read `id` as a `since` (an id of another epoch can be
  /// read: it is answered `lost`). False: the client's `sub` is bad_request, and nothing is
  /// asked of the bus.
  virtual bool readable_since(std::string_view id) const noexcept = 0;
  /// A client's pub (shard thread); `tag` is the session's, handed back in its answer;
  /// `idempotency_key` empty (none) or valid: a key published on the topic within the window
  /// is not published again, and the pub is answered as taken (pubs_done). False: refused at
  /// once (down, or the node's bound on pubs in flight is reached). Otherwise it is answered
  /// later: in a pubs_done reply, or a pub_failed one.
  virtual bool publish(std::uint32_t shard, std::uint64_t tag, std::string_view topic, std::string_view data,
                       std::string_view idempotency_key) noexcept = 0;
  /// Shard thread, for a topic whose namespace keeps presence: this node has `connections` of
  /// `user`'s connections subscribed to `topic` now (0: none left). `announce`: the namespace
  /// announces joins and leaves, which the bus publishes to every node's subscribers of the topic
  /// when the user's first connection anywhere comes, or its last goes. Never refused (a word
  /// lost while the bus is down is said again by the bus's refresh).
  virtual void presence_set(std::string_view topic, std::string_view user, std::uint32_t connections,
                            bool announce) noexcept = 0;
  /// Shard thread: asks for `topic`'s presence across the nodes (at most max_presence_users
  /// users listed; `count_only`: none). Answered with a bus_reply of kind presence carrying
  /// `conn` and `request`. False: refused at once (down; out of memory).
  virtual bool presence_get(std::uint32_t shard, conn_id conn, std::uint64_t request, std::string_view topic,
                            bool count_only) noexcept = 0;
};

}  // namespace wspush::server::pubsub
