-- decide_approval: KEYS[1] the approval index. ARGV: 1 base, 2 scope, 3 approval id,
-- 4 approve or deny, 5 fingerprint (approve) or reason (deny), 6 decided by, 7 bytes the
-- decision adds. Returns {none} or {changed (1/0), bound (1/0), now, record...}.
local now = clock()
local k = redis.call('GET', KEYS[1])
if not k then return {'none'} end
local rkey = base .. 'r:' .. k
local r = load(rkey)
if r == nil or r.sc ~= ARGV[2] or r.aid ~= ARGV[3] or expired(r, now) then return {'none'} end
local state = r.ast
if (state == 'pending' or state == 'approved') and r.au ~= '1' and num(r.aexp) <= now then
  state = 'expired'
end
local bound = ARGV[4] == 'deny' or r.fp == ARGV[5]
local changed = state == 'pending' and bound
if changed then
  r.adby, r.adat = ARGV[6], s(now)
  if ARGV[4] == 'approve' then
    r.ast, r.st = 'approved', 'authorized'
    save(rkey, r, {'adby', 'adat', 'ast', 'st'}, {})
  else
    r.ast, r.st, r.areason = 'denied', 'denied', ARGV[5]
    -- Kept for its retention after the decision, for the retries that must get it.
    r.ex = s(now + num(r.ret))
    save(rkey, r, {'adby', 'adat', 'ast', 'st', 'areason', 'ex'}, {})
  end
  charge(r.k, tonumber(ARGV[7]))
  index(r)
end
local c, b = '0', '0'
if changed then c = '1' end
if bound then b = '1' end
return {c, b, s(now), unpack(flat(rkey))}
