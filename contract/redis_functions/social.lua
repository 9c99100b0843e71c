#!lua name=social
--[[
The speed layer's keyed state machine, run inside Redis (docs/architecture.md, "Keyed speed layer").

`FCALL social_apply 0 <ns> <partition> <dedup_window_ms> <dedup_grace_ms> <timeline_n> <fanout_threshold>
 <timeline_slack> <dedup_reorder> <event>...` applies a run of events of ONE Kafka partition, in offset order. Each event is
EVENT_ARGS arguments: offset, type, event_id, user_id, received_time, event_time, id1, id2, s1, s2
  user_registered  s1 = handle, s2 = display_name
  status_updated   s1 = text
  followed         id1 = followee_id            unfollowed  id1 = followee_id
  post_created     id1 = post_id, s1 = text     post_deleted id1 = post_id
  message_sent     id1 = message_id, id2 = sender_id (user_id is the recipient), s1 = text
  message_read     id1 = message_id
  user_erased      (the envelope only)
  "!"              a record the contract rejected before Redis: s1 = its reason

Per event, atomically (a function runs alone in Redis):
  1. the per-partition fence: an offset below `fence[p]` was applied already and is skipped, so a
     re-run of any batch after a crash changes nothing;
  2. dedup (docs/views.md): a duplicate is an event_id seen before in this partition with a
     received_time at most the window before this one;
  3. stateful validity and the effects on the views, maintaining exactly, after every event:
     tl:<u> begins with the latest N posts by u or by the non-celebrity authors u follows. Because that
     holds after every event whatever the partition it came from, the state is a function of the
     set of applied events, not of how partitions interleave;
  4. accounting (stats:<p>) and one changelog entry (stream changelog:<p>, id "<offset>-1", so an
     entry exists once per offset by construction) with the disposition, the view changes and a
     global sequence number `s` (key seq): the order in which Redis applied events of all
     partitions, so the last change per key in `s` order is the key's value (the compaction's rule).

Erasure (docs/views.md, "Erasure"): `erased` is the set of erased user ids, a tombstone kept forever.
An event whose key user (the partition key: user_id, or the recipient of a message) is erased was
written after the erasure in the same partition: rejected `user_erased`, decided in log order. An
event of another partition that names an erased user (a follow of them, a message from them) is
applied with the effect the set of events defines whatever the interleaving: no edge, and the
message lands with sender 0 and no text. `sent:<u>` ("<recipient>:<message>") finds the messages
u sent, to anonymise them when u is erased.

`FCALL_RO social_cut 0 <ns>` returns {seq, partition, next offset, ...} read in one atomic step: a
consistent cut. The events below those offsets are exactly the changelog entries with s <= seq, and
the state at that moment is the views at that log position (the archiver archives only such cuts).

Identity (docs/views.md, "Identity"): a post is (author_id, post_id) and a message is
(recipient_id, message_id), both decided in the owner's partition. Two authors may use one post_id:
they are two posts. So every post key names its author (`p:<author>:<post>`, `pids:<author>`,
`posts:<author>`), and a timeline member is the post id and its author id, each zero-padded to 19
digits (38 characters): ZREVRANGE order = (event_time, post_id, author_id) descending, the view's
order. Inbox members are message ids zero-padded to 19 digits (an inbox has one owner). Scores are
corrected event times (ms, exact as doubles below 2^53). Ids stay strings here: Lua numbers are
doubles and would round 64-bit ids.

Layout: `<ns>:layout` holds LAYOUT, written by the first `social_apply` of a namespace. A namespace
whose state was written by an older layout (a fence and no or another layout) is refused with one
line naming the rebuild command, never read with the wrong key format.
]]

local VERSION = '23'
local LAYOUT = '2' -- the key format of the state (1: posts keyed by post_id alone)
local EVENT_ARGS = 10

local function cmp_gt(s1, m1, s2, m2) -- (score, member) ordering of the timelines
  if s1 ~= s2 then return s1 > s2 end
  return m1 > m2
end

local function pad(id) return string.rep('0', 19 - #id) .. id end
local function unpad(s) return (s:gsub('^0+(%d)', '%1')) end
-- A timeline member: post id then author id, both padded (the view's tie order, descending).
local function tl_member(pid_padded, author) return pid_padded .. pad(author) end
-- The post body key of a timeline member.
local function body_key(ns, m) return ns .. ':p:' .. unpad(m:sub(20)) .. ':' .. unpad(m:sub(1, 19)) end

local Ctx = {}
Ctx.__index = Ctx

-- A key of the namespace: `c:k('tl', u)` -> '<ns>:tl:<u>' (no table per call: this is the hot path).
function Ctx:k(a, b)
  if b == nil then return self.ns .. ':' .. a end
  return self.ns .. ':' .. a .. ':' .. b
end

-- A view change for the changelog; numbers as integer strings (cjson would round them).
function Ctx:change(...)
  local row = {...}
  for i = 1, select('#', ...) do
    if type(row[i]) == 'number' then row[i] = string.format('%d', row[i]) end
  end
  self.changes[#self.changes + 1] = row
end

-- A timeline change for the changelog, grouped by post: an entry's timeline changes are items
-- '+<member>:<event_time>:<user> <user>...' and '-<member>:<user> <user>...' (the member as the
-- timeline holds it: post and author, 19 digits each), in the order each item first occurs. The
-- fan-out's hot path appends a user id to its post's list: no string is built per follower.
-- (Within one entry a (user, member) pair changes at most once, so grouping keeps the compaction's
-- rule, the last change per key in (s, position) order, exact.)
function Ctx:tl_change(sign, u, m, score_s)
  local t = self.tl
  if sign == '+' then
    local b = t.trim[u]
    if b ~= nil and cmp_gt(b[2], b[1], tonumber(score_s), m) then
      error('timeline ' .. u .. ': an entry below a trim of the same changelog entry')
    end
  end
  local g = t[sign]
  local users = g[m]
  if users == nil then
    users = {}
    g[m] = users
    t.order[#t.order + 1] = {sign, m, score_s}
  end
  users[#users + 1] = u
end

-- A trim of tl:u for the changelog: u's timeline dropped every entry below (score, member), the
-- lowest it kept. One item per user and entry, '~<member>:<event_time>:<user>', listed after the
-- entry's other items: it applies to the entries whose last change is in this entry or before
-- (pipelines/speed/changelog.py). Exact because no change of u below the bound follows a trim in
-- the same entry (tl_change refuses one): a trim leaves M >= N entries, and only a refill adds
-- below the minimum, after removals that take a timeline below N.
function Ctx:tl_trim(u, m, score_s)
  local t = self.tl
  if t.trim[u] == nil then t.trim_order[#t.trim_order + 1] = u end
  t.trim[u] = {m, tonumber(score_s), score_s}
end

local function new_tl() return {['+'] = {}, ['-'] = {}, order = {}, trim = {}, trim_order = {}} end

-- The entry's timeline changes as the changelog's `t` field (nil when there are none).
local function tl_field(t)
  if #t.order == 0 and #t.trim_order == 0 then return nil end
  local items = {}
  for i, o in ipairs(t.order) do
    local sign, m = o[1], o[2]
    if sign == '+' then
      items[i] = '+' .. m .. ':' .. o[3] .. ':' .. table.concat(t['+'][m], ' ')
    else
      items[i] = '-' .. m .. ':' .. table.concat(t['-'][m], ' ')
    end
  end
  for _, u in ipairs(t.trim_order) do
    local b = t.trim[u]
    items[#items + 1] = '~' .. b[1] .. ':' .. b[3] .. ':' .. u
  end
  return table.concat(items, ',')
end

-- The JSON values of the state, written the same way by the events and by a restore.
local function user_json(handle, display_name)
  return '{"handle":' .. cjson.encode(handle) .. ',"display_name":' .. cjson.encode(display_name) .. '}'
end
local function status_json(text, et)
  return '{"text":' .. cjson.encode(text) .. ',"event_time":' .. string.format('%d', et) .. '}'
end
local function post_json(pid, a, text, et)
  return '{"post_id":' .. pid .. ',"author_id":' .. a .. ',"text":' .. cjson.encode(text) ..
    ',"event_time":' .. string.format('%d', et) .. '}'
end
local function msg_json(mid, sender, text, et, read)
  if text == nil or text == cjson.null then text = cjson.null end
  return '{"message_id":' .. mid .. ',"sender_id":' .. sender .. ',"text":' .. cjson.encode(text) ..
    ',"event_time":' .. string.format('%d', et) .. ',"read":' .. (read and 'true' or 'false') .. '}'
end

function Ctx:is_celeb(a) return redis.call('SISMEMBER', self:k('celebs'), a) == 1 end
-- `any_erased` (read once per call): while no user was ever erased, no event asks Redis (a set
-- only grows: erasure tombstones are kept forever)
function Ctx:is_erased(u)
  if self.any_erased == false then return false end
  return redis.call('SISMEMBER', self:k('erased'), u) == 1
end

-- Timelines keep the latest K posts, N <= K <= N + S (S = slack) whenever that many are eligible
-- (all of them otherwise). Both ends are amortised around M = N + S/2: removals eat into the slack,
-- and only a timeline that falls below N is refilled, back to M; inserts grow it, and only one
-- that passes N + S is trimmed, back to M, so a refill's or a trim's cost is shared by ~S/2
-- changes. The view is the first N (reads never ask for more); the slack is exact too, so any
-- prefix is the definition.

-- Each timeline's size and minimum, read once per call and kept as this call changes the timeline
-- (a function runs alone: nothing else writes meanwhile). The fan-out's flushes would otherwise ask
-- Redis for both at every flush of every timeline. `min` false: not known, read it when needed.
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

-- Add posts (list of {member, score, author, score formatted}) to tl:u; logs the net change.
-- `fresh`: posts created in this call, queued by the fan-out, which no path can have put into
-- tl:u yet (every path that adds older posts flushes u's queue first): no ZMSCORE, and a ZADD that
-- finds one of them there is an error, not a silent double count.
-- A timeline holding N or more has dropped older posts: a post below its minimum may have
-- eligible posts between it and the minimum, so it is not part of the kept prefix.
function Ctx:tl_add(u, posts, fresh)
  local key = self:k('tl', u)
  local n = self:tl_card(u, key)
  local min_s, min_m
  if n >= self.N then min_m, min_s = self:tl_min(u, key) end
  -- the posts above the minimum of a timeline holding N or more (cmp_gt inlined: the fan-out's
  -- hot path)
  local add = {}
  for _, p in ipairs(posts) do
    local s = p[2]
    if min_s == nil or s > min_s or (s == min_s and p[1] > min_m) then add[#add + 1] = p end
  end
  if #add == 0 then return end
  if not fresh then -- older posts: those tl:u holds already, or listed twice, are not added again
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
  -- scores as the strings they are (a number would be printed through %.17g)
  local args = {}
  for i, p in ipairs(add) do
    args[2 * i - 1] = p[4]
    args[2 * i] = p[1]
  end
  local count = #add
  if redis.call('ZADD', key, unpack(args)) ~= count then
    error('fan-out into ' .. key .. ': a new post was in the timeline already')
  end
  -- the minimum stays unless the timeline held fewer than N (posts below it were taken) or is trimmed
  if min_s == nil then self.min[u] = false end
  n = n + count
  local bound_m, bound_s
  if n > self.N + self.S then
    -- back to M: the lowest n - M go, without reading them back (the changelog logs the bound)
    local k = n - self.M
    local lo = redis.call('ZRANGE', key, k, k, 'WITHSCORES')
    redis.call('ZREMRANGEBYRANK', key, 0, k - 1)
    bound_m, bound_s = lo[1], tonumber(lo[2])
    n = self.M
    self.min[u] = {bound_m, bound_s}
    self:tl_trim(u, bound_m, lo[2])
  end
  self.card[u] = n
  for _, p in ipairs(add) do
    if bound_s == nil or not cmp_gt(bound_s, bound_m, p[2], p[1]) then self:tl_change('+', u, p[1], p[4]) end
  end
end

-- The fan-out of new posts is coalesced: a post is queued for each timeline it goes to, and each
-- timeline takes its queued posts in one tl_add (one ZADD, one trim) when the run is flushed: before
-- an event that reads or changes timelines otherwise (a follow, an unfollow, a delete, an erasure)
-- and at the end of the call. A function runs alone, so no reader sees a run half applied, and
-- the result is the one post-at-a-time gives: the latest N + S of the old entries and the new
-- posts above the old minimum (a timeline is a function of the set of posts it may hold).
-- `users`: the timelines (a list of user ids) `post` goes to; one call per post, not per follower.
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

-- Apply the queued posts; their timeline changes go to the changelog entry of the last event
-- applied (the compaction keeps the last change per key, and no cut falls inside a call).
function Ctx:flush()
  if #self.pending_order == 0 then return end
  local pending, order = self.pending, self.pending_order
  self.pending, self.pending_order = {}, {}
  for _, u in ipairs(order) do
    local q = pending[u]
    if q ~= nil then -- (nil: flushed alone before; u is queued again under a new order entry)
      pending[u] = nil
      self:tl_add(u, q, true)
    end
  end
end

-- Apply u's queued posts alone (before an event that reads or changes tl:u otherwise).
function Ctx:flush_user(u)
  local q = self.pending[u]
  if q == nil then return end
  self.pending[u] = nil
  self:tl_add(u, q, true)
end

-- The sources of u's fanned-out timeline: u itself and the non-celebrity authors u follows.
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
    local pkey = self:k('posts', a)
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
          cands[#cands + 1] = {m, s, a, string.format('%d', s)}
          got = got + 1
          if got >= want then break end
        end
      end
      if #rows < 2 * page then break end
      offset = offset + page
    end
  end
  table.sort(cands, function(x, y) return cmp_gt(x[2], x[1], y[2], y[1]) end)
  local top = {}
  for i = 1, math.min(want, #cands) do top[i] = cands[i] end
  if #top == 0 then return end
  -- below the minimum by construction: added as they are (tl_add would drop them)
  local args = {}
  for _, p in ipairs(top) do
    args[#args + 1] = p[4]
    args[#args + 1] = p[1]
    self:tl_change('+', u, p[1], p[4])
  end
  redis.call('ZADD', key, unpack(args))
  self.card[u] = self.card[u] + #top
  self.min[u] = false
end

-- A deleted post leaves tl:u. A post still queued for u (created in this call) is not in tl:u yet:
-- it leaves the queue and no other post of u's queue is applied early, so a delete does not break
-- the coalesced fan-out. Otherwise it is removed from tl:u; a removal that takes tl:u below N
-- refills it from the sources, which hold u's queued posts too, so then the queue is applied first
-- (a refill must see the timeline every earlier event made).
function Ctx:tl_delete(u, m)
  local q = self.pending[u]
  if q ~= nil then
    for i = 1, #q do
      if q[i][1] == m then
        table.remove(q, i)
        return
      end
    end
    if self:tl_card(u, self:k('tl', u)) <= self.N then
      -- into the previous event's entry, as a flush before this event: a refill below may take
      -- back a post the flush trims, and an entry changes a (user, member) at most once
      local tl = self.tl
      self.tl = self.entries[#self.entries][3]
      local ok, err = pcall(self.flush_user, self, u)
      self.tl = tl
      if not ok then error(err, 0) end
    end
  end
  self:tl_remove(u, {m})
end

-- Remove members from tl:u; a timeline that falls below N is refilled to M.
function Ctx:tl_remove(u, members)
  if #members == 0 then return end
  local key = self:k('tl', u)
  local before = self:tl_card(u, key)
  if before == 0 then return end
  local removed = 0
  if #members == 1 then
    removed = redis.call('ZREM', key, members[1])
    if removed == 1 then self:tl_change('-', u, members[1]) end
  else -- (an unfollow's up to N + S posts: which are there, then one ZREM, not one per post)
    local have, gone = redis.call('ZMSCORE', key, unpack(members)), {}
    for i, m in ipairs(members) do
      if have[i] ~= false then gone[#gone + 1] = m end
    end
    if #gone == 0 then return end
    removed = redis.call('ZREM', key, unpack(gone))
    for _, m in ipairs(gone) do self:tl_change('-', u, m) end
  end
  if removed > 0 then
    self.card[u] = before - removed
    self.min[u] = false
  end
  -- below N only if it held N or more before: then older eligible posts may exist
  if removed > 0 and before >= self.N and before - removed < self.N then
    self:refill(u, self.M - (before - removed))
  end
end

-- An author's latest N + S live posts as {member, score, author, score as a string}: the only ones
-- that can be in any timeline (a post kept in a timeline has its author's newer posts above it).
-- `floor` (a score, or nil): only those at or above it (a follow or an unfollow needs no post
-- below the minimum of a timeline that holds N or more).
function Ctx:latest_posts(a, floor)
  local rows
  if floor == nil then
    rows = redis.call('ZREVRANGE', self:k('posts', a), 0, self.N + self.S - 1, 'WITHSCORES')
  else
    rows = redis.call('ZREVRANGEBYSCORE', self:k('posts', a), '+inf', floor, 'WITHSCORES', 'LIMIT', 0,
      self.N + self.S)
  end
  local out = {}
  for i = 1, #rows, 2 do
    -- (a score comes back as the integer it is: event times are whole ms, below 2^53)
    out[#out + 1] = {tl_member(rows[i], a), tonumber(rows[i + 1]), a, rows[i + 1]}
  end
  return out
end

-- tl:u's minimum score once it holds at least `k` posts (nil: fewer). With k = N, the lowest score
-- tl:u can take a post at (a follow); with k = 1, the lowest a post in it can have (an unfollow).
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

function Ctx:set_celeb(a, celeb, followers)
  if celeb then redis.call('SADD', self:k('celebs'), a) else redis.call('SREM', self:k('celebs'), a) end
  self:change('C', a, celeb and 1 or 0, followers)
end

-- ---------------------------------------------------------------------------------------------
-- The event types. Each returns nil (applied) or a rejection reason (no effect).
-- ---------------------------------------------------------------------------------------------
local apply = {}

function apply.user_registered(c, e)
  redis.call('HSET', c:k('users'), e.user, user_json(e.s1, e.s2))
  c:change('U', e.user, e.s1, e.s2, e.et)
end

function apply.status_updated(c, e)
  redis.call('HSET', c:k('status'), e.user, status_json(e.s1, e.et))
  c:change('S', e.user, e.s1, e.et)
end

function apply.followed(c, e)
  local u, a = e.user, e.id1
  if c:is_erased(a) then return end -- a follow of an erased user: no edge (docs/views.md)
  c:change('F+', u, a, e.et)
  if redis.call('SADD', c:k('following', u), a) == 0 then return end
  redis.call('SADD', c:k('followers', a), u)
  local n = redis.call('SCARD', c:k('followers', a))
  if n > c.T and n - 1 <= c.T then
    -- the author crosses the threshold: its posts leave every follower's fanned-out timeline
    -- (a celebrity first, so no refill below takes its posts back)
    c:set_celeb(a, true, n)
    local latest = members_of(c:latest_posts(a))
    for _, f in ipairs(redis.call('SMEMBERS', c:k('followers', a))) do c:tl_remove(f, latest) end
  elseif n <= c.T then
    c:tl_add(u, c:latest_posts(a, c:tl_floor(u, c.N)))
  end
end

function apply.unfollowed(c, e)
  c:unfollow(e.user, e.id1)
end

-- u stops following a (an unfollow, or an erasure of u): the edge, the counts, the timelines.
function Ctx:unfollow(u, a)
  local c = self
  c:change('F-', u, a)
  if redis.call('SREM', c:k('following', u), a) == 0 then return end
  redis.call('SREM', c:k('followers', a), u)
  local n = redis.call('SCARD', c:k('followers', a))
  if n + 1 <= c.T then
    -- (only posts at or above tl:u's minimum can be in it; an empty tl:u has none of a's)
    local lo = c:tl_floor(u, 1)
    if lo ~= nil then c:tl_remove(u, members_of(c:latest_posts(a, lo))) end
  elseif n <= c.T then
    -- back under the threshold: fanned out again, to every remaining follower
    c:set_celeb(a, false, n)
    local latest = c:latest_posts(a)
    for _, f in ipairs(redis.call('SMEMBERS', c:k('followers', a))) do c:tl_add(f, latest) end
  end
end

function apply.post_created(c, e)
  local a, pid = e.user, e.id1
  if redis.call('HEXISTS', c:k('pids', a), pid) == 1 then return 'reused_id' end
  local m = pad(pid)
  redis.call('HSET', c:k('pids', a), pid, 1)
  redis.call('ZADD', c:k('posts', a), e.et, m)
  redis.call('SET', c:k('p', a .. ':' .. pid), post_json(pid, a, e.s1, e.et))
  c:change('P', a, pid, e.et, e.s1, 0, nil)
  local post = {tl_member(m, a), e.et, a, string.format('%d', e.et)}
  c:queue({a}, post)
  if not c:is_celeb(a) then c:queue(redis.call('SMEMBERS', c:k('followers', a)), post) end
end

function apply.post_deleted(c, e)
  local a, pid = e.user, e.id1
  local live = redis.call('HGET', c:k('pids', a), pid)
  if live == false then return 'not_own_post' end
  if live == '0' then return 'post_already_deleted' end
  local m = pad(pid)
  local created = tonumber(redis.call('ZSCORE', c:k('posts', a), m))
  local body = cjson.decode(redis.call('GET', c:k('p', a .. ':' .. pid)))
  redis.call('HSET', c:k('pids', a), pid, 0)
  redis.call('ZREM', c:k('posts', a), m)
  redis.call('DEL', c:k('p', a .. ':' .. pid))
  c:change('P', a, pid, created, body.text, 1, e.et)
  local tm = tl_member(m, a)
  c:tl_delete(a, tm)
  if not c:is_celeb(a) then
    for _, f in ipairs(redis.call('SMEMBERS', c:k('followers', a))) do c:tl_delete(f, tm) end
  end
end

function apply.message_sent(c, e)
  local r, mid = e.user, e.id1
  local m = pad(mid)
  if redis.call('ZSCORE', c:k('inbox', r), m) ~= false then return 'reused_id' end
  local sender, text = e.id2, e.s1
  if c:is_erased(sender) then
    sender, text = '0', cjson.null -- from an erased user: kept for the recipient, anonymised
  else
    redis.call('SADD', c:k('sent', sender), r .. ':' .. mid)
  end
  redis.call('ZADD', c:k('inbox', r), e.et, m)
  redis.call('HSET', c:k('msgs', r), mid, msg_json(mid, sender, text, e.et, false))
  local n = redis.call('HINCRBY', c:k('unread'), r, 1)
  c:change('I', r, mid, sender, text, e.et, 0)
  c:change('N', r, n)
end

function apply.message_read(c, e)
  local r, mid = e.user, e.id1
  local body = redis.call('HGET', c:k('msgs', r), mid)
  if body == false then return 'not_in_inbox' end
  local unread_suffix = '"read":false}'
  if body:sub(-#unread_suffix) ~= unread_suffix then return end -- read before: no change
  redis.call('HSET', c:k('msgs', r), mid, body:sub(1, -#unread_suffix - 1) .. '"read":true}')
  local n = redis.call('HINCRBY', c:k('unread'), r, -1)
  -- the whole row again (the changelog holds absolute values); ids as written, never via doubles
  c:change('I', r, mid, body:match('"sender_id":(%d+)'), cjson.decode(body).text or cjson.null,
    body:match('"event_time":(%-?%d+)'), 1)
  c:change('N', r, n)
end

-- u is erased: everything keyed by u leaves the state, and what others hold of u is removed
-- (follow edges) or anonymised (messages u sent). Changes: U-, S-, P-, I-, N- delete a view row;
-- F- the edges; I the anonymised messages; C the celebrity flag; timeline '-' entries.
function apply.user_erased(c, e)
  local u = e.user
  redis.call('SADD', c:k('erased'), u)
  c.any_erased = true
  -- posts: gone first, so no refill below can take them back; then out of every timeline
  local latest = members_of(c:latest_posts(u))
  local pids = redis.call('HKEYS', c:k('pids', u))
  table.sort(pids, function(x, y) return pad(x) < pad(y) end)
  for _, pid in ipairs(pids) do
    redis.call('DEL', c:k('p', u .. ':' .. pid))
    c:change('P-', u, pid)
  end
  redis.call('DEL', c:k('pids', u), c:k('posts', u))
  if not c:is_celeb(u) then
    for _, f in ipairs(redis.call('SMEMBERS', c:k('followers', u))) do c:tl_remove(f, latest) end
  end
  -- u's own timeline
  local tl = redis.call('ZRANGE', c:k('tl', u), 0, -1)
  for _, m in ipairs(tl) do c:tl_change('-', u, m) end
  redis.call('DEL', c:k('tl', u))
  c.card[u], c.min[u] = 0, false
  -- edges in both directions (the authors u followed may fall back under the threshold)
  local following = redis.call('SMEMBERS', c:k('following', u))
  table.sort(following)
  for _, a in ipairs(following) do c:unfollow(u, a) end
  local followers = redis.call('SMEMBERS', c:k('followers', u))
  table.sort(followers)
  for _, f in ipairs(followers) do
    redis.call('SREM', c:k('following', f), u)
    c:change('F-', f, u)
  end
  redis.call('DEL', c:k('followers', u), c:k('following', u))
  if c:is_celeb(u) then c:set_celeb(u, false, 0) end
  -- profile and status
  if redis.call('HDEL', c:k('users'), u) == 1 then c:change('U-', u) end
  if redis.call('HDEL', c:k('status'), u) == 1 then c:change('S-', u) end
  -- u's inbox and unread counter
  local msgs = redis.call('HGETALL', c:k('msgs', u))
  for i = 1, #msgs, 2 do
    local sender = msgs[i + 1]:match('"sender_id":(%d+)')
    if sender ~= '0' then redis.call('SREM', c:k('sent', sender), u .. ':' .. msgs[i]) end
    c:change('I-', u, msgs[i])
  end
  redis.call('DEL', c:k('msgs', u), c:k('inbox', u))
  if redis.call('HDEL', c:k('unread'), u) == 1 then c:change('N-', u) end
  -- the messages u sent: kept for their recipients, without sender and text
  local sent = redis.call('SMEMBERS', c:k('sent', u))
  table.sort(sent)
  for _, rm in ipairs(sent) do
    local r, mid = rm:match('^(%d+):(%d+)$')
    local body = redis.call('HGET', c:k('msgs', r), mid)
    if body ~= false then
      local et = body:match('"event_time":(%-?%d+)')
      local read = body:sub(-#'"read":true}') == '"read":true}'
      redis.call('HSET', c:k('msgs', r), mid, msg_json(mid, '0', nil, tonumber(et), read))
      c:change('I', r, mid, '0', cjson.null, et, read and 1 or 0)
    end
  end
  redis.call('DEL', c:k('sent', u))
end

@DEDUP@

local DISPOSITION = {a = 'applied', d = 'duplicates', r = 'rejected', q = 'quarantined'}

-- Events that read or change timelines other than by adding a new post: the queued fan-out of the
-- timelines they touch is applied before them (into the previous event's changelog entry: c.tl is
-- still its list), so the queues of all other timelines keep growing over the whole call.
local FLUSH_BEFORE = {
  followed = function(c, e)
    c:flush_user(e.user)
    -- the author may cross the threshold (a new follower at exactly T): every follower's timeline
    if redis.call('SCARD', c:k('followers', e.id1)) == c.T then c:flush() end
  end,
  unfollowed = function(c, e)
    c:flush_user(e.user)
    -- the author may fall back under it: then it is fanned out again to every follower
    if redis.call('SCARD', c:k('followers', e.id1)) == c.T + 1 then c:flush() end
  end,
  user_erased = function(c) c:flush() end,
}

-- One event (EVENT_ARGS arguments from args[i]) at `offset`: its effects, then its changelog entry
-- (buffered: written by write_entries at the end of the call, after the last flush).
local function apply_one(c, counts, args, i, offset)
  local e = {type = args[i + 1], eid = args[i + 2], user = args[i + 3], rt = tonumber(args[i + 4]),
    et = tonumber(args[i + 5]), id1 = args[i + 6], id2 = args[i + 7], s1 = args[i + 8], s2 = args[i + 9]}
  local before = FLUSH_BEFORE[e.type]
  if before then before(c, e) end
  c.changes, c.tl = {}, new_tl()
  local disp, reason
  if e.type == '!' then
    disp, reason = 'q', e.s1
  elseif dedup(c, e.eid, e.rt) then
    disp = 'd'
  elseif c:is_erased(e.user) then
    -- written after the erasure of its key user in this partition (log order): no effect
    disp, reason = 'r', 'user_erased'
  else
    local handler = apply[e.type]
    local ok, res = pcall(handler, c, e)
    if not ok then
      -- one record must never stop the stream: dead-letter it with the error as its reason
      disp, reason = 'q', 'processing_error:' .. tostring(res):sub(1, 200)
    elseif res ~= nil then
      disp, reason = 'r', res
    else
      disp = 'a'
    end
  end
  counts[disp] = counts[disp] + 1
  c.seq = c.seq + 1
  local entry = {'d', disp, 's', string.format('%d', c.seq)}
  if reason then entry[#entry + 1] = 'r'; entry[#entry + 1] = reason end
  if #c.changes > 0 then entry[#entry + 1] = 'c'; entry[#entry + 1] = cjson.encode(c.changes) end
  c.entries[#c.entries + 1] = {string.format('%d', offset) .. '-1', entry, c.tl}
end

-- The call's changelog entries, in offset order, each with its timeline changes.
local function write_entries(c)
  for _, rec in ipairs(c.entries) do
    local entry, tl = rec[2], tl_field(rec[3])
    if tl then entry[#entry + 1] = 't'; entry[#entry + 1] = tl end
    redis.call('XADD', c.changelog, rec[1], unpack(entry))
  end
  c.entries = {}
end

local function social_apply(keys, args)
  local ns, p = args[1], args[2]
  local c = setmetatable({ns = ns, window = tonumber(args[3]), grace = tonumber(args[4]),
    N = tonumber(args[5]), T = tonumber(args[6]), S = tonumber(args[7]), reorder = tonumber(args[8])}, Ctx)
  c.M = c.N + math.floor(c.S / 2)
  c.seenq, c.changelog = c:k('seenq', p), c:k('changelog', p)
  c.wq, c.wt, c.wcache = c:k('dq', p), c:k('dqt', p), {}
  local layout = redis.call('GET', c:k('layout'))
  if layout ~= LAYOUT then
    if layout ~= false or redis.call('EXISTS', c:k('fence')) == 1 then
      return redis.error_reply('LAYOUT namespace ' .. ns .. ' holds state of key layout ' ..
        (layout or '1') .. ', this library writes ' .. LAYOUT .. ': rebuild it from the log ' ..
        '(python -m pipelines.rebuild run), docs/architecture.md "Upgrading"')
    end
    redis.call('SET', c:k('layout'), LAYOUT)
  end
  c.any_erased = redis.call('EXISTS', c:k('erased')) == 1
  c.pending, c.pending_order, c.entries, c.tl = {}, {}, {}, new_tl()
  c.card, c.min = {}, {}
  -- the per-partition bookkeeping is read once here and written once below, whatever happens
  -- in between: a function's writes are not rolled back by an error, so the fence must always
  -- cover exactly the events whose effects were written
  local fence_key, hwm_key, seq_key = c:k('fence'), c:k('hwm'), c:k('seq')
  local start = tonumber(redis.call('HGET', fence_key, p) or '0')
  local next_offset = start
  c.hwm = tonumber(redis.call('HGET', hwm_key, p) or '-inf')
  c.seq = tonumber(redis.call('GET', seq_key) or '0')
  local hwm0, seq0 = c.hwm, c.seq
  local counts = {a = 0, d = 0, r = 0, q = 0, skipped = 0}
  local ok, err = pcall(function()
    for i = 9, #args - EVENT_ARGS + 1, EVENT_ARGS do
      local offset = tonumber(args[i])
      if offset < next_offset then
        counts.skipped = counts.skipped + 1
      else
        apply_one(c, counts, args, i, offset)
        next_offset = offset + 1
      end
    end
  end)
  -- the queued fan-out and the entries of every event applied, also after an error: the fence
  -- below covers them
  local ok_w, err_w = pcall(function()
    c:flush()
    write_entries(c)
  end)
  if ok and not ok_w then ok, err = ok_w, err_w end
  if next_offset ~= start then redis.call('HSET', fence_key, p, string.format('%d', next_offset)) end
  if c.seq ~= seq0 then redis.call('SET', seq_key, string.format('%d', c.seq)) end
  if c.hwm ~= hwm0 then redis.call('HSET', hwm_key, p, string.format('%d', c.hwm)) end
  dedup_forget(c) -- every call: a late id may fall below the bound at once
  for d, name in pairs(DISPOSITION) do
    if counts[d] > 0 then redis.call('HINCRBY', c:k('stats', p), name, counts[d]) end
  end
  if not ok then error(err) end
  return {counts.a, counts.d, counts.r, counts.q, counts.skipped}
end

local function social_version() return VERSION end

-- Restore (pipelines/restore.py): state rows from the Delta archive written as the events write
-- them. `FCALL social_restore 0 <ns> <kind> <n fields> <row>...`; kinds and fields:
--   U user handle display_name | S user text event_time | F user followee | C author |
--   P author post event_time text deleted(0/1) | T user post event_time author |
--   I recipient message sender text event_time read(0/1) (sender 0: erased, text null) | N user unread |
--   E user (erased) |
--   D partition event_id received_time | H partition hwm | X partition field count |
--   Z partition next_offset | Q seq
local RESTORE = {
  U = function(ns, r) redis.call('HSET', ns .. ':users', r[1], user_json(r[2], r[3])) end,
  S = function(ns, r) redis.call('HSET', ns .. ':status', r[1], status_json(r[2], tonumber(r[3]))) end,
  F = function(ns, r)
    redis.call('SADD', ns .. ':following:' .. r[1], r[2])
    redis.call('SADD', ns .. ':followers:' .. r[2], r[1])
  end,
  C = function(ns, r) redis.call('SADD', ns .. ':celebs', r[1]) end,
  P = function(ns, r)
    local a, pid = r[1], r[2]
    if r[5] == '1' then
      redis.call('HSET', ns .. ':pids:' .. a, pid, 0)
    else
      redis.call('HSET', ns .. ':pids:' .. a, pid, 1)
      redis.call('ZADD', ns .. ':posts:' .. a, r[3], pad(pid))
      redis.call('SET', ns .. ':p:' .. a .. ':' .. pid, post_json(pid, a, r[4], tonumber(r[3])))
    end
  end,
  T = function(ns, r) redis.call('ZADD', ns .. ':tl:' .. r[1], r[3], tl_member(pad(r[2]), r[4])) end,
  I = function(ns, r)
    redis.call('ZADD', ns .. ':inbox:' .. r[1], r[5], pad(r[2]))
    local text = r[4]
    if r[3] == '0' then text = nil else redis.call('SADD', ns .. ':sent:' .. r[3], r[1] .. ':' .. r[2]) end
    redis.call('HSET', ns .. ':msgs:' .. r[1], r[2], msg_json(r[2], r[3], text, tonumber(r[5]), r[6] == '1'))
  end,
  E = function(ns, r) redis.call('SADD', ns .. ':erased', r[1]) end,
  N = function(ns, r) redis.call('HSET', ns .. ':unread', r[1], r[2]) end,
  D = function(ns, r) redis.call('ZADD', ns .. ':seenq:' .. r[1], r[3], r[2]) end,
  W = function(ns, r)
    dedup_restore_writer({wq = ns .. ':dq:' .. r[1], wt = ns .. ':dqt:' .. r[1]}, r[2], r[3], r[4], r[5], r[6])
  end,
  H = function(ns, r) redis.call('HSET', ns .. ':hwm', r[1], r[2]) end,
  X = function(ns, r) redis.call('HSET', ns .. ':stats:' .. r[1], r[2], r[3]) end,
  Z = function(ns, r) redis.call('HSET', ns .. ':fence', r[1], r[2]) end,
  Q = function(ns, r) redis.call('SET', ns .. ':seq', r[1]) end,
}

local function social_restore(keys, args)
  local ns, write, width = args[1], RESTORE[args[2]], tonumber(args[3])
  redis.call('SET', ns .. ':layout', LAYOUT)
  local n = 0
  for i = 4, #args, width do
    write(ns, {unpack(args, i, i + width - 1)})
    n = n + 1
  end
  return n
end

local function social_cut(keys, args)
  local ns = args[1]
  local out = {tonumber(redis.call('GET', ns .. ':seq') or '0')}
  local f = redis.call('HGETALL', ns .. ':fence')
  for i = 1, #f do out[#out + 1] = f[i] end
  return out
end

-- The home timeline read (contract/serving.py): tl:u (the fanned-out part) merged with the posts
-- of the celebrities u follows (merged at read time: the hybrid rule), newest first by (score,
-- member), the first `limit` post bodies, and the fence they cover, read in one atomic step.
-- `FCALL_RO social_timeline 0 <ns> <user> <limit>` -> {{partition, next offset, ...}, {body...}}.
-- Each source is read in pages as the merge consumes it: a read of 50 among 30 celebrities takes
-- ~2 entries of each, not 50.
local function social_timeline(keys, args)
  local ns, u, limit = args[1], args[2], tonumber(args[3])
  local fence = redis.call('HGETALL', ns .. ':fence')
  -- each source with the suffix that makes its members timeline members (post id, author id):
  -- tl:u holds them whole; an author's posts list holds post ids, its author is the source
  local srcs, suffix = {ns .. ':tl:' .. u}, {''}
  for _, c in ipairs(redis.call('SINTER', ns .. ':following:' .. u, ns .. ':celebs')) do
    srcs[#srcs + 1] = ns .. ':posts:' .. c
    suffix[#suffix + 1] = pad(c)
  end
  local bodies = {}
  if limit < 1 then return {fence, bodies} end -- (ZREVRANGE 0 -1 would be the whole timeline)
  local function body(m) bodies[#bodies + 1] = body_key(ns, m) end
  if #srcs == 1 then -- no celebrity followed: the fanned-out timeline is the answer
    for _, m in ipairs(redis.call('ZREVRANGE', srcs[1], 0, limit - 1)) do body(m) end
    if #bodies > 0 then bodies = redis.call('MGET', unpack(bodies)) end
    return {fence, bodies}
  end
  local page = math.min(limit, math.max(4, math.ceil(2 * limit / #srcs)))
  local rows, at, off, hs = {}, {}, {}, {}
  local function fill(i) -- the next page of source i; its head score in hs[i] (nil: exhausted)
    local r = redis.call('ZREVRANGE', srcs[i], off[i], off[i] + page - 1, 'WITHSCORES')
    rows[i], at[i], off[i] = r, 1, off[i] + page
    hs[i] = r[2] and tonumber(r[2])
  end
  for i = 1, #srcs do off[i] = 0; fill(i) end
  -- A linear scan of the heads (cmp_gt inlined: the merge is most of the function's CPU, and a
  -- binary heap measured no faster for the ~20-30 sources of a read). The sources are disjoint:
  -- tl:u holds no celebrity's post (crossing the threshold moves them atomically) and u never
  -- follows u, so no post is met twice.
  local n = #srcs
  while #bodies < limit do
    local best, bs, m
    for i = 1, n do
      local s = hs[i]
      if s and (best == nil or s > bs or (s == bs and rows[i][at[i]] .. suffix[i] > m)) then
        best, bs, m = i, s, rows[i][at[i]] .. suffix[i]
      end
    end
    if best == nil then break end
    body(m)
    if #bodies == limit then break end
    at[best] = at[best] + 2
    if rows[best][at[best]] then
      hs[best] = tonumber(rows[best][at[best] + 1])
    elseif #rows[best] < 2 * page then
      hs[best] = nil
    else
      fill(best)
    end
  end
  if #bodies > 0 then bodies = redis.call('MGET', unpack(bodies)) end
  return {fence, bodies}
end

redis.register_function('social_apply', social_apply)
redis.register_function('social_restore', social_restore)
redis.register_function{function_name = 'social_version', callback = social_version,
  flags = {'no-writes'}}
redis.register_function{function_name = 'social_cut', callback = social_cut, flags = {'no-writes'}}
redis.register_function{function_name = 'social_timeline', callback = social_timeline,
  flags = {'no-writes'}}
