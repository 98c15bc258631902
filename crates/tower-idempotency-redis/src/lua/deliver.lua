-- mark_delivered: KEYS[1] the operation-id index. ARGV: 1 base, 2 scope, 3 operation id.
-- Marks a completed record delivered, the first time only. Returns 1 when it did.
local now = clock()
local k = redis.call('GET', KEYS[1])
if not k then return 0 end
local rkey = base .. 'r:' .. k
local r = load(rkey)
if r == nil or r.sc ~= ARGV[2] or r.id ~= ARGV[3] or expired(r, now) then return 0 end
if r.st ~= 'completed' or r.dv == '1' then return 0 end
r.dv, r.da = '1', s(now)
save(rkey, r, {'dv', 'da'}, {})
return 1
