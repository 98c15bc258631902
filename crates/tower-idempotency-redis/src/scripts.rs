//! The Lua scripts, one per atomic step, each a `#!lua` line (Redis 7 script flags: a
//! script that writes is refused whole, before it runs, when Redis is out of memory —
//! never halfway; the read declares `no-writes` and runs even then), the shared prelude
//! (`lua/prelude.lua`: the clock, the record's effective state, its index and TTL, quota
//! counting, the sweep of expired records, the lease fence) and its own body. Run as `EVALSHA`
//! (`Conn::script`), loaded again after a `NOSCRIPT` (a restarted or failed-over node).

use std::sync::LazyLock;

use redis::Script;

macro_rules! script {
    ($name:ident, $file:literal, $doc:literal) => {
        script!($name, $file, "#!lua\n", $doc);
    };
    ($name:ident, $file:literal, $shebang:literal, $doc:literal) => {
        #[doc = $doc]
        pub(crate) static $name: LazyLock<Script> = LazyLock::new(|| {
            Script::new(concat!(
                $shebang,
                include_str!("lua/prelude.lua"),
                include_str!(concat!("lua/", $file))
            ))
        });
    };
}

script!(
    RESERVE,
    "reserve.lua",
    "Reserve: create, replay, conflict, take over, start an authorized operation, replace a delivered one, refuse over quota."
);
script!(
    COMPLETE,
    "complete.lua",
    "Complete (and optionally mark delivered), fenced by the lease."
);
script!(
    LEASE,
    "lease.lua",
    "Release, abandon, extend, mark dispatched, cancel, fenced by the lease."
);
script!(
    READ,
    "read.lua",
    "#!lua flags=no-writes\n",
    "Read a record (by key, or through an id index) with the server's time."
);
script!(
    DELIVER,
    "deliver.lua",
    "Mark a completed record delivered, the first time."
);
script!(DECIDE, "decide.lua", "Decide an approval, exactly once.");
script!(APPROVALS, "approvals.lua", "List a scope's approvals.");
script!(
    SWEEP,
    "sweep.lua",
    "Delete a scope's records whose retention ended."
);
script!(
    COUNT,
    "count.lua",
    "Add replays, counted off the request path, to a completed record."
);
script!(
    RESOLVE,
    "resolve.lua",
    "Resolve an unknown operation (operator)."
);
