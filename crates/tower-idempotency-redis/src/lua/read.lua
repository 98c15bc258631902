-- read: KEYS[1] the record, or an index (operation id or approval id) naming its key.
-- ARGV: 1 base, 2 'key' or 'index'. Returns {now, record...} ({now} when absent).
local now = clock()
local rkey = KEYS[1]
if ARGV[2] == 'index' then
  local k = redis.call('GET', KEYS[1])
  if not k then return {s(now)} end
  rkey = base .. 'r:' .. k
end
return {s(now), unpack(flat(rkey))}
