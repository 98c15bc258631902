-- The other lease-fenced steps: KEYS[1] the record. ARGV: 1 base, 2 scope, 3 operation
-- id, 4 lease id, 5 step (release, abandon, extend, dispatch, cancel), 6 duration (µs,
-- for extend and dispatch). Returns {ok, now, record...} ({ok, now} after a release) or
-- {lost, now}.
local rkey = KEYS[1]
local now = clock()
local r = load(rkey)
if not held(r, now) then return {'lost', s(now)} end
local step = ARGV[5]
if step == 'release' then
  drop(r.k, r)
  return {'ok', s(now)}
elseif step == 'abandon' then
  r.st = 'unknown'
  r.ex = s(now + num(r.uret))
  save(rkey, r, {'st', 'ex'}, {'lid', 'le'})
elseif step == 'extend' or step == 'dispatch' then
  -- A heartbeat (or mark) after the lease ran out, before a take-over, puts the operation
  -- back in progress: its worker is evidently alive.
  r.st = 'in_progress'
  r.le = s(now + tonumber(ARGV[6]))
  local set = {'st', 'le'}
  if step == 'dispatch' and not r.di then
    r.di = s(now)
    set[#set + 1] = 'di'
  end
  save(rkey, r, set, {'ex'})
elseif step == 'cancel' then
  if r.di then
    r.st = 'unknown'
    r.ex = s(now + num(r.uret))
  else
    r.st = 'cancelled'
    r.ex = s(now + num(r.ret))
  end
  save(rkey, r, {'st', 'ex'}, {'lid', 'le'})
else
  return redis.error_reply('unknown lease step')
end
index(r)
return {'ok', s(now), unpack(flat(rkey))}
