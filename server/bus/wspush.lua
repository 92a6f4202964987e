#!lua name=wspush
-- wspush's Redis functions (Redis 7). Every node loads this library when it connects
-- (FUNCTION LOAD REPLACE); a backend that publishes without wspush calls the same function:
--
--   FCALL wspush_publish 0 <topic> <data> [<idempotency key>]  -> "<epoch>:<stream id>"
--
-- With an idempotency key (1-128 bytes of printable ASCII) a publish whose key was published
-- on the same topic within the window answers that publish's id and publishes nothing.
-- <data> must be one JSON value (it is checked here and refused otherwise). docs/REDIS.md
-- describes the keys and the channel.
--
-- Under Redis Cluster every call declares its keys, and they share one slot: a topic's keys
-- carry its slot's tag (docs/REDIS.md), 'wspush:{<tag>}:' in place of 'wspush:' below, and the
-- first key names the place:
--
--   FCALL wspush_publish 1 wspush:{<tag>}:stream:<topic> <topic> <data>
--
-- There the channel is a shard channel (SPUBLISH), each slot has its own epoch, the history
-- limits are those the library was loaded with (a node writes them into it: no key is common
-- to all slots), and a stream expires 2 * ttl_ms after its last publish (PEXPIRE; no sweep).
--
-- Keys:
--   wspush:epoch          a random tag made when missing: the data of this Redis (a restart
--                         that lost it makes a new one, and older ids are known to be lost)
--   wspush:epoch:writer   guarded epoch (nodes behind Sentinel): the replication id of the
--                         master that last wrote under it; a master that took over from that
--                         one makes a new epoch (single_epoch)
--   wspush:config         hash: maxlen (events kept per topic), ttl_ms (their age limit),
--                         max_event_bytes (the largest data wspush_publish takes), idem_ms
--                         (the idempotency window, written by the nodes' keyed batches), written by
--                         the nodes from --history-size, --history-ttl and the larger of
--                         --max-body-bytes and --max-message-bytes (nodes sharing a Redis
--                         agree on them: the last one set up wins)
--   wspush:stream:<topic> the topic's history, a stream of entries {d: <data>}; no TTL: the
--                         sweep (below) deletes it once its last publish is 2 * ttl_ms old
--   wspush:sweep          hash: cursor (the sweep's SCAN cursor), at (when its last step ran),
--                         pass (passes over the keyspace done)
--   wspush:idem:<g>:<topic>  hash: idempotency key -> "<ms> <id>" of the keys published in
--                         generation g = floor(ms / idem_ms) (wspush:config idem_ms, the nodes'
--                         --idempotency-window); it expires at the end of generation g + 1
--   wspush:presence:<topic>  hash (presence, where a namespace keeps it): user -> the nodes it is
--                         subscribed on, "<node> <connections> <expires ms>;..." (below)
-- Channel:
--   wspush:topic:<topic>  every publish, as "<epoch>:<stream id> <data>"; and where a namespace
--                         announces them, "join <user>" / "leave <user>" (no id: not an event)

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- Under Redis Cluster: {maxlen, ttl_ms, max_event_bytes, idem_ms}, written here by the node
-- that loads the library (the line below, replaced as a whole).
local cluster_config = nil -- @cluster_config@

-- Namespaces: {prefix, maxlen, ttl_ms} of each, longest prefix first, written here by the node
-- that loads the library (the line below, replaced as a whole; nodes sharing a Redis agree on
-- them, the last one set up wins). A topic that starts with a prefix keeps its namespace's
-- maxlen events for its ttl_ms, in place of wspush:config's (or cluster_config's).
local namespaces = {} -- @namespaces@

-- The history limits of `topic`: its namespace's, else `maxlen` and `ttl` (the call's).
local function limits(topic, maxlen, ttl)
  for i = 1, #namespaces do
    local n = namespaces[i]
    if string.sub(topic, 1, #n[1]) == n[1] then return n[2], n[3] end
  end
  return maxlen, ttl
end

-- Where a call's keys are, from the keys it declares: 'wspush:' (none: one Redis, or an
-- isolated shard), or 'wspush:{<tag>}:' (Redis Cluster: the first key's; nil when it is not
-- one of ours, `what` being its kind: stream, epoch, node).
local function space(keys, what)
  if #keys == 0 then return 'wspush:' end
  local p, rest = string.match(keys[1], '^(wspush:{[0-9a-z]+}:)(.*)$')
  if not p or string.sub(rest, 1, #what) ~= what then return nil end
  return p
end

-- maxlen, ttl_ms, max_event_bytes and idem_ms (the idempotency window: the nodes' keyed
-- batches write it; 300 s until one has).
local function config(p)
  if p ~= 'wspush:' then
    local c = cluster_config or {}
    return c[1] or 100, c[2] or 300000, c[3] or 1048576, c[4] or 300000
  end
  local c = redis.call('HMGET', 'wspush:config', 'maxlen', 'ttl_ms', 'max_event_bytes', 'idem_ms')
  return tonumber(c[1]) or 100, tonumber(c[2]) or 300000, tonumber(c[3]) or 1048576, tonumber(c[4]) or 300000
end

-- This master's replication ids (INFO replication: Redis Cluster, a guarded epoch), read once per call
-- (`ctx`, a table of the call's own).
local function replids(ctx)
  if not ctx.replid then
    local info = redis.call('INFO', 'replication')
    ctx.replid = string.match(info, 'master_replid:(%x+)') or ''
    ctx.replid2 = string.match(info, 'master_replid2:(%x+)') or ''
  end
  return ctx.replid, ctx.replid2
end

-- A slot's epoch key under Redis Cluster holds "<epoch> <replication id>": the id of the master
-- that last wrote it. Read where that master is no longer the writer:
--   - this master took over from it (a failover: its master_replid2 is that id): Redis replicates
--     asynchronously, so the old master may have acknowledged events this one never got. The
--     slot's ids are not trusted any more: a new epoch (a resume from before is answered lost);
--   - else (the slot migrated here, or a restart): the data came whole; the epoch stays.
-- Returns the epoch the slot's ids carry ('' when a failover voids it and `write` is false: a
-- reader, wspush_replay, must answer lost).
local function slot_epoch(p, ctx, write)
  local v = redis.call('GET', p .. 'epoch')
  if not v then return nil end
  local e, by = string.match(v, '^(%S+) (%x+)$')
  if not e then e, by = v, nil end
  local id1, id2 = replids(ctx)
  if by == id1 then return e end
  if by and by == id2 then
    if not write then return '' end
    return nil  -- a new one is made
  end
  if write then redis.call('SET', p .. 'epoch', e .. ' ' .. id1) end
  return e
end

-- One Redis's epoch (wspush:epoch). Guarded (wspush:epoch:writer set: nodes behind Sentinel
-- asked for it), the same rule as a slot's under Redis Cluster: read on a master that took over
-- from the writer, the epoch is void (''; `write`: nil, a new one is made); read elsewhere by a
-- writer, the writer becomes this master. Unguarded, the epoch as it is.
local function single_epoch(ctx, write)
  local by = redis.call('GET', 'wspush:epoch:writer')
  if by then ctx.guarded = true end  -- an epoch made after a loss is guarded too
  local e = redis.call('GET', 'wspush:epoch')
  if not e then return nil end
  if not by then return e end
  local id1, id2 = replids(ctx)
  if by == id1 then return e end
  if by == id2 then
    if not write then return '' end
    return nil
  end
  if write then redis.call('SET', 'wspush:epoch:writer', id1) end
  return e
end

-- Made from Redis's clock, and a node's salt when one made it (wspush_epoch): two Redis set up
-- in the same microsecond (the shards of a bus, set up together) still differ, so an id of one
-- is never read as a place in another's streams.
local function epoch(p, salt, ctx)
  local e
  ctx = ctx or {}
  if p == 'wspush:' then
    e = single_epoch(ctx, true)
  else
    e = slot_epoch(p, ctx or {}, true)
  end
  if e then return e end
  local t = redis.call('TIME')
  e = string.format('%x%05x', tonumber(t[1]) % 1048576, tonumber(t[2]))
  if type(salt) == 'string' and #salt <= 5 and string.match(salt, '^[0-9a-z]+$') then e = e .. salt end
  if p == 'wspush:' then
    redis.call('SET', p .. 'epoch', e)
    if ctx.guarded or ctx.guard then redis.call('SET', 'wspush:epoch:writer', (replids(ctx))) end
  else
    redis.call('SET', p .. 'epoch', e .. ' ' .. replids(ctx or {}))
  end
  return e
end

-- The server's rule (proto/topic.hpp): 1-128 bytes of visible ASCII other than * " \
local function valid_topic(t)
  return type(t) == 'string' and #t >= 1 and #t <= 128 and not string.find(t, '[^!-~]')
    and not string.find(t, '[*"\\]')
end

-- a < b for stream ids "ms-seq"
local function id_less(a, b)
  local am, as = string.match(a, '^(%d+)%-(%d+)$')
  local bm, bs = string.match(b, '^(%d+)%-(%d+)$')
  am, as, bm, bs = tonumber(am), tonumber(as), tonumber(bm), tonumber(bs)
  if am ~= bm then return am < bm end
  return as < bs
end

-- The first id of a stream key written anew (deleted, expired, or never there), from the TIME
-- t = {seconds, microseconds} this publish read: above every id an earlier life of that key
-- issued, so that replay reads all of those as lost (with '*' alone, a new life could issue
-- again an id of its earlier life in the same millisecond, and a resume from it would look
-- current and hide what came after it). It touches no key but the topic's own: under Redis
-- Cluster a function's keys must share one hash slot, and a key of all topics is a hot spot.
-- Why it holds: a life starts at m-S, m the millisecond of t, S = (u + 1) * 2^32, u its
-- microsecond within m (0-999). '*' continues from the last id: m-(S+1), m-(S+2), ... while the
-- clock is in m (or behind it), then m'-0, m'-1, ... in a later millisecond m'; a millisecond
-- holds far fewer than 2^32 XADDs, and '*' never takes a millisecond ahead of the clock TIME
-- reads. So the ids a life issued in a millisecond m are below 2^32 if it began before m, and
-- below (u + 2) * 2^32 if it began at m, u. A later life of the key reads a later TIME: in a
-- later millisecond (above all), or in m, starting at >= 2^32, and at u' > u if the earlier life
-- began in m too: (u' + 1) * 2^32 >= (u + 2) * 2^32. That needs the later TIME strictly later,
-- while TIME counts microseconds and reads a command apart were seen 1 us apart: so a creation
-- waits until TIME has moved on from t (in practice one TIME more; a clock stuck for 1000 reads
-- is given up on). Not covered, nor with '*' alone: a clock set back (an operator, NTP, a
-- failover to a replica whose clock is behind) past the earlier life's ids.
local function first_id(t)
  local us = tonumber(t[2])
  return string.format('%.0f-%.0f', tonumber(t[1]) * 1000 + math.floor(us / 1000), (us % 1000 + 1) * 4294967296)
end

-- After a call that created a stream at TIME t: until TIME has moved on from t (first_id).
local function wait_past(t)
  for _ = 1, 1000 do
    local n = redis.call('TIME')
    if n[2] ~= t[2] or n[1] ~= t[1] then return end
  end
end

-- What a call reads once for all of its publishes: the configuration, the epoch, the TIME `t`,
-- and the arguments every publish passes as strings (a number given to redis.call is formatted
-- each time it is passed).
local function context(p)
  local maxlen, ttl, max_bytes, idem_ms = config(p)
  local t = redis.call('TIME')
  return {maxlen = tostring(maxlen), max_bytes = max_bytes, prefix = epoch(p) .. ':', t = t, space = p,
          expire = p ~= 'wspush:' and ttl > 0 and tostring(2 * ttl) or nil, config_idem_ms = idem_ms}
end

-- ---- idempotency keys ----------------------------------------------------------------------
-- A publish may carry a key (a backend's retry of the same publish carries the same one). Keys
-- are remembered per topic, in the topic's slot, in generations of one window: generation g
-- (g = floor(ms / window)) is a hash 'idem:<g>:<topic>', key -> "<ms> <id>", which expires at
-- the end of generation g + 1. A publish looks its key up in the current generation, then the
-- one before, and takes it as seen when it was published less than a window ago: so a key is
-- remembered for exactly the window, whichever generation holds it, and a topic's keys leave
-- with their generation, at most two windows after their publish. A generation holds at most
-- idem_cap keys: past them a publish is not remembered (its retry may publish twice). A publish
-- without a key touches none of this. (Few calls on purpose: each redis.call is the cost.)
local idem_cap = 10000
local idem_default_ms = 300000

-- 1-128 bytes of printable ASCII (space to ~), as the nodes check.
local function valid_idem_key(k)
  return type(k) == 'string' and #k >= 1 and #k <= 128 and not string.find(k, '[^ -~]')
end

-- The id the key's publish got on this topic within the window, or nil.
local function idem_seen(x, topic, key)
  local v = redis.call('HGET', x.idem_cur .. topic, key) or redis.call('HGET', x.idem_prev .. topic, key)
  if not v then return nil end
  local ms, id = string.match(v, '^(%d+) (.+)$')
  if ms and x.now - tonumber(ms) < x.idem_ms then return id end
  return nil
end

local function idem_remember(x, topic, key, id)
  local h = x.idem_cur .. topic
  local n = redis.call('HLEN', h)
  if n >= idem_cap then return end
  redis.call('HSET', h, key, x.now_s .. ' ' .. id)
  if n == 0 then redis.call('PEXPIREAT', h, x.idem_end) end  -- made now: it goes with its generation
end

-- Sets the window (ms), the time keys are stamped with and the generations' names into a
-- call's context.
local function idem_context(x, window)
  x.idem_ms = window
  x.now = tonumber(x.t[1]) * 1000 + math.floor(tonumber(x.t[2]) / 1000)
  x.now_s = string.format('%.0f', x.now)
  local g = math.floor(x.now / window)
  x.idem_cur = x.space .. 'idem:' .. string.format('%.0f', g) .. ':'
  x.idem_prev = x.space .. 'idem:' .. string.format('%.0f', g - 1) .. ':'
  x.idem_end = string.format('%.0f', (g + 2) * window)
end

-- One publish; `checked`: its topic and data were checked already (a node's). Returns its id
-- (or an error reply) and whether it created the stream. `ikey`: its idempotency key (nil:
-- none; x holds the window, idem_context).
-- The history is bounded by count here (MAXLEN); by age, wspush_replay returns nothing older
-- than ttl_ms, and the sweep deletes the key 2 * ttl_ms after its last publish or later (both
-- the topic's namespace's, when it has one).
local function publish_one(topic, data, x, checked, ikey)
  -- Every node and every subscriber would hold it: the nodes' own bound, before any parsing.
  if type(topic) ~= 'string' or type(data) ~= 'string' then return redis.error_reply('ERR wspush: bad arguments'), false end
  if #data > x.max_bytes then
    return redis.error_reply('ERR wspush: data larger than max_event_bytes (' .. x.max_bytes .. ' bytes)'), false
  end
  if not checked then
    if not valid_topic(topic) then return redis.error_reply('ERR wspush: bad topic'), false end
    if not pcall(cjson.decode, data) then return redis.error_reply('ERR wspush: data is not one JSON value'), false end
  end
  local stream = x.space .. 'stream:' .. topic
  if x.key and x.key ~= stream then return redis.error_reply('ERR wspush: the key is not the topic\'s stream'), false end
  if ikey then
    local seen = idem_seen(x, topic, ikey)
    if seen then return seen, false end  -- published within the window: its id, nothing more
  end
  local maxlen, expire = x.maxlen, x.expire
  if #namespaces > 0 then
    local m, ttl = limits(topic, nil, nil)
    if m then
      maxlen = tostring(m)
      if expire and ttl > 0 then expire = tostring(2 * ttl) end
    end
  end
  -- A stream that exists takes the entry (one command); only a new one needs its first id.
  local id = redis.call('XADD', stream, 'NOMKSTREAM', 'MAXLEN', maxlen, '*', 'd', data)
  local created = not id
  if created then id = redis.call('XADD', stream, 'MAXLEN', maxlen, first_id(x.t), 'd', data) end
  local full = x.prefix .. id
  if expire then
    redis.call('PEXPIRE', stream, expire)
    redis.call('SPUBLISH', x.space .. 'topic:' .. topic, full .. ' ' .. data)
  else
    redis.call('PUBLISH', 'wspush:topic:' .. topic, full .. ' ' .. data)
  end
  if ikey then idem_remember(x, topic, ikey, full) end
  return full, created
end

local function publish(keys, args)
  local p = space(keys, 'stream:')
  if not p then return redis.error_reply('ERR wspush: the key is not a wspush stream (docs/REDIS.md)') end
  local x = context(p)
  x.key = keys[1]
  local ikey = args[3]
  if ikey ~= nil then
    if not valid_idem_key(ikey) then
      return redis.error_reply('ERR wspush: an idempotency key is 1-128 bytes of printable ASCII')
    end
    idem_context(x, x.config_idem_ms)
  end
  local out, created = publish_one(args[1], args[2], x, false, ikey)
  if created then wait_past(x.t) end
  return out
end

-- FCALL wspush_publish_batch 0 <topic> <data> [<topic> <data> ...]
--   -> { <an id, or an error>, ... }: one per pair, in order. The nodes' own: one call carries
--   every publish a node has to send at once, and reads the configuration, the epoch and the
--   time once for all of them. It does not check topics or JSON (the node did, and every node
--   checks what it receives): a backend publishes with wspush_publish.
-- Under Redis Cluster: FCALL wspush_publish_batch <n> <stream key> ... <topic> <data> ..., a
--   stream key per pair, all of one slot.
-- FCALL wspush_publish_keyed 0 <window ms> <topic> <data> <key> [<topic> <data> <key> ...]
--   the same with an idempotency key per publish ('': none; the node checked the others), and
--   the node's --idempotency-window, which it makes the one backends' publishes use
--   (wspush:config idem_ms). A new name, not a new shape of wspush_publish_batch: a node of the
--   previous version goes on calling that one with pairs during a rolling upgrade.
local function batch(keys, args, first, stride, window)
  local n = #args - first + 1
  if n <= 0 or n % stride ~= 0 then return redis.error_reply('ERR wspush: topic and data pairs expected') end
  local p = space(keys, 'stream:')
  if not p or (#keys > 0 and #keys * stride ~= n) then
    return redis.error_reply('ERR wspush: a stream key per topic and data pair expected')
  end
  local x = context(p)
  if window then
    idem_context(x, window)
    -- Where backends' publishes read it (one Redis, an isolated shard: under Redis Cluster the
    -- library carries it). Unset reads as the default: nothing to write for a node of it.
    if p == 'wspush:' and x.config_idem_ms ~= window then redis.call('HSET', 'wspush:config', 'idem_ms', tostring(window)) end
  end
  local out, any = {}, false
  for i = first, #args, stride do
    x.key = keys[(i - first) / stride + 1]
    local ikey = stride == 3 and args[i + 2] ~= '' and args[i + 2] or nil
    local r, created = publish_one(args[i], args[i + 1], x, true, ikey)
    out[#out + 1] = r
    any = any or created
  end
  if any then wait_past(x.t) end
  return out
end

local function publish_batch(keys, args) return batch(keys, args, 1, 2, nil) end

-- The node's window (ms), or nil.
local function node_window(w)
  local window = tonumber(w)
  if not window or window < 1 or window ~= math.floor(window) then return nil end
  return window
end

local function publish_keyed(keys, args)
  local window = node_window(args[1])
  if not window then return redis.error_reply('ERR wspush: a window in milliseconds expected') end
  return batch(keys, args, 2, 3, window)
end

-- Under Redis Cluster, the nodes' own batch over the slots of one master:
-- FCALL wspush_publish_many 1 <the first stream key> <stream key> <topic> <data> [...]
--   -> { <an id, or an error>, ... }: one per triple, in order. A triple whose slot this master
--   does not serve (it moved, or is moving) is answered with an error and not published; the
--   others are. Each slot's epoch is read once per call.
-- FCALL wspush_publish_many_keyed 1 <the first stream key> <window ms> <stream key> <topic> <data> <key> [...]
--   the same with an idempotency key per publish ('': none).
local function many(keys, args, first, stride, window)
  local n = #args - first + 1
  if #keys ~= 1 or n <= 0 or n % stride ~= 0 then
    return redis.error_reply('ERR wspush: one declared key, then stream key, topic and data triples expected')
  end
  local maxlen, ttl, max_bytes = config('wspush:{-}:')
  local t = redis.call('TIME')
  local base = {maxlen = tostring(maxlen), max_bytes = max_bytes, t = t,
                expire = ttl > 0 and tostring(2 * ttl) or nil}
  local out, any, epochs, ctx = {}, false, {}, {}
  for i = first, #args, stride do
    local key, topic, data = args[i], args[i + 1], args[i + 2]
    local ikey = stride == 4 and args[i + 3] ~= '' and args[i + 3] or nil
    local p = string.match(key, '^(wspush:{[0-9a-z]+}:)stream:')
    local r, created
    if not p then
      r = redis.error_reply('ERR wspush: not a stream key')
    else
      -- Every call on a slot this master does not serve fails before it writes: caught here,
      -- so that what this call published is answered as published.
      local e = epochs[p]
      local ok = true
      if not e then
        ok, e = pcall(epoch, p, nil, ctx)
        if ok then epochs[p] = e end
      end
      if ok then
        local x = {maxlen = base.maxlen, max_bytes = base.max_bytes, t = t, expire = base.expire, prefix = e .. ':',
                   space = p, key = key}
        if ikey then idem_context(x, window) end
        ok, r, created = pcall(publish_one, topic, data, x, true, ikey)
      end
      if not ok then r = redis.error_reply('ERR wspush: the slot of ' .. tostring(topic) .. ' is not served here') end
    end
    out[#out + 1] = r
    any = any or created
  end
  if any then wait_past(t) end
  return out
end

local function publish_many(keys, args) return many(keys, args, 1, 3, nil) end

local function publish_many_keyed(keys, args)
  local window = node_window(args[1])
  if not window then return redis.error_reply('ERR wspush: a window in milliseconds expected') end
  return many(keys, args, 2, 4, window)
end

-- FCALL wspush_replay 0 <topic> <since id> [mark]
--   -> { lost (0|1), id1, data1, id2, data2, ... }: the entries after <since>, oldest first.
-- FCALL wspush_replay 0 <topic> <since id> <mark|event> <max entries> <max bytes>
--   -> { lost (0|1), next, id1, data1, ... }: one page of them: at most <max entries>, and no
--   more data than <max bytes> (but at least one entry). next: "" when the page reaches the
--   end, else the id to ask the next page after (event mode: an id the stream issued), so that
--   no reply, however long the history, is larger than a page.
-- lost: the stream is gone, <since> is of another epoch or malformed or was never issued, or
-- entries after it were trimmed away or are older than the age limit (not returned).
-- With `mark` (a node catching up after an outage, or a client resuming from the position its
-- `subbed` gave), <since> need not be an id the stream issued: it is a moment up to which the
-- node has seen every event of the topic (a mark, see wspush_mark, or its last event). Then a
-- stream with nothing after it, or no stream at all while one written after it would still be
-- there (the sweep leaves it at least 2 * ttl past its last write), is not lost: nothing was
-- published since.
local function replay(keys, args)
  local topic, since, mark = args[1], args[2], args[3] == 'mark'
  if not valid_topic(topic) then return redis.error_reply('ERR wspush: bad topic') end
  local p = space(keys, 'stream:')
  if not p or (#keys > 0 and keys[1] ~= p .. 'stream:' .. topic) then
    return redis.error_reply('ERR wspush: the key is not the topic\'s stream')
  end
  local max_n, max_bytes = tonumber(args[4] or ''), tonumber(args[5] or '')
  local paged = max_n ~= nil and max_bytes ~= nil
  if paged and (max_n < 1 or max_bytes < 1) then return redis.error_reply('ERR wspush: bad page bound') end
  local maxlen, ttl = config(p)
  maxlen, ttl = limits(topic, maxlen, ttl)
  local e
  if p == 'wspush:' then e = single_epoch({}, false) or '' else e = slot_epoch(p, {}, false) or '' end
  local stream = p .. 'stream:' .. topic
  local now = now_ms()
  local min_ms = ttl > 0 and now - ttl or 0
  local out = {0}
  if paged then out[2] = '' end
  if e == '' then
    -- No epoch the ids can carry (none yet, or voided by a failover until the next publish):
    -- nothing can be read as after <since>.
    out[1] = 1
    return out
  end
  local se, sid = string.match(since or '', '^([0-9a-z]+):(%d+%-%d+)$')
  local start = '-'
  if mark and sid and tonumber(string.match(sid, '^(%d+)')) > now then
    -- A moment this Redis has not reached: no node gave it (a clock set back is not covered).
    out[1] = 1
    return out
  end
  -- Whether a stream written after <since> may have been swept by now (mark only).
  local could_be_swept = sid and ttl > 0 and now >= tonumber(string.match(sid, '^(%d+)')) + 2 * ttl
  if se ~= e then
    out[1] = 1
  elseif redis.call('EXISTS', stream) == 0 then
    if not mark or could_be_swept then out[1] = 1 end
  else
    -- An id this stream issued and still holds is >= its first entry: trimming (MAXLEN at
    -- publish, or an operator's XTRIM) removes the oldest entries
    -- only. So a <since> older than the first entry kept is lost: either it was trimmed, and so
    -- were the entries after it up to the first one kept (when <since> is the very last one
    -- removed, lost is said of nothing: rare, and safe), or it was issued by an earlier life of
    -- this key (deleted or expired; first_id starts a new life above all of its ids), whose
    -- entries after it went with the key. That earlier life is why this cannot count removals with
    -- entries-added: a key written again starts counting afresh, and its length equals it.
    -- An empty stream (--history-size 0, or trimmed to nothing) has no first entry: what was
    -- issued after <since> is all gone. XDEL (not ours, but an operator's) may remove any
    -- entry: max-deleted-entry-id says whether one after <since> went.
    local info = redis.call('XINFO', 'STREAM', stream)
    local f = {}
    for i = 1, #info, 2 do f[info[i]] = info[i + 1] end
    local last, first = f['last-generated-id'], f['recorded-first-entry-id'] or '0-0'
    local deleted = f['max-deleted-entry-id'] or '0-0'
    if id_less(last, sid) then
      -- Never issued, so nothing after it (and '(' of the largest id is an error); a mark
      -- later than the last event is no loss.
      if not mark then out[1] = 1 end
      return out
    elseif id_less(sid, deleted) then
      out[1] = 1
    elseif tonumber(f['length'] or 0) == 0 then
      if id_less(sid, last) then out[1] = 1 end
    elseif id_less(sid, first) then
      -- A mark before this life's first entry: lost if this life trimmed any entry, or an
      -- earlier life may have written after the mark (it was swept since).
      if not mark or tonumber(f['entries-added'] or 0) > tonumber(f['length'] or 0) or could_be_swept then
        out[1] = 1
      end
    end
    start = '(' .. sid
  end
  local entries
  if paged then
    -- One entry past the page: whether there is a next one.
    entries = redis.call('XRANGE', stream, start, '+', 'COUNT', max_n + 1)
  else
    entries = redis.call('XRANGE', stream, start, '+')
  end
  local taken, bytes = 0, 0
  for k, entry in ipairs(entries) do
    local id, fields = entry[1], entry[2]
    if paged and (taken >= max_n or bytes >= max_bytes) then
      out[2] = e .. ':' .. entries[k - 1][1]
      break
    end
    taken = taken + 1
    local ms = tonumber(string.match(id, '^(%d+)'))
    if ms < min_ms then
      out[1] = 1  -- expired after <since>: not replayed
    else
      local data
      for i = 1, #fields, 2 do
        if fields[i] == 'd' then data = fields[i + 1] end
      end
      if data then
        out[#out + 1] = e .. ':' .. id
        out[#out + 1] = data
        bytes = bytes + #data
      end
    end
  end
  return out
end

redis.register_function{function_name = 'wspush_publish', callback = publish}
redis.register_function{function_name = 'wspush_publish_batch', callback = publish_batch}
redis.register_function{function_name = 'wspush_publish_many', callback = publish_many, flags = {'allow-cross-slot-keys'}}
redis.register_function{function_name = 'wspush_publish_keyed', callback = publish_keyed}
redis.register_function{function_name = 'wspush_publish_many_keyed', callback = publish_many_keyed,
                        flags = {'allow-cross-slot-keys'}}
redis.register_function{function_name = 'wspush_replay', callback = replay, flags = {'no-writes'}}

-- ---- presence ------------------------------------------------------------------------------
-- Who is subscribed to a topic whose namespace keeps presence, across the nodes. Each node says
-- what it has, per user: how many of that user's connections are subscribed to the topic on it
-- (0: none any more), and says it again every presence_ttl / 3 while it lasts, so that a node
-- that dies without a word drops out once its entries expire (each is kept presence_ttl ms from
-- the node's last word). The topic's hash, in its slot: user -> "<node> <n> <expires ms>;...".
--
--   FCALL wspush_presence 0 <node> <ttl ms> <topic> <user> <n> <announce> [<topic> <user> <n> <announce> ...]
--   Under Redis Cluster, one topic a call: FCALL wspush_presence 1 wspush:{<tag>}:presence:<topic> ...
--     -> for each quadruple: 1 the user's first connection anywhere (joined), 2 its last (left), 0 neither
--
-- With <announce> 1 a join or leave is published on the topic's channel as "join <user>" or
-- "leave <user>". The hash expires with its last entry.

-- The live entries of one user's value: {node = {n, expires}}, and how many connections in all.
local function present_nodes(v, now)
  local nodes, total = {}, 0
  if not v then return nodes, 0 end
  for node, n, exp in string.gmatch(v, '([^ ;]+) (%d+) (%d+)') do
    n, exp = tonumber(n), tonumber(exp)
    if exp > now and n > 0 then
      nodes[node] = {n, exp}
      total = total + n
    end
  end
  return nodes, total
end

local function presence_value(nodes)
  local parts = {}
  for node, e in pairs(nodes) do parts[#parts + 1] = node .. ' ' .. e[1] .. ' ' .. string.format('%.0f', e[2]) end
  return table.concat(parts, ';')
end

local function presence(keys, args)
  local p = space(keys, 'presence:')
  if not p then return redis.error_reply('ERR wspush: the key is not a wspush presence hash (docs/REDIS.md)') end
  local node, ttl = args[1], tonumber(args[2])
  if type(node) ~= 'string' or #node == 0 or string.find(node, '[ ;]') or not ttl or ttl <= 0 or (#args - 2) % 4 ~= 0 then
    return redis.error_reply('ERR wspush: bad presence arguments')
  end
  local now = now_ms()
  local out = {}
  for i = 3, #args, 4 do
    local topic, user, n, announce = args[i], args[i + 1], tonumber(args[i + 2]), args[i + 3]
    if not valid_topic(topic) or type(user) ~= 'string' or #user == 0 or not n or n < 0 then
      return redis.error_reply('ERR wspush: bad presence arguments')
    end
    local key = p .. 'presence:' .. topic
    if #keys > 0 and key ~= keys[1] then return redis.error_reply('ERR wspush: the key is not the topic\'s') end
    local nodes, before = present_nodes(redis.call('HGET', key, user), now)
    if n > 0 then nodes[node] = {n, now + ttl} else nodes[node] = nil end
    local v = presence_value(nodes)
    local total = 0
    for _, e in pairs(nodes) do total = total + e[1] end
    if v == '' then redis.call('HDEL', key, user) else redis.call('HSET', key, user, v) end
    -- Every entry expires within the longest ttl of now (Redis's own clock): so does the hash (a
    -- node with a shorter ttl never cuts another's entries short).
    if v ~= '' and redis.call('PTTL', key) < ttl then redis.call('PEXPIRE', key, ttl) end
    -- Users nobody speaks of any more (their node died) leave a couple at a time.
    local some = redis.call('HRANDFIELD', key, 2, 'WITHVALUES')
    for j = 1, #some, 2 do
      if select(2, present_nodes(some[j + 1], now)) == 0 then redis.call('HDEL', key, some[j]) end
    end
    local change = 0
    if before == 0 and total > 0 then change = 1 elseif before > 0 and total == 0 then change = 2 end
    if change ~= 0 and announce == '1' then
      local what = (change == 1 and 'join ' or 'leave ') .. user
      if p ~= 'wspush:' then redis.call('SPUBLISH', p .. 'topic:' .. topic, what)
      else redis.call('PUBLISH', 'wspush:topic:' .. topic, what) end
    end
    out[#out + 1] = change
  end
  return out
end

--   FCALL_RO wspush_presence_get 0 <topic> <max users>  (Cluster: 1 wspush:{<tag>}:presence:<topic>)
--     -> {user count, connections, user, n, user, n, ...} with at most <max users> pairs
local function presence_get(keys, args)
  local p = space(keys, 'presence:')
  if not p then return redis.error_reply('ERR wspush: the key is not a wspush presence hash (docs/REDIS.md)') end
  local topic, max = args[1], tonumber(args[2])
  if not valid_topic(topic) or not max or max < 0 then return redis.error_reply('ERR wspush: bad presence arguments') end
  local key = p .. 'presence:' .. topic
  if #keys > 0 and key ~= keys[1] then return redis.error_reply('ERR wspush: the key is not the topic\'s') end
  local now = now_ms()
  local all = redis.call('HGETALL', key)
  local out, users, connections = {0, 0}, 0, 0
  for i = 1, #all, 2 do
    local _, total = present_nodes(all[i + 1], now)
    if total > 0 then
      users = users + 1
      connections = connections + total
      if users <= max then
        out[#out + 1] = all[i]
        out[#out + 1] = total
      end
    end
  end
  out[1], out[2] = users, connections
  return out
end

redis.register_function{function_name = 'wspush_presence', callback = presence}
redis.register_function{function_name = 'wspush_presence_get', callback = presence_get, flags = {'no-writes'}}

-- The sweep. A stream has no TTL: one would cost every publish a PEXPIRE, and every lookup of
-- the key a second one in Redis's table of expiries. Instead each wspush_mark (every node, about
-- once a second) runs a step of a sweep over the keys, at most one step each 100 ms among all
-- the nodes: it SCANs a share of the keyspace sized by the time since the last step (a whole
-- pass in about ttl_ms), and deletes each stream whose last issued id is at least 2 * ttl_ms
-- old (its namespace's ttl_ms when it has one). None is deleted sooner, which is what wspush_replay's mark mode relies on. Three passes
-- in four pass over the streams read or written in the last 2 * ttl_ms (their idle time says
-- so, without reading them): a stream not written goes between 2 and about 3 times ttl_ms after
-- its last publish, or by the fourth pass, within about 6 times, if resumes keep reading it.
-- ttl_ms 0 (no age limit): streams stay.

-- The millisecond of the last id `stream` issued, if it is at least `ms` old at `now` (else,
-- or not a stream: nil). Its newest entry tells most streams apart with a small read (the last
-- id issued is never below it); for the others the last id issued decides, as an entry may have
-- been deleted (XDEL) or trimmed away since.
local function old_last_ms(stream, ms, now)
  local e = redis.pcall('XREVRANGE', stream, '+', '-', 'COUNT', 1)
  if type(e) ~= 'table' or e.err then return nil end
  local newest = e[1] and tonumber(string.match(e[1][1], '^(%d+)'))
  if newest and now < newest + ms then return nil end
  local info = redis.call('XINFO', 'STREAM', stream)
  for i = 1, #info, 2 do
    if info[i] == 'last-generated-id' then
      local last = tonumber(string.match(info[i + 1], '^(%d+)'))
      if last and now >= last + ms then return last end
      return nil
    end
  end
  return nil
end

-- Whether `stream` may have been left alone for `ms`: its idle time (OBJECT IDLETIME, whole
-- seconds since it was last written or read). Not exact (Redis does not update it while a child
-- process saves): too short only delays a deletion, too long costs a read. Under an LFU
-- maxmemory-policy there is none: every stream is read.
local function may_be_idle(stream, ms)
  local idle = redis.pcall('OBJECT', 'IDLETIME', stream)
  return type(idle) ~= 'number' or (idle + 1) * 1000 >= ms
end

local function sweep_step(ttl, now)
  if ttl <= 0 then return end
  local s = redis.call('HMGET', 'wspush:sweep', 'cursor', 'at', 'pass')
  local since = now - (tonumber(s[2]) or 0)
  if since >= 0 and since < 100 then return end
  -- A share of the keys for the time since the last step (at most 10 s of it: after a pause
  -- the pass takes longer, no step blocks Redis for long), so that a pass takes about ttl_ms.
  since = math.min(math.max(since, 100), 10000)
  local count = math.max(100, math.ceil(redis.call('DBSIZE') * since / ttl))
  local pass = tonumber(s[3]) or 0
  local every = pass % 4 == 3  -- this pass reads every stream, idle or not
  local r = redis.call('SCAN', s[1] or '0', 'MATCH', 'wspush:stream:*', 'COUNT', count)
  for _, stream in ipairs(r[2]) do
    -- Its topic's age limit: a namespace's may be longer or shorter than the global one.
    local _, limit = limits(string.sub(stream, 15), 0, ttl)
    if limit > 0 and (every or may_be_idle(stream, 2 * limit)) and old_last_ms(stream, 2 * limit, now) then
      redis.call('UNLINK', stream)
    end
  end
  if r[1] == '0' then pass = pass + 1 end
  redis.call('HSET', 'wspush:sweep', 'cursor', r[1], 'at', now, 'pass', pass)
end

-- FCALL wspush_mark 0 <channel> -> 1, and publishes "mark <epoch> <ms>" (the TIME it ran) on
-- <channel>, a node's own: when the node hears it on its subscriber connection, every publish
-- made before that moment on a topic it was subscribed to has reached it (Redis delivers in the
-- order it runs commands). After an outage it catches up from there. It runs a step of the
-- sweep first (above).
-- Under Redis Cluster: FCALL wspush_mark 1 wspush:{<tag>}:node:<id>, the node's shard channel in
-- a slot of this master: it publishes "mark <epoch of that slot, or -> <ms>" there (a node reads
-- each topic's epoch from its own slot), and runs no sweep (streams expire).
local function mark(keys, args)
  if #keys > 0 then
    local p = space(keys, 'node:')
    if not p then return redis.error_reply('ERR wspush: bad channel') end
    local e = slot_epoch(p, {}, false)
    if not e or e == '' then e = '-' end
    redis.call('SPUBLISH', keys[1], 'mark ' .. e .. ' ' .. now_ms())
    return 1
  end
  local channel = args[1]
  if type(channel) ~= 'string' or string.sub(channel, 1, 12) ~= 'wspush:node:' then
    return redis.error_reply('ERR wspush: bad channel')
  end
  local _, ttl = config('wspush:')
  -- A step that fails (a stored cursor SCAN refuses, say) must not keep the mark from coming.
  pcall(sweep_step, ttl, now_ms())
  -- Reads the epoch a node set up with, or none (a Redis that lost its data since has none until
  -- the next publish), and makes none, so that it runs when Redis is out of memory too, when the
  -- sweep frees memory.
  local e = single_epoch({}, false) or ''
  redis.call('PUBLISH', channel, 'mark ' .. e .. ' ' .. now_ms())
  return 1
end

redis.register_function{function_name = 'wspush_mark', callback = mark, flags = {'allow-oom'}}
-- FCALL wspush_epoch 0 [<salt> [guard]] -> the epoch (made when missing; <salt>: 1-5 of [0-9a-z];
-- guard: the epoch is guarded from here on, see single_epoch).
-- Under Redis Cluster: FCALL wspush_epoch 1 wspush:{<tag>}:epoch [<salt>]: that slot's.
redis.register_function{
  function_name = 'wspush_epoch',
  callback = function(keys, args)
    local p = space(keys, 'epoch')
    if not p or (#keys > 0 and keys[1] ~= p .. 'epoch') then return redis.error_reply('ERR wspush: bad epoch key') end
    local ctx = {}
    if p == 'wspush:' and args[2] == 'guard' then
      ctx.guard = true
      -- An epoch that was not guarded yet is taken as this master's: nothing says otherwise.
      if redis.call('GET', 'wspush:epoch') and not redis.call('GET', 'wspush:epoch:writer') then
        redis.call('SET', 'wspush:epoch:writer', (replids(ctx)))
      end
    end
    return epoch(p, args[1], ctx)
  end}
