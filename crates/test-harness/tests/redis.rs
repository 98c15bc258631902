//! The Redis harness against real `redis-server` processes: a standalone server, the shared
//! 3 + 3 cluster, `key_slot` against `CLUSTER KEYSLOT`, failover after a primary's kill and
//! pause, and a slot migration.

use std::time::Duration;

use test_harness::redis::{
    self, ProcessState, RedisCluster, RedisServer, Reply, Role, command, command_ok, commands,
    key_slot,
};

const HEALTHY_WITHIN: Duration = Duration::from_secs(30);

fn text(port: u16, args: &[&str]) -> Option<String> {
    command_ok(port, args).expect("a Redis command").text()
}

#[test]
fn a_standalone_server_answers_and_dies_with_a_kill() {
    let shared = redis::shared_server();
    assert_eq!(text(shared.port(), &["PING"]).as_deref(), Some("PONG"));
    assert_eq!(shared.url(), format!("redis://127.0.0.1:{}", shared.port()));
    assert!(
        std::ptr::eq(shared, redis::shared_server()),
        "one per process"
    );
    // No snapshots, no AOF by default; arguments override.
    let config = command_ok(shared.port(), &["CONFIG", "GET", "appendonly"]).unwrap();
    assert_eq!(config.items()[1].text().as_deref(), Some("no"));

    let own = RedisServer::launch_with(&["--appendonly", "yes"]);
    let config = command_ok(own.port(), &["CONFIG", "GET", "appendonly"]).unwrap();
    assert_eq!(config.items()[1].text().as_deref(), Some("yes"));
    command_ok(own.port(), &["SET", "k", "v"]).unwrap();
    own.kill();
    assert!(command(own.port(), &["PING"]).is_err(), "killed means gone");
    own.restart();
    // Restarted from its own directory: the AOF brought the key back.
    assert_eq!(text(own.port(), &["GET", "k"]).as_deref(), Some("v"));
}

#[test]
fn the_shared_cluster_has_three_primaries_each_with_a_replica_and_every_slot() {
    let cluster = redis::shared_cluster();
    cluster.check_health().expect("healthy when handed out");
    let nodes = cluster.nodes();
    assert_eq!(nodes.len(), 6);
    assert_eq!(cluster.seed_urls().len(), 6);
    let primaries: Vec<_> = nodes.iter().filter(|n| n.role == Role::Primary).collect();
    assert_eq!(primaries.len(), 3);
    for primary in &primaries {
        assert!(!primary.slots.is_empty());
        let replicas = nodes
            .iter()
            .filter(|n| n.primary_port == Some(primary.port))
            .count();
        assert_eq!(replicas, 1, "one replica for {}", primary.port);
    }
    let served: usize = primaries
        .iter()
        .flat_map(|p| p.slots.iter())
        .map(|range| range.clone().count())
        .sum();
    assert_eq!(served, 16384);
    for slot in [0, 5000, 16383] {
        let port = cluster.primary_of_slot(slot);
        assert!(primaries.iter().any(|p| p.port == port && p.serves(slot)));
    }
    assert!(
        nodes
            .iter()
            .all(|n| n.process == ProcessState::Running && !n.failing)
    );
}

#[test]
fn key_slot_agrees_with_cluster_keyslot() {
    let cluster = redis::shared_cluster();
    let port = cluster.ports()[0];
    let keys: Vec<Vec<u8>> = vec![
        b"".to_vec(),
        b"foo".to_vec(),
        b"{user1000}.following".to_vec(),
        b"{user1000}.followers".to_vec(),
        b"foo{}{bar}".to_vec(),
        b"foo{{bar}}zap".to_vec(),
        b"foo{bar}{zap}".to_vec(),
        b"{".to_vec(),
        b"}{".to_vec(),
        b"{}".to_vec(),
        b"idem:{acct-42}:rec:abc".to_vec(),
        b"idem:{acc\xffnt}:op".to_vec(),
        vec![0, 1, 2, 255, b'{', 0, b'}', 7],
        "idem:{zoë}:rec".as_bytes().to_vec(),
    ];
    let mut more: Vec<Vec<u8>> = (0..200u32)
        .map(|i| format!("k{i}:{{tag{}}}", i * 7919).into_bytes())
        .collect();
    more.extend(keys);
    for key in more {
        let reply = command_ok(port, &[b"CLUSTER".as_slice(), b"KEYSLOT", &key]).unwrap();
        assert_eq!(
            reply,
            Reply::Integer(i64::from(key_slot(&key))),
            "key {:?}",
            String::from_utf8_lossy(&key)
        );
    }
}

/// Polls `check` for up to 10 s.
fn eventually(mut check: impl FnMut() -> bool) -> bool {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        if check() {
            return true;
        }
        if std::time::Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// `GET key` on a replica, in one connection that first allows replica reads.
fn replica_get(port: u16, key: &str) -> Option<String> {
    commands(port, &[&["READONLY"][..], &["GET", key]])
        .ok()
        .and_then(|replies| replies.get(1).and_then(Reply::text))
}

#[test]
fn a_killed_or_paused_primary_is_replaced_by_its_replica_and_rejoins_as_a_replica() {
    let cluster = RedisCluster::launch(3, 1);
    let key = "{chaos}:record";
    let slot = key_slot(key.as_bytes());

    // SIGKILL: the replica is promoted, the killed node comes back as its replica.
    let old = cluster.primary_of_slot(slot);
    command_ok(old, &["SET", key, "kept"]).unwrap();
    assert_eq!(
        command_ok(old, &["WAIT", "1", "5000"]).unwrap(),
        Reply::Integer(1)
    );
    let replica = cluster
        .nodes()
        .into_iter()
        .find(|n| n.primary_port == Some(old))
        .expect("a replica")
        .port;
    // The replica holds the key before its primary dies (read on a connection that allows
    // replica reads): what the promotion must keep.
    assert!(
        eventually(|| replica_get(replica, key).as_deref() == Some("kept")),
        "the replica never showed the acknowledged write"
    );
    cluster.kill(old);
    assert!(command(old, &["PING"]).is_err());
    assert!(
        cluster.check_health().is_err(),
        "a killed primary is not healthy"
    );
    cluster.wait_until_healthy(HEALTHY_WITHIN);
    assert_eq!(cluster.primary_of_slot(slot), replica);
    // Answered by the promoted node once it serves the slot (on a loaded machine the
    // cluster's view settles a moment after it reports healthy).
    assert!(
        eventually(|| text(replica, &["GET", key]).as_deref() == Some("kept")),
        "the promoted replica lost the acknowledged write: {:?}",
        command(replica, &["GET", key])
    );
    cluster.restart(old);
    cluster.wait_until_healthy(HEALTHY_WITHIN);
    // The restarted node learns the newer configuration a moment after the cluster reads
    // healthy: its own view is polled.
    let rejoined_as_replica = || {
        cluster
            .nodes()
            .into_iter()
            .find(|n| n.port == old)
            .is_some_and(|n| n.role == Role::Replica && n.primary_port == Some(replica))
    };
    assert!(
        eventually(rejoined_as_replica),
        "the killed primary did not rejoin as its replica's replica: {:?}",
        cluster.nodes().into_iter().find(|n| n.port == old)
    );
    assert_eq!(text(old, &["READONLY"]).as_deref(), Some("OK"));

    // SIGSTOP past the node timeout: the same, and SIGCONT brings it back as a replica.
    let paused = cluster.primary_of_slot(slot);
    cluster.pause(paused);
    assert!(
        command(paused, &["PING"]).is_err(),
        "a paused node answers nothing"
    );
    cluster.wait_until_healthy(HEALTHY_WITHIN);
    assert_eq!(cluster.primary_of_slot(slot), old);
    cluster.resume(paused);
    cluster.wait_until_healthy(HEALTHY_WITHIN);
    let resumed_as_replica = || {
        cluster
            .nodes()
            .into_iter()
            .find(|n| n.port == paused)
            .is_some_and(|n| n.role == Role::Replica)
    };
    assert!(
        eventually(resumed_as_replica),
        "the resumed node did not come back as a replica: {:?}",
        cluster.nodes().into_iter().find(|n| n.port == paused)
    );
    assert!(
        eventually(|| text(old, &["GET", key]).as_deref() == Some("kept")),
        "the write was lost across the second failover: {:?}",
        command(old, &["GET", key])
    );
}

#[test]
fn a_slot_migration_moves_its_keys_to_the_target_primary() {
    let cluster = RedisCluster::launch(3, 1);
    let slot = key_slot(b"{acct-7}");
    let source = cluster.primary_of_slot(slot);
    let keys: Vec<String> = (0..250)
        .map(|i| format!("idem:{{acct-7}}:rec:{i}"))
        .collect();
    for key in &keys {
        command_ok(source, &["SET", key, key]).unwrap();
    }
    let untouched = (0u32..)
        .map(|i| format!("other-{i}"))
        .find(|k| {
            cluster.primary_of_slot(key_slot(k.as_bytes())) == source
                && key_slot(k.as_bytes()) != slot
        })
        .unwrap();
    command_ok(source, &["SET", &untouched, "stays"]).unwrap();
    let target = cluster
        .nodes()
        .into_iter()
        .find(|n| n.role == Role::Primary && n.port != source)
        .unwrap()
        .port;

    // A key written on the target through ASK while the source still holds it: what a
    // script touching a key it does not declare can do during a migration.
    let nodes = cluster.nodes();
    let id = |port: u16| nodes.iter().find(|n| n.port == port).unwrap().id.clone();
    let slot_text = slot.to_string();
    command_ok(source, &["SET", "idem:{acct-7}:live", "source"]).unwrap();
    command_ok(
        target,
        &["CLUSTER", "SETSLOT", &slot_text, "IMPORTING", &id(source)],
    )
    .unwrap();
    command_ok(
        source,
        &["CLUSTER", "SETSLOT", &slot_text, "MIGRATING", &id(target)],
    )
    .unwrap();
    let asked = commands(
        target,
        &[&["ASKING"][..], &["SET", "idem:{acct-7}:live", "target"]],
    )
    .unwrap();
    assert_eq!(asked[1], Reply::Status("OK".to_owned()));

    let migration = cluster.migrate_slot(slot, target);

    assert_eq!(migration.keys_moved, 251);
    assert_eq!(
        migration.keys_on_both_sides,
        vec![b"idem:{acct-7}:live".to_vec()]
    );
    assert_eq!(
        text(target, &["GET", "idem:{acct-7}:live"]).as_deref(),
        Some("source"),
        "the source's copy wins, as with redis-cli --cluster-replace"
    );
    assert_eq!(cluster.primary_of_slot(slot), target);
    for key in &keys {
        assert_eq!(text(target, &["GET", key]).as_deref(), Some(key.as_str()));
        match command(source, &["GET", key]).unwrap() {
            Reply::Error(err) => assert!(err.starts_with("MOVED"), "{err}"),
            other => panic!("the source still answers for {key}: {other:?}"),
        }
    }
    assert_eq!(
        command_ok(source, &["CLUSTER", "COUNTKEYSINSLOT", &slot.to_string()]).unwrap(),
        Reply::Integer(0)
    );
    assert_eq!(text(source, &["GET", &untouched]).as_deref(), Some("stays"));
    cluster.wait_until_healthy(HEALTHY_WITHIN);
}
