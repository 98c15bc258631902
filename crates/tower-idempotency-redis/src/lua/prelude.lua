-- Shared by every script (docs/redis.md, "Scripts"). ARGV[1] is always the scope's key
-- base, `{prefix}:{tag}:`; every key a script touches starts with it (one hash slot).
-- Times are microseconds of the server's clock (TIME), written as integers.
local base = ARGV[1]
local function s(n) return string.format('%.0f', n) end
local function num(v)
  if v == nil or v == false or v == '' then return nil end
  return tonumber(v)
end
local function clock()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end
-- A record is one string: a MessagePack map of short field names to strings (one
-- allocation in Redis, whatever the body's size; a hash would leave its compact encoding
-- for any value over 64 bytes).
local function load(key)
  local packed = redis.call('GET', key)
  if not packed then return nil end
  return cmsgpack.unpack(packed)
end
-- The record as scripts return it: {} or {packed}.
local function flat(key)
  local packed = redis.call('GET', key)
  if not packed then return {} end
  return {packed}
end
-- The state as of `now` and the end of retention (nil: none yet). An in-progress record
-- whose lease ran out reads `unknown` when it had dispatched, `stalled` (still
-- in_progress, taken over by the next reservation of its command) when it had not.
local function effective(r, now)
  if r.st == 'in_progress' then
    local le = num(r.le)
    if le ~= nil and le <= now then
      local ex = le + num(r.uret)
      if r.di then return 'unknown', ex end
      return 'stalled', ex
    end
    return 'in_progress', nil
  end
  return r.st, num(r.ex)
end
local function expired(r, now)
  local _, ex = effective(r, now)
  return ex ~= nil and ex <= now
end
-- The record's place in the scope's `live` set: when it will have expired (for one in
-- progress, if its lease lapses: lease end + unknown retention); +inf when never.
local function score(r)
  if r.st == 'in_progress' then return num(r.le) + num(r.uret) end
  return num(r.ex)
end
-- Writes r (whose fields in `set` were changed) without the fields in `del`, keeping the
-- key's TTL (`index` sets it).
local function save(key, r, set, del)
  for _, f in ipairs(del) do r[f] = nil end
  redis.call('SET', key, cmsgpack.pack(r), 'KEEPTTL')
end
-- Files the record in `live` and gives its keys their TTL: the end of retention for a
-- completed, cancelled, denied or approval record; none (PERSIST) for one in progress or
-- unknown, which only a purge past its unknown retention removes.
local function index(r)
  local sc = score(r)
  redis.call('ZADD', base .. 'live', sc and s(sc) or '+inf', r.k)
  local keys = {base .. 'r:' .. r.k, base .. 'i:' .. r.id}
  if r.aid then keys[#keys + 1] = base .. 'a:' .. r.aid end
  local ttl = r.st ~= 'in_progress' and r.st ~= 'unknown' and num(r.ex)
  for _, k in ipairs(keys) do
    if ttl then
      redis.call('PEXPIREAT', k, s(math.floor(ttl / 1000) + 1))
    else
      redis.call('PERSIST', k)
    end
  end
end
local function charge(k, n)
  if n ~= 0 then
    redis.call('HINCRBY', base .. 'b', k, n)
    redis.call('INCRBY', base .. 'u', n)
  end
end
-- Removes the record of key `k` (r: its fields, when it still exists) and everything
-- that names it, and gives back what it counted against the scope's quota.
local function drop(k, r)
  redis.call('DEL', base .. 'r:' .. k)
  if r then
    redis.call('DEL', base .. 'i:' .. r.id)
    if r.aid then
      redis.call('DEL', base .. 'a:' .. r.aid)
      redis.call('ZREM', base .. 'apv', r.aid)
    end
  end
  local b = redis.call('HGET', base .. 'b', k)
  if b then
    redis.call('HDEL', base .. 'b', k)
    redis.call('DECRBY', base .. 'u', b)
  end
  redis.call('ZREM', base .. 'live', k)
end
-- Deletes up to `limit` of the scope's records whose retention ended (and forgets those
-- Redis already expired); returns how many.
local function sweep(now, limit)
  local dead = redis.call('ZRANGEBYSCORE', base .. 'live', '-inf', s(now), 'LIMIT', 0, limit)
  local n = 0
  for _, k in ipairs(dead) do
    local r = load(base .. 'r:' .. k)
    if r == nil or expired(r, now) then
      drop(k, r)
      n = n + 1
    else
      index(r)
    end
  end
  return n
end
-- Whether the lease (ARGV[2] scope, ARGV[3] operation id, ARGV[4] lease id) still holds r.
local function held(r, now)
  return r ~= nil and r.sc == ARGV[2] and r.id == ARGV[3] and r.lid == ARGV[4]
    and not expired(r, now)
end
