#!lua name=partitioned
--[[
The speed layer's keyed state machine in a layout that shards (docs/architecture.md, "The
partitioned layout"). Every key is hash-tagged by the Kafka partition that owns it,
`<ns>:{<p>}:<name>`, and every call reads and writes the keys of one partition only, so each
partition's state can live on its own Redis Cluster node.

Who owns what. Partition p owns the users whose events it holds (the contract's partition key:
user_id, the recipient of a message): their profile, status, inbox, unread counter, follows
(`following:<u>`), posts (`posts:<a>`, `pids:<a>`, bodies `b:<member>`), home timeline
(`tl:<u>`), and `lfol:<a>`: the followers of any author a among p's users (the fan-out's targets
in p). Nothing is shared by all partitions: fences, dedup, statistics, the changelog and its
order are per partition.

Fan-out as deliveries. A post, a delete and an erasure concern timelines, replicas and inboxes in
every partition, its own included: the source call changes only the facts it owns and writes one
outbox entry (`out`, id `<offset>-1`), and every partition applies it with `p_deliver`, fenced
per (target, source) by `dfence[source]`, so a delivery applied twice changes nothing. Each
partition keeps a replica of every author's latest N + S delivered posts (`ap:<a>`, with the
bodies of other partitions' authors): the only posts that can be in any timeline, so a follow's
backfill, an unfollow's removal, a refill and the read-time merge of celebrities are all local
and see only what was delivered. The fan-out threshold is per partition: an author with more than
T followers among p's users is merged at read time in p (`celebs`), which is a representation, not
a view (the timeline read is the same either way).

The call protocol is named: `protocol.json` lists every argument, substituted below when the
library is loaded (contract/functions.py), and read by the Python encoder.

`FCALL p_apply 1 <ns>:{<p>}:fence <apply header> <event>...`: events of partition p in offset
order; an event is the `event` fields then its type's fields (`events`), a record the contract
rejected is the `quarantined` fields. Per event, atomically: the fence (an offset below it is
skipped), dedup, the effects, one changelog entry (id `<offset + 1>-0`: d disposition, r reason,
c view changes as in pipelines/speed/changelog.py) and at most one outbox entry.

`FCALL p_deliver 1 <ns>:{<q>}:fence <deliver header> <segment>...`: per source partition, a
`segment` (source, upto: the source's fence when its outbox was read, count) and its outbox entries
below `upto`, each `offset kind n field...`; entries below dfence[source] are skipped, and
dfence[source] becomes `upto`. The queued fan-out of every segment is applied at the end, one ZADD
per timeline. Changes a delivery makes to facts (an
erasure's edges and messages) are a changelog entry `<fence>-<n>` (d `x`, src `<source>:<offset>`).
A delivery it cannot apply is kept in `dlq` with its reason and counted, never dropped. A call
that leaves the partition complete (its own deliveries at its fence) appends dfence to `marks`.
]]

local VERSION = 'p4'
local MARKS_KEPT = '4096' -- complete states each partition keeps for the archiver to find a cut in
local LAYOUT = '3'
local PROTOCOL = @PROTOCOL@ -- protocol.json as a Lua table (contract/functions.py)

local function pad(id) return string.rep('0', 19 - #id) .. id end
local function unpad(s) return (s:gsub('^0+(%d)', '%1')) end
local function fmt(n) return string.format('%d', n) end
-- A timeline member: post id then author id, both padded (the view's tie order, descending).
local function tl_member(pid_padded, author) return pid_padded .. pad(author) end
local function cmp_gt(s1, m1, s2, m2)
  if s1 ~= s2 then return s1 > s2 end
  return m1 > m2
end

local function user_json(handle, display_name)
  return '{"handle":' .. cjson.encode(handle) .. ',"display_name":' .. cjson.encode(display_name) .. '}'
end
local function status_json(text, et)
  return '{"text":' .. cjson.encode(text) .. ',"event_time":' .. fmt(et) .. '}'
end
local function post_json(pid, a, text, et)
  return '{"post_id":' .. pid .. ',"author_id":' .. a .. ',"text":' .. cjson.encode(text) ..
    ',"event_time":' .. fmt(et) .. '}'
end
-- A message's body never changes but for an erasure's anonymisation; its read state is the field
-- `<message>:r` beside it (set once: HSETNX), not an edit of the JSON.
local function msg_json(mid, sender, text, et)
  if text == nil or text == cjson.null then text = cjson.null end
  return '{"message_id":' .. mid .. ',"sender_id":' .. sender .. ',"text":' .. cjson.encode(text) ..
    ',"event_time":' .. fmt(et) .. '}'
end

local Ctx = {}
Ctx.__index = Ctx

local function new_ctx(ns, p, header)
  local c = setmetatable({ns = ns, p = p, pre = ns .. ':{' .. p .. '}:',
    window = tonumber(header.dedup_window_ms), grace = tonumber(header.dedup_grace_ms),
    reorder = tonumber(header.dedup_reorder),
    N = tonumber(header.timeline_n), T = tonumber(header.fanout_threshold),
    S = tonumber(header.timeline_slack)}, Ctx)
  c.M = c.N + math.floor(c.S / 2)
  c.pending, c.pending_order, c.card, c.min, c.lfol, c.celeb, c.apcard = {}, {}, {}, {}, {}, {}, {}
  c.any_erased = redis.call('EXISTS', c:k('erased')) == 1
  c.any_gone = redis.call('EXISTS', c:k('gone')) == 1
  return c
end

-- A key of this partition: `c:k('tl', u)` -> '<ns>:{<p>}:tl:<u>'.
function Ctx:k(a, b)
  if b == nil then return self.pre .. a end
  return self.pre .. a .. ':' .. b
end

-- A view change for the changelog; numbers as integer strings (cjson would round them).
-- A post's body, keyed by its timeline member (post then author, padded): a read finds each
-- body by the member it merged, with no string surgery per post.
function Ctx:bkey(a, pid_padded) return self.pre .. 'b:' .. pid_padded .. pad(a) end

function Ctx:change(...)
  local row = {...}
  for i = 1, select('#', ...) do
    if type(row[i]) == 'number' then row[i] = fmt(row[i]) end
  end
  self.changes[#self.changes + 1] = row
end

-- (read once per author and call: a delivery call meets the same authors over and over)
function Ctx:is_celeb(a)
  local v = self.celeb[a]
  if v == nil then
    v = redis.call('SISMEMBER', self:k('celebs'), a) == 1
    self.celeb[a] = v
  end
  return v
end
-- erased here, in this partition's log order (the rejection rule of docs/views.md)
function Ctx:is_erased(u)
  if not self.any_erased then return false end
  return redis.call('SISMEMBER', self:k('erased'), u) == 1
end
-- erased anywhere this partition has heard of (here, or delivered from the user's partition)
function Ctx:is_gone(u)
  if not self.any_gone then return false end
  return redis.call('SISMEMBER', self:k('gone'), u) == 1
end

-- Author a's posts as timelines here may hold them: the replica of a's latest N + S delivered
-- posts (a's own partition keeps one too, fed by the same deliveries as every other partition).
function Ctx:src_key(a) return self:k('ap', a) end

-- ---------------------------------------------------------------------------------------------
-- Timelines: tl:u keeps the latest K posts of u's sources, N <= K <= N + S whenever that many are
-- eligible (all of them otherwise); removals eat into the slack and only a timeline below N is
-- refilled, to M = N + S/2; inserts grow it and only one past N + S is trimmed, back to M.
-- ---------------------------------------------------------------------------------------------
function Ctx:tl_card(u, key)
  local n = self.card[u]
  if n == nil then
    n = redis.call('ZCARD', key)
    self.card[u] = n
  end
  return n
end

function Ctx:tl_min(u, key)
  local lo = self.min[u]
  if not lo then
    local row = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
    lo = {row[1], tonumber(row[2])}
    self.min[u] = lo
  end
  return lo[1], lo[2]
end

-- Add posts ({member, score, author, score as a string}) to tl:u: one ZADD, a trim when past N + S.
-- `fresh`: new posts the fan-out queued, which no path can have put into tl:u yet.
function Ctx:tl_add(u, posts, fresh)
  local key = self:k('tl', u)
  local n = self:tl_card(u, key)
  local min_s, min_m
  if n >= self.N then min_m, min_s = self:tl_min(u, key) end
  local add = {}
  for _, p in ipairs(posts) do
    local s = p[2]
    if min_s == nil or s > min_s or (s == min_s and p[1] > min_m) then add[#add + 1] = p end
  end
  if #add == 0 then return end
  if not fresh then
    local members = {}
    for i, p in ipairs(add) do members[i] = p[1] end
    local have, seen, new = redis.call('ZMSCORE', key, unpack(members)), {}, {}
    for i, p in ipairs(add) do
      if have[i] == false and seen[p[1]] == nil then
        seen[p[1]] = true
        new[#new + 1] = p
      end
    end
    add = new
    if #add == 0 then return end
  end
  local args = {}
  for i, p in ipairs(add) do
    args[2 * i - 1] = p[4]
    args[2 * i] = p[1]
  end
  local count = #add
  if redis.call('ZADD', key, unpack(args)) ~= count then
    error('fan-out into ' .. key .. ': a new post was in the timeline already')
  end
  if min_s == nil then self.min[u] = false end
  n = n + count
  if n > self.N + self.S then
    local k = n - self.M
    local lo = redis.call('ZRANGE', key, k, k, 'WITHSCORES')
    redis.call('ZREMRANGEBYRANK', key, 0, k - 1)
    n = self.M
    self.min[u] = {lo[1], tonumber(lo[2])}
  end
  self.card[u] = n
end

-- The fan-out is coalesced: a post is queued for each timeline it goes to and each timeline takes
-- its queue in one tl_add at a flush (before an event that reads or changes timelines otherwise,
-- and at the end of the call).
function Ctx:queue(users, post)
  local pending, order = self.pending, self.pending_order
  for _, u in ipairs(users) do
    local q = pending[u]
    if q == nil then
      q = {}
      pending[u] = q
      order[#order + 1] = u
    end
    q[#q + 1] = post
  end
end

function Ctx:flush()
  if #self.pending_order == 0 then return end
  local pending, order = self.pending, self.pending_order
  self.pending, self.pending_order = {}, {}
  for _, u in ipairs(order) do
    local q = pending[u]
    if q ~= nil then
      pending[u] = nil
      self:tl_add(u, q, true)
    end
  end
end

function Ctx:flush_user(u)
  local q = self.pending[u]
  if q == nil then return end
  self.pending[u] = nil
  self:tl_add(u, q, true)
end

-- The sources of u's fanned-out timeline: u and the authors u follows that are not celebrities here.
function Ctx:sources(u)
  local out = redis.call('SDIFF', self:k('following', u), self:k('celebs'))
  out[#out + 1] = u
  return out
end

-- A timeline fell below N: the next `want` posts below its current minimum, from every source.
function Ctx:refill(u, want)
  local key = self:k('tl', u)
  local bound_m, bound_s = self:tl_min(u, key)
  local cands = {}
  for _, a in ipairs(self:sources(u)) do
    local pkey = self:src_key(a)
    local got, offset, page = 0, 0, want + 8
    while got < want do
      local rows
      if bound_s == nil then
        rows = redis.call('ZREVRANGE', pkey, offset, offset + page - 1, 'WITHSCORES')
      else
        rows = redis.call('ZREVRANGEBYSCORE', pkey, bound_s, '-inf', 'WITHSCORES', 'LIMIT', offset, page)
      end
      for i = 1, #rows, 2 do
        local m, s = tl_member(rows[i], a), tonumber(rows[i + 1])
        if bound_s == nil or cmp_gt(bound_s, bound_m, s, m) then
          cands[#cands + 1] = {m, s, a, fmt(s)}
          got = got + 1
          if got >= want then break end
        end
      end
      if #rows < 2 * page then break end
      offset = offset + page
    end
  end
  table.sort(cands, function(x, y) return cmp_gt(x[2], x[1], y[2], y[1]) end)
  local args = {}
  for i = 1, math.min(want, #cands) do
    args[#args + 1] = cands[i][4]
    args[#args + 1] = cands[i][1]
  end
  if #args == 0 then return end
  redis.call('ZADD', key, unpack(args))
  self.card[u] = self.card[u] + #args / 2
  self.min[u] = false
end

-- A deleted post leaves tl:u (or u's queue, when it was queued in this call).
function Ctx:tl_delete(u, m)
  local q = self.pending[u]
  if q ~= nil then
    for i = 1, #q do
      if q[i][1] == m then
        table.remove(q, i)
        return
      end
    end
    -- a refill below reads the sources, which hold the queued posts: apply them first
    if self:tl_card(u, self:k('tl', u)) <= self.N then self:flush_user(u) end
  end
  self:tl_remove(u, {m})
end

-- Remove members from tl:u; a timeline that falls below N is refilled to M.
function Ctx:tl_remove(u, members)
  if #members == 0 then return end
  local key = self:k('tl', u)
  local before = self:tl_card(u, key)
  if before == 0 then return end
  local removed
  if #members == 1 then
    removed = redis.call('ZREM', key, members[1])
  else
    local have, gone = redis.call('ZMSCORE', key, unpack(members)), {}
    for i, m in ipairs(members) do
      if have[i] ~= false then gone[#gone + 1] = m end
    end
    if #gone == 0 then return end
    removed = redis.call('ZREM', key, unpack(gone))
  end
  if removed > 0 then
    self.card[u] = before - removed
    self.min[u] = false
  end
  if removed > 0 and before >= self.N and before - removed < self.N then
    self:refill(u, self.M - (before - removed))
  end
end

-- Author a's latest N + S live posts as {member, score, author, score as a string} (`floor`: only
-- those at or above it).
function Ctx:latest_posts(a, floor)
  local rows
  local key = self:src_key(a)
  if floor == nil then
    rows = redis.call('ZREVRANGE', key, 0, self.N + self.S - 1, 'WITHSCORES')
  else
    rows = redis.call('ZREVRANGEBYSCORE', key, '+inf', floor, 'WITHSCORES', 'LIMIT', 0, self.N + self.S)
  end
  local out = {}
  for i = 1, #rows, 2 do
    out[#out + 1] = {tl_member(rows[i], a), tonumber(rows[i + 1]), a, rows[i + 1]}
  end
  return out
end

function Ctx:tl_floor(u, k)
  local key = self:k('tl', u)
  if self:tl_card(u, key) < k then return nil end
  local _, s = self:tl_min(u, key)
  return s
end

local function members_of(posts)
  local out = {}
  for i, p in ipairs(posts) do out[i] = p[1] end
  return out
end

-- a's followers here, read once per call (no event of a delivery call changes them)
function Ctx:followers(a)
  local f = self.lfol[a]
  if f == nil then
    f = redis.call('SMEMBERS', self:k('lfol', a))
    self.lfol[a] = f
  end
  return f
end

function Ctx:set_celeb(a, celeb)
  if celeb then redis.call('SADD', self:k('celebs'), a) else redis.call('SREM', self:k('celebs'), a) end
  self.celeb[a] = celeb
end

-- An outbox entry for every other partition (id `<offset>-1`: one per event at most).
function Ctx:outbox(kind, ...)
  local names, values = PROTOCOL.deliveries[kind], {...}
  local fields = {'kind', kind}
  for i, name in ipairs(names) do
    fields[#fields + 1] = name
    fields[#fields + 1] = values[i]
  end
  redis.call('XADD', self:k('out'), fmt(self.offset) .. '-1', unpack(fields))
end

-- u stops following a (an unfollow, an erasure of u or of a): the edge, the counts, the timelines.
function Ctx:unfollow(u, a)
  self:change('F-', u, a)
  if redis.call('SREM', self:k('following', u), a) == 0 then return end
  redis.call('SREM', self:k('lfol', a), u)
  local n = redis.call('SCARD', self:k('lfol', a))
  if n + 1 <= self.T then
    local lo = self:tl_floor(u, 1)
    if lo ~= nil then self:tl_remove(u, members_of(self:latest_posts(a, lo))) end
  elseif n <= self.T then
    -- back under the threshold here: fanned out again, to every remaining follower here
    self:set_celeb(a, false)
    local latest = self:latest_posts(a)
    for _, f in ipairs(redis.call('SMEMBERS', self:k('lfol', a))) do self:tl_add(f, latest) end
  end
end

-- Messages in this partition's inboxes that u sent, kept without sender and text (u is erased).
function Ctx:anonymise_sent(u)
  local sent = redis.call('SMEMBERS', self:k('sent', u))
  table.sort(sent)
  for _, rm in ipairs(sent) do
    local r, mid = rm:match('^(%d+):(%d+)$')
    local body = redis.call('HGET', self:k('msgs', r), mid)
    if body ~= false then
      local et = body:match('"event_time":(%-?%d+)')
      local read = redis.call('HEXISTS', self:k('msgs', r), mid .. ':r') == 1
      redis.call('HSET', self:k('msgs', r), mid, msg_json(mid, '0', nil, tonumber(et)))
      self:change('I', r, mid, '0', cjson.null, et, read and 1 or 0)
    end
  end
  redis.call('DEL', self:k('sent', u))
end

-- Followers here of an erased u lose the edge (F-), and u's posts leave their timelines. The
-- posts are gone from `key` first, so no refill takes them back.
function Ctx:drop_author(u, key, bodies)
  self.apcard[u] = nil
  local latest = {}
  for i, m in ipairs(redis.call('ZREVRANGE', key, 0, self.N + self.S - 1)) do latest[i] = tl_member(m, u) end
  if bodies then
    for _, m in ipairs(redis.call('ZRANGE', key, 0, -1)) do redis.call('DEL', self:bkey(u, m)) end
  end
  redis.call('DEL', key)
  local celeb = self:is_celeb(u)
  local followers = redis.call('SMEMBERS', self:k('lfol', u))
  table.sort(followers)
  for _, f in ipairs(followers) do
    if not celeb then self:tl_remove(f, latest) end
    redis.call('SREM', self:k('following', f), u)
    self:change('F-', f, u)
  end
  redis.call('DEL', self:k('lfol', u))
  if celeb then self:set_celeb(u, false) end
end

-- ---------------------------------------------------------------------------------------------
-- The event types (source calls). Each returns nil (applied) or a rejection reason (no effect).
-- ---------------------------------------------------------------------------------------------
local apply = {}

function apply.user_registered(c, e)
  redis.call('HSET', c:k('users'), e.user, user_json(e.handle, e.display_name))
  c:change('U', e.user, e.handle, e.display_name, e.event_time)
end

function apply.status_updated(c, e)
  redis.call('HSET', c:k('status'), e.user, status_json(e.text, e.event_time))
  c:change('S', e.user, e.text, e.event_time)
end

function apply.followed(c, e)
  local u, a = e.user, e.followee
  if c:is_gone(a) then return end -- a follow of an erased user: no edge (docs/views.md)
  c:change('F+', u, a, e.event_time)
  if redis.call('SADD', c:k('following', u), a) == 0 then return end
  redis.call('SADD', c:k('lfol', a), u)
  local n = redis.call('SCARD', c:k('lfol', a))
  if n > c.T and n - 1 <= c.T then
    -- over the threshold here: a's posts leave its followers' timelines here (celebrity first,
    -- so no refill takes them back)
    c:set_celeb(a, true)
    local latest = members_of(c:latest_posts(a))
    for _, f in ipairs(redis.call('SMEMBERS', c:k('lfol', a))) do c:tl_remove(f, latest) end
  elseif n <= c.T then
    c:tl_add(u, c:latest_posts(a, c:tl_floor(u, c.N)))
  end
end

function apply.unfollowed(c, e) c:unfollow(e.user, e.followee) end

function apply.post_created(c, e)
  local a, pid, et = e.user, e.post_id, e.event_time
  if redis.call('HEXISTS', c:k('pids', a), pid) == 1 then return 'reused_id' end
  local m = pad(pid)
  redis.call('HSET', c:k('pids', a), pid, 1)
  redis.call('ZADD', c:k('posts', a), et, m)
  redis.call('SET', c:bkey(a, m), post_json(pid, a, e.text, et))
  c:change('P', a, pid, et, e.text, 0, nil)
  c:outbox('post', a, pid, fmt(et), e.text)
end

function apply.post_deleted(c, e)
  local a, pid = e.user, e.post_id
  local live = redis.call('HGET', c:k('pids', a), pid)
  if live == false then return 'not_own_post' end
  if live == '0' then return 'post_already_deleted' end
  local m = pad(pid)
  local created = tonumber(redis.call('ZSCORE', c:k('posts', a), m))
  local body = cjson.decode(redis.call('GET', c:bkey(a, m)))
  redis.call('HSET', c:k('pids', a), pid, 0)
  redis.call('ZREM', c:k('posts', a), m)
  redis.call('DEL', c:bkey(a, m))
  c:change('P', a, pid, created, body.text, 1, e.event_time)
  -- the post that now enters a's latest N + S, for the replicas elsewhere
  local k = c.N + c.S - 1
  local nxt = redis.call('ZREVRANGE', c:k('posts', a), k, k, 'WITHSCORES')
  if nxt[1] then
    local npid = unpad(nxt[1])
    local ntext = cjson.decode(redis.call('GET', c:bkey(a, nxt[1]))).text
    c:outbox('delete', a, pid, npid, nxt[2], ntext)
  else
    c:outbox('delete', a, pid, '', '', '')
  end
end

function apply.message_sent(c, e)
  local r, mid = e.user, e.message_id
  local m = pad(mid)
  if redis.call('ZSCORE', c:k('inbox', r), m) ~= false then return 'reused_id' end
  local sender, text = e.sender, e.text
  if c:is_gone(sender) then
    sender, text = '0', cjson.null -- from an erased user: kept for the recipient, anonymised
  else
    redis.call('SADD', c:k('sent', sender), r .. ':' .. mid)
  end
  redis.call('ZADD', c:k('inbox', r), e.event_time, m)
  redis.call('HSET', c:k('msgs', r), mid, msg_json(mid, sender, text, e.event_time))
  local n = redis.call('HINCRBY', c:k('unread'), r, 1)
  c:change('I', r, mid, sender, text, e.event_time, 0)
  c:change('N', r, n)
end

function apply.message_read(c, e)
  local r, mid = e.user, e.message_id
  local body = redis.call('HGET', c:k('msgs', r), mid)
  if body == false then return 'not_in_inbox' end
  if redis.call('HSETNX', c:k('msgs', r), mid .. ':r', 1) == 0 then return end -- read before
  local n = redis.call('HINCRBY', c:k('unread'), r, -1)
  c:change('I', r, mid, body:match('"sender_id":(%d+)'), cjson.decode(body).text or cjson.null,
    body:match('"event_time":(%-?%d+)'), 1)
  c:change('N', r, n)
end

-- u is erased (docs/views.md, "Erasure"): everything of u here goes, what others hold of u here is
-- removed or anonymised, and every other partition is told (an `erase` delivery).
function apply.user_erased(c, e)
  local u = e.user
  redis.call('SADD', c:k('erased'), u)
  redis.call('SADD', c:k('gone'), u)
  c.any_erased, c.any_gone = true, true
  local pids = redis.call('HKEYS', c:k('pids', u))
  table.sort(pids, function(x, y) return pad(x) < pad(y) end)
  for _, pid in ipairs(pids) do c:change('P-', u, pid) end
  for _, m in ipairs(redis.call('ZRANGE', c:k('posts', u), 0, -1)) do redis.call('DEL', c:bkey(u, m)) end
  redis.call('DEL', c:k('pids', u), c:k('posts', u))
  c:drop_author(u, c:k('ap', u), true)
  -- u's own timeline, and the edges u made (the authors u followed may fall back under T here)
  redis.call('DEL', c:k('tl', u))
  c.card[u], c.min[u] = 0, false
  local following = redis.call('SMEMBERS', c:k('following', u))
  table.sort(following)
  for _, a in ipairs(following) do c:unfollow(u, a) end
  redis.call('DEL', c:k('following', u))
  if redis.call('HDEL', c:k('users'), u) == 1 then c:change('U-', u) end
  if redis.call('HDEL', c:k('status'), u) == 1 then c:change('S-', u) end
  local msgs = redis.call('HGETALL', c:k('msgs', u))
  for i = 1, #msgs, 2 do
    if not msgs[i]:find(':r', 1, true) then
      local sender = msgs[i + 1]:match('"sender_id":(%d+)')
      if sender ~= '0' then redis.call('SREM', c:k('sent', sender), u .. ':' .. msgs[i]) end
      c:change('I-', u, msgs[i])
    end
  end
  redis.call('DEL', c:k('msgs', u), c:k('inbox', u))
  if redis.call('HDEL', c:k('unread'), u) == 1 then c:change('N-', u) end
  c:anonymise_sent(u)
  c:outbox('erase', u)
end

-- ---------------------------------------------------------------------------------------------
-- Deliveries (target calls): another partition's post, delete or erasure, applied here.
-- ---------------------------------------------------------------------------------------------
local deliver = {}

-- Keep a's replica at its latest N + S (the trimmed posts' bodies go with them).
-- (its size read once per author and call, then kept: only deliveries change a replica)
function Ctx:trim_replica(a, added)
  local key = self:k('ap', a)
  local n = self.apcard[a]
  if n == nil then n = redis.call('ZCARD', key) else n = n + added end
  local over = n - (self.N + self.S)
  if over > 0 then
    if not self.own then
      for _, m in ipairs(redis.call('ZRANGE', key, 0, over - 1)) do redis.call('DEL', self:bkey(a, m)) end
    end
    redis.call('ZREMRANGEBYRANK', key, 0, over - 1)
    n = n - over
  end
  self.apcard[a] = n
end

-- A post enters the replica (its body too, unless it was written here, in its author's partition)
-- and the timelines here it goes to: the author's own, when it is here, and its followers here.
function deliver.post(c, d)
  local a, pid, et = d.author, d.post_id, tonumber(d.event_time)
  if c:is_gone(a) then return end
  local m = pad(pid)
  if redis.call('ZADD', c:k('ap', a), et, m) == 0 then error('post ' .. a .. ':' .. pid .. ' delivered twice') end
  if not c.own then redis.call('SET', c:bkey(a, m), post_json(pid, a, d.text, et)) end
  c:trim_replica(a, 1)
  local post = {tl_member(m, a), et, a, fmt(et)}
  if c.own then c:queue({a}, post) end
  if not c:is_celeb(a) then c:queue(c:followers(a), post) end
end

function deliver.delete(c, d)
  local a, pid = d.author, d.post_id
  if c:is_gone(a) then return end
  local key = c:k('ap', a)
  c.apcard[a] = nil -- (the size changes by whatever the replica held: read again when needed)
  redis.call('ZREM', key, pad(pid))
  if not c.own then redis.call('DEL', c:bkey(a, pad(pid))) end
  if d.next_post ~= '' and redis.call('ZADD', key, d.next_time, pad(d.next_post)) == 1 and not c.own then
    redis.call('SET', c:bkey(a, pad(d.next_post)), post_json(d.next_post, a, d.next_text, tonumber(d.next_time)))
  end
  local tm = tl_member(pad(pid), a)
  if c.own then c:tl_delete(a, tm) end
  if not c:is_celeb(a) then
    for _, f in ipairs(c:followers(a)) do c:tl_delete(f, tm) end
  end
end

function deliver.erase(c, d)
  if c.own then return end -- the source's own call did all of it
  local u = d.user
  c:flush()
  redis.call('SADD', c:k('gone'), u)
  c.any_gone = true
  c:drop_author(u, c:k('ap', u), true)
  c:anonymise_sent(u)
end

@DEDUP@

local DISPOSITION = {a = 'applied', d = 'duplicates', r = 'rejected', q = 'quarantined'}

local FLUSH_BEFORE = {
  followed = function(c, e)
    c:flush_user(e.user)
    if redis.call('SCARD', c:k('lfol', e.followee)) == c.T then c:flush() end
  end,
  unfollowed = function(c, e)
    c:flush_user(e.user)
    if redis.call('SCARD', c:k('lfol', e.followee)) == c.T + 1 then c:flush() end
  end,
  user_erased = function(c) c:flush() end,
}

-- The named arguments `names` from args[i]: a table and the index after them.
local function named(args, i, names, into)
  local out = into or {}
  for j, name in ipairs(names) do out[name] = args[i + j - 1] end
  return out, i + #names
end

-- One event from args[i]: the event, and the index of the next.
local function decode_event(args, i)
  if args[i + 1] == '!' then return named(args, i, PROTOCOL.quarantined) end
  local e, j = named(args, i, PROTOCOL.event)
  local fields = PROTOCOL.events[e.type]
  if fields == nil then error('protocol: event type ' .. tostring(e.type) .. ' unknown to library ' .. VERSION) end
  e, j = named(args, j, fields, e)
  e.received_time, e.event_time = tonumber(e.received_time), tonumber(e.event_time)
  return e, j
end

local function apply_one(c, counts, e)
  local before = FLUSH_BEFORE[e.type]
  if before then before(c, e) end
  c.changes = {}
  local disp, reason
  if e.type == '!' then
    disp, reason = 'q', e.reason
  elseif dedup(c, e.event_id, e.received_time) then
    disp = 'd'
  elseif c:is_erased(e.user) then
    disp, reason = 'r', 'user_erased'
  else
    local ok, res = pcall(apply[e.type], c, e)
    if not ok then
      disp, reason = 'q', 'processing_error:' .. tostring(res):sub(1, 200)
    elseif res ~= nil then
      disp, reason = 'r', res
    else
      disp = 'a'
    end
  end
  counts[disp] = counts[disp] + 1
  local entry = {'d', disp}
  if reason then entry[#entry + 1] = 'r'; entry[#entry + 1] = reason end
  if #c.changes > 0 then entry[#entry + 1] = 'c'; entry[#entry + 1] = cjson.encode(c.changes) end
  c.entries[#c.entries + 1] = {fmt(c.offset + 1) .. '-0', entry}
end

local function check_layout(c)
  local key = c:k('layout')
  local have = redis.call('GET', key)
  if have == false then
    redis.call('SET', key, LAYOUT)
  elseif have ~= LAYOUT then
    error('LAYOUT partition ' .. c.p .. ' of ' .. c.ns .. ' holds layout ' .. have .. ', this library writes ' ..
      LAYOUT .. ': rebuild it from the log (python -m pipelines.rebuild run)')
  end
end

-- A call's header (the protocol's `call` names) and context; the key it was routed by must be its
-- partition's fence (a call over another partition's keys is refused).
local function open_call(call, keys, args)
  local header, i = named(args, 1, PROTOCOL[call])
  local c = new_ctx(header.namespace, header.partition, header)
  if keys[1] ~= c:k('fence') then error('protocol: key ' .. tostring(keys[1]) .. ' is not ' .. c:k('fence'), 0) end
  check_layout(c)
  return c, i
end

local function p_apply(keys, args)
  local c, i = open_call('apply', keys, args)
  c.seenq, c.wq, c.wt, c.entries = c:k('seenq'), c:k('dq'), c:k('dqt'), {}
  c.wcache = {}
  local start = tonumber(redis.call('GET', keys[1]) or '0')
  local next_offset = start
  c.hwm = tonumber(redis.call('GET', c:k('hwm')) or '-inf')
  local hwm0 = c.hwm
  local counts = {a = 0, d = 0, r = 0, q = 0, skipped = 0}
  local ok, err = pcall(function()
    while i <= #args do
      local e
      e, i = decode_event(args, i)
      e.offset = tonumber(e.offset)
      if e.offset < next_offset then
        counts.skipped = counts.skipped + 1
      else
        c.offset = e.offset
        apply_one(c, counts, e)
        next_offset = e.offset + 1
      end
    end
  end)
  local ok_w, err_w = pcall(function()
    c:flush()
    for _, rec in ipairs(c.entries) do redis.call('XADD', c:k('changelog'), rec[1], unpack(rec[2])) end
  end)
  if ok and not ok_w then ok, err = ok_w, err_w end
  if next_offset ~= start then redis.call('SET', keys[1], fmt(next_offset)) end
  if c.hwm ~= hwm0 then redis.call('SET', c:k('hwm'), fmt(c.hwm)) end
  dedup_forget(c)
  for d, name in pairs(DISPOSITION) do
    if counts[d] > 0 then redis.call('HINCRBY', c:k('stats'), name, counts[d]) end
  end
  if not ok then error(err) end
  return {counts.a, counts.d, counts.r, counts.q, counts.skipped}
end

local function p_deliver(keys, args)
  local c, i = open_call('deliver', keys, args)
  local dfence = c:k('dfence')
  local fence = redis.call('GET', keys[1]) or '0'
  local counts = {applied = 0, skipped = 0, quarantined = 0}
  local moved = false
  while i <= #args do
    local seg
    seg, i = named(args, i, PROTOCOL.segment)
    local src, upto = seg.source, tonumber(seg.upto)
    c.own = src == c.p
    local start = tonumber(redis.call('HGET', dfence, src) or '0')
    local covered = start
    for _ = 1, tonumber(seg.count) do
      local d = named(args, i, PROTOCOL.delivery)
      local n = tonumber(args[i + 2])
      local offset = tonumber(d.offset)
      local values = {unpack(args, i + 3, i + 2 + n)}
      i = i + 3 + n
      if offset < covered then
        counts.skipped = counts.skipped + 1
      else
        covered = offset + 1
        c.changes = {}
        local names = PROTOCOL.deliveries[d.kind]
        local ok, err
        if names == nil or #names ~= n then
          ok, err = false, 'unexpected delivery ' .. tostring(d.kind) .. ' with ' .. n .. ' fields'
        else
          named(values, 1, names, d)
          ok, err = pcall(deliver[d.kind], c, d)
        end
        if ok then
          counts.applied = counts.applied + 1
          if #c.changes > 0 then
            redis.call('XADD', c:k('changelog'), fence .. '-*', 'd', 'x', 'src', src .. ':' .. d.offset,
              'c', cjson.encode(c.changes))
          end
        else
          counts.quarantined = counts.quarantined + 1
          redis.call('XADD', c:k('dlq'), '*', 'source', src, 'offset', d.offset, 'kind', tostring(d.kind),
            'reason', tostring(err):sub(1, 200), 'fields', cjson.encode(values))
        end
      end
    end
    if upto > covered then covered = upto end
    if covered > start then
      redis.call('HSET', dfence, src, fmt(covered))
      moved = true
    end
  end
  c.own = false
  c:flush()
  -- A complete state (its own deliveries at its fence) is a mark: the archiver's cut is a vector
  -- every partition marked (pipelines/speed/changelog.py, SettledCuts).
  if moved and tonumber(redis.call('HGET', dfence, c.p) or '0') == tonumber(fence) then
    redis.call('XADD', c:k('marks'), 'MAXLEN', '~', MARKS_KEPT, '*', unpack(redis.call('HGETALL', dfence)))
  end
  if counts.quarantined > 0 then redis.call('HINCRBY', c:k('stats'), 'deliveries_quarantined', counts.quarantined) end
  return {counts.applied, counts.skipped, counts.quarantined}
end

-- Restore (pipelines/restore.py): partition p's state at a whole position P from the Delta views,
-- written with the encoders the events write with. `FCALL p_restore 1 <ns>:{<p>}:fence <restore
-- header> <row>...`, each row `width` strings named by `restore_rows[kind]` (protocol.json). `Z`
-- (dfence) comes before `Y` (the fence, last), which also marks the complete state for the archiver.
local RESTORE = {
  U = function(c, r) redis.call('HSET', c:k('users'), r.user, user_json(r.handle, r.display_name)) end,
  S = function(c, r) redis.call('HSET', c:k('status'), r.user, status_json(r.text, tonumber(r.event_time))) end,
  F = function(c, r)
    redis.call('SADD', c:k('following', r.user), r.followee)
    redis.call('SADD', c:k('lfol', r.followee), r.user)
  end,
  C = function(c, r) redis.call('SADD', c:k('celebs'), r.author) end,
  P = function(c, r)
    if r.deleted == '1' then
      redis.call('HSET', c:k('pids', r.author), r.post_id, 0)
    else
      local m = pad(r.post_id)
      redis.call('HSET', c:k('pids', r.author), r.post_id, 1)
      redis.call('ZADD', c:k('posts', r.author), r.event_time, m)
      redis.call('SET', c:bkey(r.author, m), post_json(r.post_id, r.author, r.text, tonumber(r.event_time)))
    end
  end,
  R = function(c, r)
    local m = pad(r.post_id)
    redis.call('ZADD', c:k('ap', r.author), r.event_time, m)
    if r.own ~= '1' then
      redis.call('SET', c:bkey(r.author, m), post_json(r.post_id, r.author, r.text, tonumber(r.event_time)))
    end
  end,
  T = function(c, r) redis.call('ZADD', c:k('tl', r.user), r.event_time, tl_member(pad(r.post_id), r.author)) end,
  I = function(c, r)
    local rcpt, mid, sender, text = r.recipient, r.message_id, r.sender, r.text
    redis.call('ZADD', c:k('inbox', rcpt), r.event_time, pad(mid))
    if sender == '0' then text = nil else redis.call('SADD', c:k('sent', sender), rcpt .. ':' .. mid) end
    redis.call('HSET', c:k('msgs', rcpt), mid, msg_json(mid, sender, text, tonumber(r.event_time)))
    if r.read == '1' then redis.call('HSET', c:k('msgs', rcpt), mid .. ':r', 1) end
  end,
  N = function(c, r) redis.call('HSET', c:k('unread'), r.user, r.unread) end,
  E = function(c, r) redis.call('SADD', c:k('erased'), r.user) end,
  G = function(c, r) redis.call('SADD', c:k('gone'), r.user) end,
  D = function(c, r) redis.call('ZADD', c:k('seenq'), r.received_time, r.event_id) end,
  W = function(c, r)
    c.wq, c.wt = c:k('dq'), c:k('dqt')
    dedup_restore_writer(c, r.writer, r.hi, r.last, r.reorder, r.seqs)
  end,
  H = function(c, r) redis.call('SET', c:k('hwm'), r.hwm) end,
  X = function(c, r) redis.call('HSET', c:k('stats'), r.field, r.count) end,
  Z = function(c, r) redis.call('HSET', c:k('dfence'), r.source, r.offset) end,
  Y = function(c, r)
    redis.call('SET', c:k('fence'), r.offset)
    if tonumber(redis.call('HGET', c:k('dfence'), c.p) or '0') == tonumber(r.offset) then
      redis.call('XADD', c:k('marks'), 'MAXLEN', '~', MARKS_KEPT, '*', unpack(redis.call('HGETALL', c:k('dfence'))))
    end
  end,
}

local function p_restore(keys, args)
  local header, i = named(args, 1, PROTOCOL.restore)
  local c = setmetatable({ns = header.namespace, p = header.partition,
    pre = header.namespace .. ':{' .. header.partition .. '}:'}, Ctx)
  if keys[1] ~= c:k('fence') then error('protocol: key ' .. tostring(keys[1]) .. ' is not ' .. c:k('fence'), 0) end
  local names, write, width = PROTOCOL.restore_rows[header.kind], RESTORE[header.kind], tonumber(header.width)
  if names == nil or write == nil or #names ~= width then
    error('protocol: restore rows ' .. tostring(header.kind) .. ' of ' .. tostring(header.width) .. ' fields', 0)
  end
  check_layout(c)
  local n = 0
  while i <= #args do
    local r
    r, i = named(args, i, names)
    write(c, r)
    n = n + 1
  end
  return n
end

-- `FCALL_RO p_cut 1 <ns>:{<p>}:fence <ns> <p>` -> {fence, {source, dfence, ...}, p}: what partition
-- p's state covers, read atomically (its own log below `fence`, each source's deliveries below dfence).
local function p_cut(keys, args)
  local pre = args[1] .. ':{' .. args[2] .. '}:'
  return {tonumber(redis.call('GET', pre .. 'fence') or '0'), redis.call('HGETALL', pre .. 'dfence'), tonumber(args[2])}
end

-- The home timeline read: tl:u merged with the posts of the authors u follows that are
-- celebrities here, newest first, the first `limit` bodies, and the cut they cover.
-- `FCALL_RO p_timeline 1 <ns>:{<p>}:fence <ns> <p> <user> <limit>` -> {{fence, dfence pairs}, {body...}}
local function p_timeline(keys, args)
  local ns, p, u, limit = args[1], args[2], args[3], tonumber(args[4])
  local pre = ns .. ':{' .. p .. '}:'
  local c = setmetatable({pre = pre}, Ctx)
  local cut = p_cut(keys, {ns, p})
  local srcs, suffix = {pre .. 'tl:' .. u}, {''}
  for _, a in ipairs(redis.call('SINTER', pre .. 'following:' .. u, pre .. 'celebs')) do
    srcs[#srcs + 1] = c:src_key(a)
    suffix[#suffix + 1] = pad(a)
  end
  local bodies = {}
  if limit < 1 then return {cut, bodies} end
  local bpre = pre .. 'b:'
  if #srcs == 1 then -- no celebrity followed: the fanned-out timeline is the answer
    for i, m in ipairs(redis.call('ZREVRANGE', srcs[1], 0, limit - 1)) do bodies[i] = bpre .. m end
    if #bodies > 0 then bodies = redis.call('MGET', unpack(bodies)) end
    return {cut, bodies}
  end
  -- tl:u's first `limit`, then of each celebrity only the posts at or above the lowest of those
  -- (when tl:u has `limit`, nothing below it can be in the answer): most reads take a few posts
  -- of each celebrity, not a page. Each source is read once, its members made whole once.
  local first = redis.call('ZREVRANGE', srcs[1], 0, limit - 1, 'WITHSCORES')
  local floor = #first == 2 * limit and first[#first] or nil
  -- the celebrities' candidates (few: at or above tl:u's lowest), sorted, then merged with tl:u,
  -- whose members are whole already and whose scores are read only while candidates are left
  local cands = {}
  for i = 2, #srcs do
    local r
    if floor then
      r = redis.call('ZREVRANGEBYSCORE', srcs[i], '+inf', floor, 'WITHSCORES', 'LIMIT', 0, limit)
    else
      r = redis.call('ZREVRANGE', srcs[i], 0, limit - 1, 'WITHSCORES')
    end
    local sfx = suffix[i]
    for j = 1, #r, 2 do cands[#cands + 1] = {tonumber(r[j + 1]), r[j] .. sfx} end
  end
  table.sort(cands, function(x, y) return cmp_gt(x[1], x[2], y[1], y[2]) end)
  local t, k, nt = 1, 1, #first
  while #bodies < limit do
    local c = cands[k]
    if c == nil then -- the rest of tl:u as it is
      while #bodies < limit and t < nt do
        bodies[#bodies + 1] = bpre .. first[t]
        t = t + 2
      end
      break
    end
    local m = first[t]
    local s = m and tonumber(first[t + 1])
    if s ~= nil and (s > c[1] or (s == c[1] and m > c[2])) then
      bodies[#bodies + 1] = bpre .. m
      t = t + 2
    else
      bodies[#bodies + 1] = bpre .. c[2]
      k = k + 1
    end
  end
  if #bodies > 0 then bodies = redis.call('MGET', unpack(bodies)) end
  return {cut, bodies}
end

-- The protocol as this library decodes it: `FCALL_RO p_decode 0 <event>...` -> {{name, value,
-- ...}, ...} (contract/functions.py's test that the encoder and the decoder agree).
local function p_decode(keys, args)
  local out, i = {}, 1
  while i <= #args do
    local e
    e, i = decode_event(args, i)
    local flat = {}
    for name, v in pairs(e) do flat[#flat + 1] = name; flat[#flat + 1] = tostring(v) end
    out[#out + 1] = flat
  end
  return out
end

local function p_version() return VERSION end

redis.register_function('p_apply', p_apply)
redis.register_function('p_deliver', p_deliver)
redis.register_function('p_restore', p_restore)
redis.register_function{function_name = 'p_cut', callback = p_cut, flags = {'no-writes'}}
redis.register_function{function_name = 'p_timeline', callback = p_timeline, flags = {'no-writes'}}
redis.register_function{function_name = 'p_decode', callback = p_decode, flags = {'no-writes', 'no-cluster'}}
redis.register_function{function_name = 'p_version', callback = p_version, flags = {'no-writes'}}
