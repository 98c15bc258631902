-- complete: KEYS[1] the record. ARGV: 1 base, 2 scope, 3 operation id, 4 lease id,
-- 5 status, 6 headers, 7 body present (1/0), 8 body, 9 bytes the response adds,
-- 10 delivered (1/0), 11 read back (1/0). Returns {ok, now[, record...]} or {lost, now}.
local rkey = KEYS[1]
local now = clock()
local r = load(rkey)
if not held(r, now) then return {'lost', s(now)} end
local at = s(now)
local ex = now + num(r.ret)
r.st, r.co, r.rs, r.rh = 'completed', at, ARGV[5], ARGV[6]
r.ex = s(ex)
r.lid, r.le = nil, nil
if ARGV[7] == '1' then r.rb = ARGV[8] else r.rb = nil end
if ARGV[10] == '1' and r.dv ~= '1' then r.dv, r.da = '1', at end
-- The record with its TTL in one write (the end of retention, as `index` gives it), its
-- place in `live` and its indexes' TTL; the response's bytes counted.
local packed = cmsgpack.pack(r)
local expiry = s(math.floor(ex / 1000) + 1)
redis.call('SET', rkey, packed, 'PXAT', expiry)
redis.call('ZADD', base .. 'live', r.ex, r.k)
redis.call('PEXPIREAT', base .. 'i:' .. r.id, expiry)
if r.aid then redis.call('PEXPIREAT', base .. 'a:' .. r.aid, expiry) end
charge(r.k, tonumber(ARGV[9]))
if ARGV[11] == '1' then return {'ok', at, packed} end
return {'ok', at}
