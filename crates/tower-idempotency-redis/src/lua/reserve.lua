-- reserve: KEYS[1] the record. ARGV: 1 base, 2 scope, 3 key, 4 fingerprint, 5 method,
-- 6 route, 7 lease, 8 retention, 9 unknown retention (µs), 10 take_over_unknown (1/0),
-- 11 marks_dispatch (1/0), 12 replace_delivered window (µs, or empty), 13 new operation
-- id, 14 new lease id, 15 the new record's bytes, 16 quota records, 17 quota bytes,
-- 18 approval (1/0), 19 approval id, 20 summary (JSON), 21 requested by, 22 approval ttl,
-- 23 the new record in progress as MessagePack map entries (12: every field but `cr`,
-- `le` and `di`, which come from the server's clock; empty with an approval).
-- Returns {outcome, now, record...}; outcome: acquired (a new record), takeover,
-- authorized (an approved operation's start), existing, approval,
-- quota ({quota, now, earliest expiry or ''}), collision.
local rkey = KEYS[1]
local now = clock()
local function start(r, outcome)
  r.st = 'in_progress'
  r.at = s((num(r.at) or 0) + 1)
  r.le = s(now + tonumber(ARGV[7]))
  r.lid = ARGV[14]
  r.m, r.rt, r.ret, r.uret = ARGV[5], ARGV[6], ARGV[8], ARGV[9]
  local set = {'st', 'at', 'le', 'lid', 'm', 'rt', 'ret', 'uret'}
  local del = {'ex'}
  if ARGV[11] == '1' then
    del[#del + 1] = 'di'
  else
    r.di = s(now)
    set[#set + 1] = 'di'
  end
  save(rkey, r, set, del)
  index(r)
  return {outcome, s(now), unpack(flat(rkey))}
end
local r = load(rkey)
local forced = false
if r and r.sc ~= ARGV[2] then return {'collision', s(now)} end
if r then
  local st, ex = effective(r, now)
  local gone = ex ~= nil and ex <= now
  local closed = false
  if not gone and ARGV[12] ~= '' and st == 'completed' and r.dv == '1' and r.fp == ARGV[4] then
    local at = num(r.da) or num(r.co)
    closed = at ~= nil and at + tonumber(ARGV[12]) <= now
  end
  if gone or closed then
    -- Retention ended, or a derived key's execution was delivered: a new operation in
    -- the key's place, without consulting the quota (the scope keeps its count).
    drop(ARGV[3], r)
    r = nil
    forced = true
  else
    if r.fp == ARGV[4] then
      -- A replay (completed, same fingerprint) writes nothing here: the store counts it
      -- in the background (`count.lua`).
      if st == 'unknown' and ARGV[10] == '1' then
        return start(r, 'takeover')
      elseif st == 'stalled' or st == 'cancelled' then
        return start(r, 'takeover')
      elseif st == 'authorized' and r.ast == 'approved' and r.au ~= '1'
        and num(r.aexp) > now then
        r.au = '1'
        return start(r, 'authorized')
      end
    end
    return {'existing', s(now), unpack(flat(rkey))}
  end
end
local bytes = tonumber(ARGV[15])
if not forced then
  -- The quota: the scope's expired records are deleted (up to 32) only when it looks
  -- full, so that a scope under its quota pays no sweep (the purge deletes them too).
  local function full()
    local records = redis.call('ZCARD', base .. 'live')
    local used = tonumber(redis.call('GET', base .. 'u') or '0')
    return not (records < tonumber(ARGV[16]) and used + bytes <= tonumber(ARGV[17]))
  end
  if full() and (sweep(now, 32) == 0 or full()) then
    local first = redis.call('ZRANGE', base .. 'live', 0, 0, 'WITHSCORES')
    local at = ''
    if first[2] and first[2] ~= 'inf' then at = first[2] end
    return {'quota', s(now), at}
  end
end
local at = s(now)
if ARGV[18] == '1' then
  -- Nothing runs until a person decides: no lease, no attempt, no dispatch; kept for its
  -- retention past the request's expiry.
  r = {sc = ARGV[2], k = ARGV[3], id = ARGV[13], fp = ARGV[4], m = ARGV[5], rt = ARGV[6],
    cr = at, ret = ARGV[8], uret = ARGV[9], rp = '0'}
  r.st, r.at = 'awaiting_approval', '0'
  r.aid, r.ast, r.au, r.asum, r.aby = ARGV[19], 'pending', '0', ARGV[20], ARGV[21]
  r.areq = at
  r.aexp = s(now + tonumber(ARGV[22]))
  r.ex = s(num(r.aexp) + tonumber(ARGV[8]))
  redis.call('SET', base .. 'a:' .. r.aid, r.k)
  redis.call('ZADD', base .. 'apv', r.areq, r.aid)
  local packed = cmsgpack.pack(r)
  redis.call('SET', rkey, packed)
  redis.call('SET', base .. 'i:' .. r.id, r.k)
  charge(r.k, bytes)
  index(r)
  return {'approval', at, packed}
end
-- A new record in progress: the caller's 12 packed fields and the clock's (a number's
-- digits are a fixstr), no table, no cmsgpack. No TTL to give or take (its keys are new),
-- one place in `live` (lease end + unknown retention), its bytes counted; the record
-- returned as written, not read back.
local lease_end = now + tonumber(ARGV[7])
local le = s(lease_end)
local n, tail = 14, '\162cr' .. string.char(0xa0 + #at) .. at .. '\162le' .. string.char(0xa0 + #le) .. le
if ARGV[11] ~= '1' then
  n, tail = 15, tail .. '\162di' .. string.char(0xa0 + #at) .. at
end
local packed = string.char(0x80 + n) .. ARGV[23] .. tail
redis.call('SET', rkey, packed)
redis.call('SET', base .. 'i:' .. ARGV[13], ARGV[3])
charge(ARGV[3], bytes)
redis.call('ZADD', base .. 'live', s(lease_end + tonumber(ARGV[9])), ARGV[3])
return {'acquired', at, packed}
