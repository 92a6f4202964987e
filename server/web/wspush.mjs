// wspush browser client: one source, served as /wspush.mjs (an ES module) and /wspush.js (a
// classic script that sets window.WsPush). No dependencies; runs in Node 20+ when given a
// WebSocket class ({WebSocket} in the options).
//
//   const c = new WsPush("wss://push.example.com/ws", {token, getToken});
//   c.subscribe("mailbox:42", (event) => show(event.data));   // event = {topic, id, data}
//   c.on("state", (s) => ...);   // connecting, open, reconnecting, auth_failed, closed
//   c.on("lost", (topics) => ...);   // history no longer reaches back: resynchronise
//   c.on("subscription", ({topic, state}) => ...);   // c.topicState(topic), below
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
//   fails it stops with "auth_failed";
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

/* global globalThis */

const CLOSE_NORMAL = 1000;
const CLOSE_GOING_AWAY = 1001;
const CLOSE_POLICY = 1008;
const CLOSE_TRY_LATER = 1013;

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
  ///   random          () => [0, 1): for tests
  constructor(url, options = {}) {
    this._url = url;
    this._opts = options;
    this._token = options.token || null;
    this._WebSocket = options.WebSocket || globalThis.WebSocket;
    if (!this._WebSocket) throw new Error("WsPush: no WebSocket class (pass {WebSocket} in Node)");
    this._base = options.baseDelay ?? 1000;
    this._max = options.maxDelay ?? 30000;
    this._heartbeat = options.heartbeatTimeout ?? 45000;
    this._refreshAt = options.refreshAt ?? [0.75, 0.9];
    this._random = options.random ?? Math.random;
    this._retryBase = options.retryBaseDelay ?? 500;
    this._retryMax = options.retryMaxDelay ?? 30000;
    this._topics = new Map(); // topic -> {callbacks: Set, since: last id or null, state}
    // What this connection asked and the server has not answered yet, oldest first: the server
    // answers a connection's sub, unsub and auth each once, in order, so an answer (subbed,
    // unsubbed, authed or error) is always the head's. A sub's entry is its topic list.
    this._asked = [];
    this._retryAttempt = 0; // retries in a row since a sub was last answered `subbed`
    this._listeners = new Map(); // event name -> Set of callbacks
    this._ws = null;
    this._state = "closed";
    this._attempt = 0;
    this._timers = { reconnect: null, heartbeat: null, refresh: null, retry: null };
    this._closedByUser = false;
    this._askedForToken = false; // getToken was asked after a refusal and not yet confirmed
    this._connect();
  }

  get state() {
    return this._state;
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
      t = { callbacks: new Set(), since: null, state: null };
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
    this._send({ op: "unsub", topics: [topic] }, "unsub");
  }

  /// Events: "state" (s), "lost" (topics), "error" ({code, topic}) for refused requests ({code,
  /// topic, of: "pub"} for a pub), "subscription" ({topic, state}) when topicState(topic) changes.
  on(event, callback) {
    if (!this._listeners.has(event)) this._listeners.set(event, new Set());
    this._listeners.get(event).add(callback);
    return () => this._listeners.get(event).delete(callback);
  }

  /// Closes with 1000 and stays closed.
  close() {
    this._closedByUser = true;
    this._clearTimers();
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
    const url = new URL(this._url);
    url.searchParams.set("heartbeat", "1");
    if (this._token) url.searchParams.set("token", this._token);
    let ws;
    try {
      ws = new this._WebSocket(url.toString());
    } catch {
      this._scheduleReconnect();
      return;
    }
    this._ws = ws;
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
      opened = true;
      this._attempt = 0;
      this._asked = [];
      this._retryAttempt = 0;
      this._askedForToken = false;
      this._setState("open");
      this._resubscribe();
      this._armHeartbeat();
      this._scheduleRefresh();
    };
    ws.onmessage = (msg) => {
      this._armHeartbeat();
      this._onMessage(typeof msg.data === "string" ? msg.data : String(msg.data));
    };
    ws.onclose = (ev) => {
      if (this._ws !== ws) return;
      this._ws = null;
      this._clearTimers();
      this._forgetConnection();
      if (this._closedByUser) return this._setState("closed");
      const expired = this._token && tokenExpiry(this._token) && tokenExpiry(this._token) * 1000 <= Date.now();
      // A 1008 is about the token only when there is one; without, it was for something the
      // connection sent (the server's limit of refusals in a row): a new connection is the cure.
      const policy = ev.code === CLOSE_POLICY;
      if ((policy && this._token) || refused || (!opened && expired)) return this._renewThenReconnect();
      // A connection that was open is lost: its whole fleet may have lost it at once, so even the
      // first try waits a draw from a 2 s window; a server that is draining or overloaded asked
      // its clients to come back later, and one that closed us for what we sent: 4 s.
      const first = ev.code === CLOSE_GOING_AWAY || ev.code === CLOSE_TRY_LATER || policy ? 2 : opened ? 1 : 0;
      if (this._attempt < first) this._attempt = first;
      this._scheduleReconnect();
    };
  }

  /// The token was refused (1008, 401) or has expired: ask for a fresh one once. Without one,
  /// or if the fresh one is refused too, stop: reconnecting would only be refused again.
  async _renewThenReconnect() {
    const getToken = this._opts.getToken;
    if (!getToken || this._askedForToken) return this._setState("auth_failed");
    this._askedForToken = true;
    let fresh = null;
    try {
      fresh = await getToken();
    } catch {
      fresh = null;
    }
    if (this._closedByUser) return;
    if (!fresh) return this._setState("auth_failed");
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
      if (fresh && this._ws && this._state === "open") this._send({ op: "auth", token: fresh }, "auth", fresh);
    }, Math.min(at, 2 ** 31 - 1));
  }

  _resubscribe() {
    this._sendSub([...this._topics.keys()]);
  }

  /// Subscribes `topics`, each from its `since` if it has one; one message may carry 32 topics.
  _sendSub(topics) {
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

  /// `asked`: what the server will answer (a sub's topic list, "unsub" or "auth"); null for
  /// what it does not answer (pong).
  _send(message, asked = null, pendingToken = null) {
    if (!this._ws || this._state !== "open") return; // sent on (re)connect instead
    if (pendingToken) this._pendingToken = pendingToken;
    if (asked) this._asked.push(asked);
    this._ws.send(JSON.stringify(message));
  }

  /// The connection is gone: nothing asked on it will be answered, and every topic is
  /// subscribed afresh by the next one.
  _forgetConnection() {
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
      case "subbed": {
        const asked = this._asked.shift();
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
        return;
      }
      case "lost": // the server could not catch these topics up after an outage of its bus
        if (m.topics && m.topics.length) this._emit("lost", m.topics);
        return;
      case "unsubbed":
        this._asked.shift();
        return;
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
        const asked = this._asked.shift();
        if (asked === "auth" || m.code === "unauthorized") this._pendingToken = null; // the old token stays in force
        if (Array.isArray(asked)) this._answered(asked, m.code === "unavailable" ? "retrying" : "refused");
        return this._emit("error", { code: m.code, topic: m.topic });
      }
      default:
        return;
    }
  }

  _onEvent(event) {
    const t = this._topics.get(event.topic);
    if (!t) return;
    t.since = event.id;
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

  _setState(state) {
    if (this._state === state) return;
    this._state = state;
    this._emit("state", state);
  }

  _setTopicState(topic, state) {
    const t = this._topics.get(topic);
    if (!t || t.state === state) return;
    t.state = state;
    this._emit("subscription", { topic, state });
  }

  _emit(event, value) {
    for (const cb of this._listeners.get(event) || []) cb(value);
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
