-- resolve: KEYS[1] the operation-id index. ARGV: 1 base, 2 scope, 3 operation id,
-- 4 failed or completed, 5 operator, 6 reason. Returns {none}, {not_unknown, now,
-- record...} or {ok, now}. The lease is revoked in the same step.
local now = clock()
local k = redis.call('GET', KEYS[1])
if not k then return {'none'} end
local rkey = base .. 'r:' .. k
local r = load(rkey)
if r == nil or r.sc ~= ARGV[2] or r.id ~= ARGV[3] or expired(r, now) then return {'none'} end
local st = effective(r, now)
if st ~= 'unknown' then return {'not_unknown', s(now), unpack(flat(rkey))} end
if ARGV[4] == 'failed' then
  drop(r.k, r)
  return {'ok', s(now)}
end
r.st, r.co = 'completed', s(now)
r.ex = s(now + num(r.ret))
r.res, r.rop, r.rreason, r.rat = ARGV[4], ARGV[5], ARGV[6], s(now)
save(rkey, r, {'st', 'co', 'ex', 'res', 'rop', 'rreason', 'rat'}, {'lid', 'le', 'rs', 'rh', 'rb'})
index(r)
return {'ok', s(now)}
