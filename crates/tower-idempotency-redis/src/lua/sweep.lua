-- purge: KEYS[1] the scope's live set. ARGV: 1 base, 2 limit. Deletes up to `limit`
-- records whose retention ended; returns how many.
return sweep(clock(), tonumber(ARGV[2]))
