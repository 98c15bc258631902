-- count replays: KEYS[1] the record. ARGV: 1 base, 2 scope, 3 operation id, 4 how many.
-- Adds them to a completed record's replay count; returns 1 when it did (0: the record is
-- gone, another operation's, or not completed).
local now = clock()
local r = load(KEYS[1])
if r == nil or r.sc ~= ARGV[2] or r.id ~= ARGV[3] or r.st ~= 'completed' or expired(r, now) then
  return 0
end
r.rp = s((num(r.rp) or 0) + tonumber(ARGV[4]))
save(KEYS[1], r, {'rp'}, {})
return 1
