-- list_approvals, one bounded page: KEYS[1] the scope's approval set (scored by request
-- time, µs). ARGV: 1 base, 2 the earliest request time to read (µs, inclusive, or '-inf'),
-- 3 how many of the set's entries to read at most. Returns {now, entries read, the last
-- entry's score or '', record...}, oldest request first (ties by approval id); forgets
-- approvals whose record is gone. A page never reads more than ARGV[3] entries, so one
-- scope's approvals, however many, never hold the server for longer than that.
local now = clock()
local read = redis.call('ZRANGE', KEYS[1], ARGV[2], '+inf', 'BYSCORE', 'LIMIT', 0,
  tonumber(ARGV[3]), 'WITHSCORES')
local last = ''
if #read > 0 then last = read[#read] end
local out = {s(now), tostring(#read / 2), last}
for i = 1, #read, 2 do
  local aid = read[i]
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
