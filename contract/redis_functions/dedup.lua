-- ---------------------------------------------------------------------------------------------
-- Dedup (docs/views.md, "Duplicates"): one chunk, substituted for @DEDUP@ into both libraries
-- (social.lua, partitioned.lua) when they are loaded (contract/functions.py), so the two layouts
-- decide by one text. Per partition, with hwm its newest received_time before this event:
--
-- * a sequenced id `sq:<writer>:<seq>` (contract/ids.py) is decided by the writer's state in the
--   partition: `hi`, its highest seq here, `last`, its newest received_time here, and which of the
--   seqs in (hi - R, hi] arrived (R = the reorder window). It is a duplicate when its seq arrived
--   before or lies at or below hi - R. A writer with no record here within window + grace of hwm
--   is forgotten: its next id starts it again. Memory: one hash field of R bytes per writer and
--   partition, whatever the number of its events.
-- * any other id (a UUID: keyed API requests, logs written before sequenced ids) is kept in
--   `seenq` with its newest received_time, a duplicate when received again within the window,
--   forgotten once more than window + grace behind hwm.
--
-- Both are functions of the log prefix (no wall clock), the same for any grouping of events into
-- calls: state older than the bound is treated as forgotten whether or not `dedup_forget` ran.
-- The context `c` holds: seenq, wq (hash writer -> "<hi>:<last>:<window bytes>"), wt (zset writer
-- by last), window, grace, reorder, hwm, and wcache (the writers read in this call).
-- ---------------------------------------------------------------------------------------------
local ZERO, ONE = 48, 49 -- a window byte: '0' (not arrived), '1' (arrived)

-- 'sq:<writer>:<seq>' -> writer (string), seq (number); nil for any other id. The canonical form
-- only (no leading zeros, at most 15 digits each: exact in Lua's doubles), as contract/ids.py.
local function sequenced(eid)
  local w, s = string.match(eid, '^sq:(%d+):(%d+)$')
  if w == nil or #w > 15 or #s > 15 or s:byte(1) == ZERO or (#w > 1 and w:byte(1) == ZERO) then
    return nil
  end
  return w, tonumber(s)
end

local function fresh_window(R)
  local win = {}
  for k = 1, R do win[k] = ZERO end
  return win
end

local function writer_state(c, w)
  local st = c.wcache[w]
  if st == nil then
    local v = redis.call('HGET', c.wq, w)
    st = false
    if v then
      local hi, last, win = string.match(v, '^(%d+):(%-?%d+):(.*)$')
      st = {hi = tonumber(hi), last = tonumber(last), win = {string.byte(win, 1, -1)}}
      if #st.win ~= c.reorder then -- kept under another reorder window: the seqs both windows cover
        local old, Ro, R = st.win, #st.win, c.reorder
        st.win = fresh_window(R)
        for q = math.max(st.hi - math.min(Ro, R) + 1, 1), st.hi do st.win[q % R + 1] = old[q % Ro + 1] end
      end
    end
    c.wcache[w] = st
  end
  return st
end

local function dedup_sequenced(c, w, s, rt)
  local R = c.reorder
  local st = writer_state(c, w)
  if st and st.last < c.hwm - c.window - c.grace then st = false end -- forgotten (lazily)
  local dup = false
  if not st then
    st = {hi = s, last = rt, win = fresh_window(R)}
    st.win[s % R + 1] = ONE
  else
    if s > st.hi then
      if s - st.hi >= R then
        st.win = fresh_window(R)
      else
        for q = st.hi + 1, s - 1 do st.win[q % R + 1] = ZERO end
      end
      st.win[s % R + 1] = ONE
      st.hi = s
    elseif s <= st.hi - R or st.win[s % R + 1] == ONE then
      dup = true
    else
      st.win[s % R + 1] = ONE
    end
    if rt > st.last then st.last = rt end
  end
  st.dirty = true
  c.wcache[w] = st
  return dup
end

local function dedup_opaque(c, eid, rt)
  local prev = redis.call('ZSCORE', c.seenq, eid)
  if prev ~= false then
    prev = tonumber(prev)
    if prev < c.hwm - c.window - c.grace then prev = false end -- forgotten (lazily)
  end
  if prev == false or prev < rt then redis.call('ZADD', c.seenq, string.format('%d', rt), eid) end
  return prev ~= false and prev >= rt - c.window
end

-- Is this event (its id, its received_time) a duplicate? Updates the memory and hwm.
local function dedup(c, eid, rt)
  local w, s = sequenced(eid)
  local dup
  if w then dup = dedup_sequenced(c, w, s, rt) else dup = dedup_opaque(c, eid, rt) end
  if rt > c.hwm then c.hwm = rt end
  return dup
end

-- End of a call: write the writers' states back, then forget what is older than the bound (all of
-- it, in slices that fit Lua's stack), so the memory is exactly a function of the log prefix.
local function dedup_forget(c)
  for w, st in pairs(c.wcache) do
    if st and st.dirty then
      local last = string.format('%d', st.last)
      redis.call('HSET', c.wq, w, string.format('%d', st.hi) .. ':' .. last .. ':' .. string.char(unpack(st.win)))
      redis.call('ZADD', c.wt, last, w)
      st.dirty = false
    end
  end
  if c.hwm == -math.huge then return end
  local bound = '(' .. string.format('%d', c.hwm - c.window - c.grace)
  for _, key in ipairs({c.seenq, c.wt}) do
    while true do
      local old = redis.call('ZRANGEBYSCORE', key, '-inf', bound, 'LIMIT', 0, 1000)
      if #old == 0 then break end
      redis.call('ZREM', key, unpack(old))
      if key == c.wt then
        redis.call('HDEL', c.wq, unpack(old))
        for _, w in ipairs(old) do c.wcache[w] = nil end
      end
    end
  end
end

-- A restore row of a writer's state: its hi, last, the reorder window R and the seqs in
-- (hi - R, hi] that arrived (space-separated), as pipelines/restore.py computes them.
local function dedup_restore_writer(c, w, hi, last, reorder, seqs)
  local R, h = tonumber(reorder), tonumber(hi)
  local win = fresh_window(R)
  for q in string.gmatch(seqs, '%d+') do
    local s = tonumber(q)
    if s > h - R and s <= h then win[s % R + 1] = ONE end
  end
  redis.call('HSET', c.wq, w, hi .. ':' .. last .. ':' .. string.char(unpack(win)))
  redis.call('ZADD', c.wt, last, w)
end
