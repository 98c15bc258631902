-- list_approvals: KEYS[1] the scope's approval set. ARGV: 1 base. Returns {now, record...}, oldest request first; forgets approvals whose
-- record is gone.
local now = clock()
local out = {s(now)}
for _, aid in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
  local k = redis.call('GET', base .. 'a:' .. aid)
  local rec = {}
  if k then rec = flat(base .. 'r:' .. k) end
  if #rec == 0 then
    redis.call('ZREM', KEYS[1], aid)
  else
    out[#out + 1] = rec[1]
  end
end
return out
