// wspush browser client: one source, served as /wspush.mjs (an ES module) and /wspush.js (a
// classic script that sets window.WsPush). No dependencies; runs in Node 20+ when given a
// WebSocket class ({WebSocket} in the options), and an EventSource class for the event-stream
// fallback ({EventSource}; without one it stays on WebSocket).
//
//   const c = new WsPush("wss://push.example.com/ws", {token, getToken});
//   c.subscribe("mailbox:42", (event) => show(event.data));   // event = {topic, id, data}
//   c.on("state", (s, transport) => ...);   // connecting, open, reconnecting, auth_failed, closed
//                                            // over "websocket" or "sse" (c.transport)
//   c.on("lost", (topics) => ...);   // history no longer reaches back: resynchronise
//   c.on("subscription", ({topic, state}) => ...);   // c.topicState(topic), below
//   const {users, userCount, connections, truncated} = await c.presence("room:7");  // {sub: n}
//   const {userCount, connections} = await c.presenceCount("room:7");
//   c.on("join", ({topic, user}) => ...);    // a user's first connection subscribed to a topic
//   c.on("leave", ({topic, user}) => ...);   // the page subscribed to; its last one left it
//   c.close();
//
// Behaviour a million tabs sharing one server need (DESIGN.md "Browser client"):
// - reconnects by itself, after a delay drawn with full jitter from an exponentially growing,
//   capped window, so a fleet that loses its server comes back spread out, not in one second;
// - resumes every topic with `since` (the last id seen per topic; before the first one, or after
//   a "lost", the position `subbed` gave): nothing is missed inside the server's history window;
//   topics it no longer reaches are reported with "lost", once;
// - asks for the heartbeat a page can see (?heartbeat=1), answers {"op":"ping"}, and reconnects
//   when it has heard nothing for heartbeatTimeout;
// - refreshes its token in-band ({"op":"auth"}) at a jittered point late in the token's life;
//   a 1008 close (with a token) or a refused upgrade makes it ask getToken once, and if that
//   fails it stops with "auth_failed"; so does a revoke (close 4403 "revoked", or a stream's
//   `refused` event with code "revoked"): the same token is never tried again, and without
//   getToken the client stops with "auth_failed" at once;
// - sends a `sub` refused with `unavailable` (the server's bus could not take it: Redis away)
//   again after a full-jitter delay from a window of 0.5 s doubling to 30 s, for the topics the
//   page still wants, until one is answered `subbed` (which resets the window) or the connection
//   is replaced (the new one subscribes everything anyway). Other refusals (forbidden,
//   too_many_subscriptions, bad_request) are not retried on that connection. The page sees each
//   refusal as "error" ({code, topic}) and where each topic stands as c.topicState(topic):
//   "subscribing" (asked, or to be asked once connected), "subscribed" (answered `subbed` on this
//   connection), "retrying" (refused `unavailable`, asked again after the delay), "refused"
//   (another refusal) or null (not subscribed by the page); every change is a "subscription"
//   event ({topic, state}).
// - an error that answers a `pub` carries "of":"pub" (the client has no method to publish, but a
//   pub is answered on the connection only if it fails, and may come after later subs' answers):
//   it answers no sub, unsub or auth waiting, and is an "error" event ({code, topic, of: "pub"}):
//   "timeout" (it went to the server's Redis and the link broke before the answer: it may have
//   been published, and a resend may publish it twice), "unavailable" (it was not published:
//   safe to send again), or "forbidden".
// - falls back to Server-Sent Events where WebSocket does not pass (a proxy that refuses the
//   upgrade): with transport "auto" (the default), once its first fallbackAfter (3) WebSocket
//   tries in a row have failed and none ever opened, it receives over EventSource from the
//   server's event-stream path (ws://host/ws -> http://host/sse; option sseUrl), with the same
//   API; transport "sse" uses only that, "websocket" never falls back. A stream's topics are
//   fixed when it opens, so a subscribe, an unsubscribe, a token refresh or a retry reopens it
//   with ?since= (the per-topic positions, in the stream's topic order; empty for a topic without
//   one): the old stream is closed first, so nothing is missed or doubled. The token goes as
//   ?token= (EventSource sends no headers). A stream names at most 16 topics: more take more
//   streams. A stream that breaks or ends is reopened by the client (with its backoff, and
//   `since`), not by EventSource. On streams it tries WebSocket again every 30-60 s (a draw from
//   [wsRetryInterval / 2, wsRetryInterval]; right away after falling back) and moves back when
//   one opens, resuming with `since` once the streams are closed. Over streams there is no
//   heartbeat (EventSource hides the keepalive) and no pub; in "auto", fallbackAfter stream
//   opens failing in a row send it back to trying WebSocket.
// - presence (a topic whose namespace keeps it, server --presence): presence(topic) asks
//   {"op":"presence"} and resolves with {users: {sub: connections}, userCount, connections,
//   truncated} (the server lists at most 1000 users, then truncated is true; userCount counts
//   all), presenceCount(topic) asks {"op":"presence_count"} and resolves with {userCount,
//   connections}. An error answer rejects with an Error whose .code is the server's
//   ("not_enabled", "forbidden", "unavailable", "rate_limited", ...); a connection that closes
//   before the answer rejects with "closed" (nothing is asked again: the page asks anew), as
//   does close() or auth_failed. Asked while connecting, it is sent once the connection opens.
//   The server answers a connection's messages in order, so a presence answer is matched to the
//   oldest request waiting (the same queue as sub, unsub and auth), of its op and topic. Over
//   event streams nothing can be asked: it rejects with "unsupported".
// - join/leave (a topic whose namespace announces them, server --join-leave): "join" and
//   "leave" events ({topic, user}, user the token's `sub`) for the topics the page subscribed
//   to, over WebSocket and over event streams alike; the server announces a user's first
//   connection to subscribe and its last one to leave, the page's own user included. They are
//   not kept in the history: what happened while the client was away is not replayed (ask
//   presence() after a reconnect). A stream's reopen (a subscribe, an unsubscribe, a token
//   refresh) is a leave and a join of the page's user to the others when it has no other
//   connection there.

/* global globalThis */

const CLOSE_NORMAL = 1000;
const CLOSE_GOING_AWAY = 1001;
const CLOSE_POLICY = 1008;
const CLOSE_REVOKED = 4403; // the user was revoked: this token will not do again
const CLOSE_TRY_LATER = 1013;

const FALLBACK_AFTER = 3;          // WebSocket tries failed in a row (none ever open) before streams
const WS_RETRY_INTERVAL = 60000;   // ms: on streams, WebSocket is tried again after a draw from [1/2, 1] of it
const SSE_MAX_TOPICS = 16;         // the server's limit of topics per event stream

/// Full jitter (the "full jitter" of exponential backoff): a delay drawn uniformly from
/// [0, min(maxDelay, baseDelay * 2^attempt)].
function backoffDelay(attempt, baseDelay, maxDelay, random = Math.random) {
  const window = Math.min(maxDelay, baseDelay * 2 ** Math.min(attempt, 30));
  return Math.floor(random() * window);
}

/// The `exp` claim (unix seconds) of a JWT, or 0 when it cannot be read. The client reads it
/// only to schedule refreshes; the server checks the token.
function tokenExpiry(token) {
  try {
    const part = String(token).split(".")[1];
    if (!part) return 0;
    const b64 = part.replace(/-/g, "+").replace(/_/g, "/");
    const json = typeof atob === "function" ? atob(b64) : globalThis.Buffer.from(b64, "base64").toString("binary");
    const exp = JSON.parse(json).exp;
    return typeof exp === "number" && isFinite(exp) ? exp : 0;
  } catch {
    return 0;
  }
}

/// The event-stream URL beside a WebSocket URL: http(s) for ws(s), the last path segment "sse"
/// (ws://host/ws -> http://host/sse, wss://host/push/ws -> https://host/push/sse).
function sseUrlOf(wsUrl) {
  const url = new URL(wsUrl);
  url.protocol = url.protocol === "wss:" || url.protocol === "https:" ? "https:" : "http:";
  url.pathname = url.pathname.replace(/[^/]*$/, "sse");
  url.hash = "";
  return url.toString();
}

/// A presence request's rejection: an Error with the code (the server's, or "closed",
/// "unsupported") and the topic.
function presenceError(q, code) {
  const e = new Error(`WsPush: ${q.op} of ${q.topic}: ${code}`);
  e.code = code;
  e.topic = q.topic;
  return e;
}

class WsPush {
  /// url: ws:// or wss:// URL of the server's WebSocket path. Options:
  ///   token           the JWT (omit with a server run with --auth=none)
  ///   getToken        async () => a fresh token (or null): refresh before expiry, and after a
  ///                   refused token; without it an expired token ends in "auth_failed"
  ///   WebSocket       the WebSocket class (default: the browser's)
  ///   baseDelay, maxDelay         reconnect window, ms (default 1000 and 30000): the n-th try in
///                               a row waits a uniform draw from [0, min(max, base * 2^n)];
///                               losing an open connection starts the tries at n = 1 (a 2 s
///                               window: a fleet that lost its server comes back spread out);
///                               a server that asked to be left alone (1001 going away, 1013
///                               try later) at n = 2 (4 s)
  ///   heartbeatTimeout            ms without a byte before the connection is taken for dead
  ///                               (default 45000: the server's default ping interval 30 s +
  ///                               pong timeout 10 s + a margin)
  ///   refreshAt       [from, to]: fractions of the token's life at which to refresh (default
  ///                   [0.75, 0.9], a uniform draw)
  ///   retryBaseDelay, retryMaxDelay   the window a `sub` refused `unavailable` is sent again
  ///                   after, ms (default 500 and 30000): the n-th retry in a row waits a uniform
  ///                   draw from [0, min(max, base * 2^n)]
  ///   transport       "auto" (default: WebSocket, event streams where it never opens),
  ///                   "websocket" (never falls back) or "sse" (event streams only)
  ///   EventSource     the EventSource class (default: the browser's; in Node, without one, no
  ///                   fallback)
  ///   sseUrl          the event-stream URL (default: from url, ws://host/ws -> http://host/sse)
  ///   fallbackAfter   WebSocket tries failed in a row, none ever open, before "auto" moves to
  ///                   event streams (default 3); as many failed stream opens move it back
  ///   wsRetryInterval on streams ("auto"), WebSocket is tried again after a draw from
  ///                   [wsRetryInterval / 2, wsRetryInterval] ms (default 60000)
  ///   random          () => [0, 1): for tests
  constructor(url, options = {}) {
    this._url = url;
    this._opts = options;
    this._token = options.token || null;
    this._mode = options.transport ?? "auto";
    if (!["auto", "websocket", "sse"].includes(this._mode)) throw new Error(`WsPush: unknown transport ${this._mode}`);
    this._WebSocket = options.WebSocket || globalThis.WebSocket;
    this._EventSource = options.EventSource || globalThis.EventSource || null;
    if (this._mode === "sse" && !this._EventSource) throw new Error("WsPush: no EventSource class (pass {EventSource} in Node)");
    if (this._mode !== "sse" && !this._WebSocket) throw new Error("WsPush: no WebSocket class (pass {WebSocket} in Node)");
    this._sseUrl = options.sseUrl || sseUrlOf(url);
    this._fallbackAfter = options.fallbackAfter ?? FALLBACK_AFTER;
    this._wsRetry = options.wsRetryInterval ?? WS_RETRY_INTERVAL;
    this._transport = this._mode === "sse" ? "sse" : "websocket";
    this._failures = 0; // tries of this transport in a row that failed before they opened
    this._wsOpened = false; // a WebSocket of this client has opened: "auto" no longer falls back
    this._streams = []; // the event streams in use: {es, topics, opened}
    this._probe = null; // a WebSocket tried while on event streams
    this._probeSoon = false; // just fell back: try WebSocket once the streams are open
    this._base = options.baseDelay ?? 1000;
    this._max = options.maxDelay ?? 30000;
    this._heartbeat = options.heartbeatTimeout ?? 45000;
    this._refreshAt = options.refreshAt ?? [0.75, 0.9];
    this._random = options.random ?? Math.random;
    this._retryBase = options.retryBaseDelay ?? 500;
    this._retryMax = options.retryMaxDelay ?? 30000;
    this._topics = new Map(); // topic -> {callbacks: Set, since: position or null, last: id delivered, state}
    // What this connection asked and the server has not answered yet, oldest first: the server
    // answers a connection's sub, unsub and auth each once, in order, so an answer (subbed,
    // unsubbed, authed or error) is always the head's. A sub's entry is its topic list.
    // A presence request's entry is {op, topic, resolve, reject}.
    this._asked = [];
    this._presenceWaiting = []; // presence asked before the connection opened
    this._retryAttempt = 0; // retries in a row since a sub was last answered `subbed`
    this._listeners = new Map(); // event name -> Set of callbacks
    this._ws = null;
    this._state = "closed";
    this._shownTransport = this._transport;
    this._attempt = 0;
    this._timers = { reconnect: null, heartbeat: null, refresh: null, retry: null, probe: null, reopen: null };
    this._closedByUser = false;
    this._askedForToken = false; // getToken was asked after a refusal and not yet confirmed
    this._connect();
  }

  get state() {
    return this._state;
  }

  /// What the client receives over (or is trying): "websocket" or "sse".
  get transport() {
    return this._transport;
  }

  /// Where the subscription to `topic` stands: "subscribing", "subscribed", "retrying",
  /// "refused", or null when the page has not subscribed to it (header comment).
  topicState(topic) {
    const t = this._topics.get(topic);
    return t ? t.state : null;
  }

  /// Calls `callback({topic, id, data})` for every event of `topic`; several callbacks may share
  /// a topic. Returns a function that removes this callback.
  subscribe(topic, callback) {
    let t = this._topics.get(topic);
    if (!t) {
      t = { callbacks: new Set(), since: null, last: null, state: null };
      this._topics.set(topic, t);
      this._setTopicState(topic, "subscribing");
      this._sendSub([topic]);
    }
    t.callbacks.add(callback);
    return () => {
      t.callbacks.delete(callback);
      if (t.callbacks.size === 0) this.unsubscribe(topic);
    };
  }

  unsubscribe(topic) {
    if (!this._topics.delete(topic)) return;
    if (this._transport === "sse") return this._reopenSoon();
    this._send({ op: "unsub", topics: [topic] }, "unsub");
  }

  /// Who is subscribed to `topic` now: a Promise of {users: {sub: connections}, userCount,
  /// connections, truncated}; rejects with an Error carrying .code (header comment).
  presence(topic) {
    return this._askPresence("presence", topic);
  }

  /// How many users and connections are subscribed to `topic`: a Promise of {userCount,
  /// connections}; rejects as presence() does.
  presenceCount(topic) {
    return this._askPresence("presence_count", topic);
  }

  /// Events: "state" (s, transport), "lost" (topics), "error" ({code, topic}) for refused
  /// requests ({code, topic, of: "pub"} for a pub), "subscription" ({topic, state}) when
  /// topicState(topic) changes, "join" and "leave" ({topic, user}) on topics that announce them.
  on(event, callback) {
    if (!this._listeners.has(event)) this._listeners.set(event, new Set());
    this._listeners.get(event).add(callback);
    return () => this._listeners.get(event).delete(callback);
  }

  /// Closes with 1000 and stays closed.
  close() {
    this._closedByUser = true;
    this._clearTimers();
    this._failPresence("closed", true);
    this._closeStreams();
    this._stopProbe();
    if (this._ws) {
      try {
        this._ws.close(CLOSE_NORMAL);
      } catch {
        // already closing
      }
    }
    this._setState("closed");
  }

  // ---- connection ---------------------------------------------------------------------------

  _connect() {
    if (this._closedByUser) return;
    this._setState(this._attempt === 0 ? "connecting" : "reconnecting");
    if (this._transport === "sse") return this._openStreams();
    this._dial(false);
  }

  /// A WebSocket: the connection (probe false), or a try of WebSocket while on event streams
  /// (probe true), which becomes the connection if it opens.
  _dial(probe) {
    const url = new URL(this._url);
    url.searchParams.set("heartbeat", "1");
    if (this._token) url.searchParams.set("token", this._token);
    let ws;
    try {
      ws = new this._WebSocket(url.toString());
    } catch {
      if (probe) return this._armProbe();
      this._openFailed();
      return this._scheduleReconnect();
    }
    if (probe) this._probe = ws;
    else this._ws = ws;
    let opened = false;
    let refused = false;
    if (typeof ws.on === "function") {
      // Node's ws tells what the upgrade was answered; a browser shows any refusal as a close.
      ws.on("unexpected-response", (req, res) => {
        refused = res.statusCode === 401;
        ws.terminate?.();
      });
      ws.on("error", () => {}); // reported through close
    }
    ws.onopen = () => {
      if (probe) {
        if (this._probe !== ws) return;
        // WebSocket passes again: the streams are closed before the sub below is sent, so that
        // its `since` is where they stopped delivering.
        this._probe = null;
        this._clearTimers();
        this._closeStreams();
        this._forgetConnection();
        this._ws = ws;
        this._transport = "websocket";
      }
      opened = true;
      this._wsOpened = true;
      this._attempt = 0;
      this._failures = 0;
      this._asked = [];
      this._retryAttempt = 0;
      this._askedForToken = false;
      this._setState("open");
      this._resubscribe();
      this._sendWaitingPresence();
      this._armHeartbeat();
      this._scheduleRefresh();
    };
    ws.onmessage = (msg) => {
      if (this._ws !== ws) return;
      this._armHeartbeat();
      this._onMessage(typeof msg.data === "string" ? msg.data : String(msg.data));
    };
    ws.onclose = (ev) => {
      if (probe && !opened) {
        // The try failed: stay on the streams, try again later.
        if (this._probe === ws) {
          this._probe = null;
          this._armProbe();
        }
        return;
      }
      if (this._ws !== ws) return;
      this._ws = null;
      this._clearTimers();
      this._forgetConnection();
      if (this._closedByUser) return this._setState("closed");
      const expired = this._token && tokenExpiry(this._token) && tokenExpiry(this._token) * 1000 <= Date.now();
      // A 1008 is about the token only when there is one; without, it was for something the
      // connection sent (the server's limit of refusals in a row): a new connection is the cure.
      const policy = ev.code === CLOSE_POLICY;
      if (ev.code === CLOSE_REVOKED) return this._renewThenReconnect();
      if ((policy && this._token) || refused || (!opened && expired)) return this._renewThenReconnect();
      // A connection that was open is lost: its whole fleet may have lost it at once, so even the
      // first try waits a draw from a 2 s window; a server that is draining or overloaded asked
      // its clients to come back later, and one that closed us for what we sent: 4 s.
      const first = ev.code === CLOSE_GOING_AWAY || ev.code === CLOSE_TRY_LATER || policy ? 2 : opened ? 1 : 0;
      if (this._attempt < first) this._attempt = first;
      if (!opened) this._openFailed();
      this._scheduleReconnect();
    };
  }

  /// A try of the current transport failed before it opened. In "auto", fallbackAfter in a row
  /// move WebSocket to event streams (only while no WebSocket of this client has ever opened:
  /// one that did shows that WebSocket passes, and that its server is only away) and streams
  /// back to WebSocket (the server may be down, or serve no streams).
  _openFailed() {
    this._failures += 1;
    if (this._mode !== "auto" || this._failures < this._fallbackAfter) return;
    if (this._transport === "websocket" && (this._wsOpened || !this._EventSource)) return;
    this._failures = 0;
    this._transport = this._transport === "websocket" ? "sse" : "websocket";
    this._probeSoon = this._transport === "sse";
  }

  // ---- event streams ------------------------------------------------------------------------

  /// Opens the streams of every topic but those refused (SSE_MAX_TOPICS a stream), each from
  /// the topics' positions. With no topic there is nothing to open: the client is open once this
  /// turn is over (as a connection would be later), unless a subscribe came meanwhile.
  _openStreams() {
    this._closeStreams();
    clearTimeout(this._timers.reopen); // a reopen asked for meanwhile is this one
    this._timers.reopen = null;
    const topics = this._streamTopics();
    if (!topics.length) {
      this._timers.reopen = setTimeout(() => {
        this._timers.reopen = null;
        if (this._streamTopics().length) this._openStreams();
        else this._streamsOpen();
      }, 0);
      return;
    }
    for (let i = 0; i < topics.length; i += SSE_MAX_TOPICS) {
      if (!this._openStream(topics.slice(i, i + SSE_MAX_TOPICS))) return;
    }
  }

  _streamTopics() {
    const topics = [];
    for (const [topic, t] of this._topics) if (t.state !== "refused") topics.push(topic);
    return topics;
  }

  /// One stream: `?topics=a,b&since=p,q&token=T`, each topic and position percent-encoded on
  /// its own, joined by plain commas.
  _openStream(topics) {
    const since = topics.map((topic) => this._topics.get(topic).since || "");
    let query = "topics=" + topics.map(encodeURIComponent).join(",");
    if (since.some((p) => p)) query += "&since=" + since.map(encodeURIComponent).join(",");
    if (this._token) query += "&token=" + encodeURIComponent(this._token);
    const url = this._sseUrl + (this._sseUrl.includes("?") ? "&" : "?") + query;
    let es;
    try {
      es = new this._EventSource(url);
    } catch {
      this._streamLost(null);
      return false;
    }
    const s = { es, topics, opened: false };
    this._streams.push(s);
    const live = () => this._streams.includes(s);
    es.addEventListener("open", () => {
      if (!live()) return;
      s.opened = true;
      if (this._streams.every((x) => x.opened)) this._streamsOpen();
    });
    for (const type of ["message", "subbed", "lost", "refused", "join", "leave"]) {
      es.addEventListener(type, (e) => {
        if (live()) this._onStreamMessage(s, e.data);
      });
    }
    es.addEventListener("error", () => {
      if (!live()) return;
      this._streamLost(s); // refused, broken or ended: EventSource would reconnect by itself
    });
    return true;
  }

  /// Every stream has opened (its 200): the client is open; on "auto", WebSocket is tried again.
  _streamsOpen() {
    this._attempt = 0;
    this._failures = 0;
    this._retryAttempt = 0;
    this._askedForToken = false;
    this._setState("open");
    this._failPresence("unsupported", true, true);
    this._scheduleRefresh();
    if (!this._timers.probe && !this._probe) this._armProbe(this._probeSoon ? 0 : undefined);
    this._probeSoon = false;
  }

  _onStreamMessage(s, text) {
    let m;
    try {
      m = JSON.parse(text);
    } catch {
      return;
    }
    if (m.topic !== undefined && m.id !== undefined && !m.op) return this._onEvent(m);
    switch (m.op) {
      case "subbed":
        return this._onSubbed(m, s.topics);
      case "lost":
        if (m.topics && m.topics.length) this._emit("lost", m.topics);
        return;
      case "join":
      case "leave":
        return this._onJoinLeave(m);
      case "error": {
        if (m.code === "revoked") {
          // The user was revoked, and the server ends every stream of it: none is reopened
          // with this token (EventSource would), a fresh one is asked for first.
          this._closeStreams();
          this._stopProbe();
          this._clearTimers();
          this._forgetConnection();
          if (this._closedByUser) return this._setState("closed");
          this._emit("error", { code: m.code });
          return this._renewThenReconnect();
        }
        // The stream's sub was refused, and the server ends the stream: close it here (or
        // EventSource would reopen it), and retry `unavailable` later as over WebSocket.
        this._dropStream(s);
        this._answered(s.topics, m.code === "unavailable" ? "retrying" : "refused");
        return this._emit("error", { code: m.code, topic: m.topic });
      }
      default:
        return;
    }
  }

  /// A stream failed to open, broke or ended (s null: the EventSource could not be made): every
  /// stream is closed and opened again after the backoff, each topic from its position.
  _streamLost(s) {
    const opened = !!s && s.opened;
    const wasOpen = this._state === "open"; // a reopen's stream that fails is a lost connection too
    this._closeStreams();
    this._stopProbe(); // the reconnect below tries what comes next
    this._clearTimers();
    this._forgetConnection();
    if (this._closedByUser) return this._setState("closed");
    const expired = this._token && tokenExpiry(this._token) && tokenExpiry(this._token) * 1000 <= Date.now();
    if (expired) return this._renewThenReconnect();
    if (wasOpen && this._attempt < 1) this._attempt = 1; // like a lost connection: a 2 s window first
    if (!opened) this._openFailed();
    this._scheduleReconnect();
  }

  /// The topics changed, or a token or a retry is due: the streams in use (open or opening) are
  /// reopened once this turn is over, so that several changes make one reopen.
  _reopenSoon() {
    if (this._transport !== "sse" || this._timers.reopen) return;
    if (!this._streams.length && this._state !== "open") return; // the next open names every topic
    this._timers.reopen = setTimeout(() => {
      this._timers.reopen = null;
      this._openStreams();
    }, 0);
  }

  _dropStream(s) {
    this._streams = this._streams.filter((x) => x !== s);
    try {
      s.es.close();
    } catch {
      // already closed
    }
  }

  _closeStreams() {
    const streams = this._streams;
    this._streams = [];
    for (const s of streams) {
      try {
        s.es.close();
      } catch {
        // already closed
      }
    }
  }

  _stopProbe() {
    const ws = this._probe;
    this._probe = null;
    if (!ws) return;
    try {
      ws.close(CLOSE_NORMAL);
    } catch {
      // still connecting
    }
    ws.terminate?.();
  }

  /// On streams with transport "auto": a WebSocket is tried after `delay` (default a draw from
  /// [wsRetryInterval / 2, wsRetryInterval]).
  _armProbe(delay) {
    clearTimeout(this._timers.probe);
    this._timers.probe = null;
    if (this._mode !== "auto" || this._transport !== "sse" || this._closedByUser || !this._WebSocket) return;
    const wait = delay ?? Math.floor(this._wsRetry * (0.5 + 0.5 * this._random()));
    this._timers.probe = setTimeout(() => {
      this._timers.probe = null;
      if (this._transport === "sse" && !this._probe && !this._closedByUser) this._dial(true);
    }, wait);
  }

  /// The token was refused (1008, 401), revoked (4403) or has expired: ask for a fresh one once. Without one,
  /// or if the fresh one is refused too, stop: reconnecting would only be refused again.
  async _renewThenReconnect() {
    const getToken = this._opts.getToken;
    if (!getToken || this._askedForToken) return this._authFailed();
    this._askedForToken = true;
    let fresh = null;
    try {
      fresh = await getToken();
    } catch {
      fresh = null;
    }
    if (this._closedByUser) return;
    if (!fresh) return this._authFailed();
    this._token = fresh;
    this._scheduleReconnect();
  }

  _scheduleReconnect() {
    if (this._closedByUser) return;
    const delay = backoffDelay(this._attempt, this._base, this._max, this._random);
    this._attempt += 1;
    this._setState("reconnecting");
    this._timers.reconnect = setTimeout(() => this._connect(), delay);
  }

  /// Nothing heard for heartbeatTimeout (the server pings at its interval): the connection is
  /// dead even if TCP has not noticed. Drop it and reconnect.
  _armHeartbeat() {
    clearTimeout(this._timers.heartbeat);
    this._timers.heartbeat = setTimeout(() => {
      const ws = this._ws;
      if (!ws) return;
      this._ws = null;
      try {
        ws.close(4000);
      } catch {
        // a dead socket may refuse even this
      }
      ws.terminate?.();
      this._clearTimers();
      this._forgetConnection();
      if (this._attempt < 1) this._attempt = 1;  // like any lost connection: a 2 s window first
      this._scheduleReconnect();
    }, this._heartbeat);
  }

  /// In-band refresh at a jittered point late in the token's life: getToken, then {"op":"auth"}.
  _scheduleRefresh() {
    clearTimeout(this._timers.refresh);
    const exp = tokenExpiry(this._token);
    if (!exp || !this._opts.getToken) return;
    const now = Date.now();
    const life = exp * 1000 - now;
    if (life <= 0) return;
    const [from, to] = this._refreshAt;
    const at = life * (from + (to - from) * this._random());
    this._timers.refresh = setTimeout(async () => {
      let fresh = null;
      try {
        fresh = await this._opts.getToken();
      } catch {
        fresh = null;
      }
      if (!fresh || this._state !== "open") return;
      if (this._ws) return this._send({ op: "auth", token: fresh }, "auth", fresh);
      // A stream cannot be told a token: it is reopened with the fresh one, from its positions.
      if (this._transport === "sse") {
        this._token = fresh;
        this._closeStreams();
        this._openStreams();
      }
    }, Math.min(at, 2 ** 31 - 1));
  }

  _authFailed() {
    this._failPresence("closed", true);
    this._setState("auth_failed");
  }

  _askPresence(op, topic) {
    return new Promise((resolve, reject) => {
      const q = { op, topic, resolve, reject };
      if (this._closedByUser || this._state === "auth_failed") return reject(presenceError(q, "closed"));
      if (this._transport === "sse") return reject(presenceError(q, "unsupported"));
      if (this._ws && this._state === "open") return this._send({ op, topic }, q);
      this._presenceWaiting.push(q); // asked once the connection opens
    });
  }

  _sendWaitingPresence() {
    const waiting = this._presenceWaiting;
    this._presenceWaiting = [];
    for (const q of waiting) this._send({ op: q.op, topic: q.topic }, q);
  }

  /// Rejects the presence requests in flight on the connection with `code`, and with `waiting`
  /// those not sent yet too (`onlyWaiting`: those alone).
  _failPresence(code, waiting, onlyWaiting = false) {
    const failed = waiting ? this._presenceWaiting : [];
    if (waiting) this._presenceWaiting = [];
    if (!onlyWaiting) {
      failed.push(...this._asked.filter((a) => a && a.reject));
      this._asked = this._asked.filter((a) => !(a && a.reject));
    }
    for (const q of failed) q.reject(presenceError(q, code));
  }

  /// The answer (or error, `error` its code) to the oldest presence request of `op` on `topic`
  /// waiting; the server answers in order, so it is normally the head of _asked.
  _settlePresence(op, topic, answer, error = null) {
    const i = this._asked.findIndex((a) => a && a.reject && a.op === op && a.topic === topic);
    if (i < 0) return;
    const [q] = this._asked.splice(i, 1);
    if (error) return q.reject(presenceError(q, error));
    if (op === "presence_count") return q.resolve({ userCount: answer.user_count, connections: answer.connections });
    q.resolve({ users: answer.users || {}, userCount: answer.user_count, connections: answer.connections,
      truncated: !!answer.truncated });
  }

  _onJoinLeave(m) {
    if (typeof m.user !== "string" || !this._topics.has(m.topic)) return; // unsubscribed since
    this._emit(m.op, { topic: m.topic, user: m.user });
  }

  _resubscribe() {
    this._sendSub([...this._topics.keys()]);
  }

  /// Subscribes `topics`, each from its `since` if it has one; one message may carry 32 topics.
  /// On event streams: reopens them (their topics are fixed when they open).
  _sendSub(topics) {
    if (this._transport === "sse") return this._reopenSoon();
    for (let i = 0; i < topics.length; i += 32) {
      const chunk = topics.slice(i, i + 32);
      const s = {};
      for (const topic of chunk) {
        const since = this._topics.get(topic)?.since;
        if (since) s[topic] = since;
      }
      this._send(Object.keys(s).length ? { op: "sub", topics: chunk, since: s } : { op: "sub", topics: chunk }, chunk);
    }
  }

  /// `asked`: what the server will answer (a sub's topic list, "unsub", "auth" or a presence
  /// request); null for what it does not answer (pong).
  _send(message, asked = null, pendingToken = null) {
    if (!this._ws || this._state !== "open") return; // sent on (re)connect instead
    if (pendingToken) this._pendingToken = pendingToken;
    if (asked) this._asked.push(asked);
    this._ws.send(JSON.stringify(message));
  }

  /// The connection is gone: nothing asked on it will be answered, and every topic is
  /// subscribed afresh by the next one.
  _forgetConnection() {
    this._failPresence("closed", false);
    this._asked = [];
    this._retryAttempt = 0;
    for (const topic of this._topics.keys()) this._setTopicState(topic, "subscribing");
  }

  /// The server answered the sub `topics` (the head of _asked) with `state` ("subscribed",
  /// "retrying" or "refused"). A topic a later sub in flight names waits for that one's answer.
  _answered(topics, state) {
    for (const topic of topics) {
      if (!this._topics.has(topic)) continue; // unsubscribed since
      if (this._asked.some((a) => Array.isArray(a) && a.includes(topic))) continue;
      this._setTopicState(topic, state);
    }
    if (state === "subscribed") {
      this._retryAttempt = 0;
    } else if (state === "retrying" && !this._timers.retry) {
      const delay = backoffDelay(this._retryAttempt, this._retryBase, this._retryMax, this._random);
      this._retryAttempt += 1;
      this._timers.retry = setTimeout(() => {
        this._timers.retry = null;
        const again = [];
        for (const [topic, t] of this._topics) if (t.state === "retrying") again.push(topic);
        for (const topic of again) this._setTopicState(topic, "subscribing");
        this._sendSub(again);
      }, delay);
    }
  }

  _onMessage(text) {
    let m;
    try {
      m = JSON.parse(text);
    } catch {
      return;
    }
    if (m.topic !== undefined && m.id !== undefined && !m.op) return this._onEvent(m);
    switch (m.op) {
      case "ping":
        return this._send({ op: "pong" });
      case "subbed":
        return this._onSubbed(m, this._asked.shift());
      case "lost": // the server could not catch these topics up after an outage of its bus
        if (m.topics && m.topics.length) this._emit("lost", m.topics);
        return;
      case "unsubbed":
        this._asked.shift();
        return;
      case "presence":
      case "presence_count":
        return this._settlePresence(m.op, m.topic, m);
      case "join":
      case "leave":
        return this._onJoinLeave(m);
      case "authed":
        this._asked.shift();
        if (this._pendingToken) this._token = this._pendingToken;
        this._pendingToken = null;
        if (m.unsubbed && m.unsubbed.length) this._emit("lost", m.unsubbed);
        return this._scheduleRefresh();
      case "error": {
        // A pub is answered only when it fails, and may be later than subs sent after it: its
        // error ("of":"pub") answers none of the requests waiting in _asked.
        if (m.of === "pub") return this._emit("error", { code: m.code, topic: m.topic, of: m.of });
        if (m.of === "presence" || m.of === "presence_count") return this._settlePresence(m.of, m.topic, null, m.code);
        const asked = this._asked.shift();
        // An error without `of` (a message refused before it was read, rate_limited) answers
        // whatever was asked first, a presence request too: its promise says so.
        if (asked && asked.reject) return asked.reject(presenceError(asked, m.code));
        if (asked === "auth" || m.code === "unauthorized") this._pendingToken = null; // the old token stays in force
        if (Array.isArray(asked)) this._answered(asked, m.code === "unavailable" ? "retrying" : "refused");
        return this._emit("error", { code: m.code, topic: m.topic });
      }
      default:
        return;
    }
  }

  /// `subbed` answering the sub of `asked` (its topic list; on a stream, the stream's topics).
  _onSubbed(m, asked) {
    // Each topic new to the connection comes with its position: a resume before its first
    // event starts there, so that what was published while the connection was away is not
    // missed; a topic found lost starts again from there too (it was told once), and the
    // events replayed behind this answer move it on.
    const lost = new Set(m.lost || []);
    for (const [topic, at] of Object.entries(m.at || {})) {
      const t = this._topics.get(topic);
      if (t && (!t.since || lost.has(topic))) t.since = at;
    }
    if (Array.isArray(asked)) this._answered(asked, "subscribed");
    if (m.lost && m.lost.length) this._emit("lost", m.lost);
  }

  _onEvent(event) {
    const t = this._topics.get(event.topic);
    if (!t) return;
    // `since` is what keeps a resume from doubling events; the id delivered last is dropped
    // here too, should a seam between two connections or streams bring it again.
    if (event.id === t.last) return;
    t.since = event.id;
    t.last = event.id;
    for (const cb of t.callbacks) {
      try {
        cb(event);
      } catch (e) {
        setTimeout(() => {
          throw e;
        });
      }
    }
  }

  /// A state, or the same one over another transport, is told: ("state", state, transport).
  _setState(state) {
    if (this._state === state && this._shownTransport === this._transport) return;
    this._state = state;
    this._shownTransport = this._transport;
    this._emit("state", state, this._transport);
  }

  _setTopicState(topic, state) {
    const t = this._topics.get(topic);
    if (!t || t.state === state) return;
    t.state = state;
    this._emit("subscription", { topic, state });
  }

  _emit(event, value, more) {
    for (const cb of this._listeners.get(event) || []) cb(value, more);
  }

  _clearTimers() {
    for (const k of Object.keys(this._timers)) {
      clearTimeout(this._timers[k]);
      this._timers[k] = null;
    }
  }
}

WsPush.backoffDelay = backoffDelay;
WsPush.tokenExpiry = tokenExpiry;

export { WsPush, backoffDelay, tokenExpiry };
