//! Scope names cannot reach another scope's slot or keys: every key of a scope sits under
//! the hash tag of its SHA-256, whatever bytes the name holds (`{`, `}`, `:`, NUL, the
//! victim's own tag or key names, arbitrary Unicode).

use sha2::{Digest, Sha256};
use test_harness::redis::{Reply, command_ok, key_slot, shared_server};
use tower_idempotency_conformance::reserve_request;
use tower_idempotency_core::{
    Fingerprint, IdempotencyKey, Reservation, Scope, Store, StoredResponse,
};
use tower_idempotency_redis::{RedisStore, RedisStoreConfig};

use crate::support::prefix;

fn tag(scope: &str) -> String {
    Sha256::digest(scope.as_bytes())[..16]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn keys(port: u16, prefix: &str) -> Vec<String> {
    let reply = command_ok(port, &["KEYS", &format!("{prefix}:*")]).expect("KEYS");
    reply
        .items()
        .iter()
        .map(|item| match item {
            Reply::Bulk(Some(bytes)) => String::from_utf8(bytes.clone()).expect("UTF-8 key"),
            other => panic!("unexpected KEYS item {other:?}"),
        })
        .collect()
}

/// The hash tag of a key as Redis Cluster reads it.
fn hash_tag(key: &str) -> &str {
    let open = key.find('{').expect("a hash tag");
    let close = key[open..].find('}').expect("a closed hash tag") + open;
    &key[open + 1..close]
}

#[tokio::test(flavor = "multi_thread")]
async fn scope_names_cannot_reach_another_scopes_slot_or_keys() {
    let server = shared_server();
    let prefix = prefix();
    let store = RedisStore::connect(&RedisStoreConfig {
        key_prefix: prefix.clone(),
        ..RedisStoreConfig::standalone(server.url())
    })
    .await
    .expect("connect");
    let key = IdempotencyKey::new("order-1").unwrap();
    let fingerprint = Fingerprint::from_stored("sha256:same-command");
    let victim = "acct_victim";
    let victim_tag = tag(victim);
    let Reservation::Acquired { lease, .. } = store
        .reserve(reserve_request(&Scope::new(victim), &key, &fingerprint))
        .await
        .unwrap()
    else {
        panic!("the victim's first reservation must acquire");
    };
    store
        .complete(
            &lease,
            StoredResponse {
                status: 201,
                headers: Default::default(),
                body: Some("victim's".into()),
            },
        )
        .await
        .unwrap();

    let attackers = [
        format!("{{{victim_tag}}}"),
        format!("{victim}}}"),
        format!("{{{victim}}}"),
        format!("{victim}\0"),
        format!("{prefix}:{{{victim_tag}}}:r:order-1"),
        "}:r:order-1".to_owned(),
        victim_tag.clone(),
        "{".to_owned(),
        "}".to_owned(),
        ":".to_owned(),
        "\0".to_owned(),
        "acct_{victim}:i:".to_owned(),
        "\u{0}\u{feff}é{}}{:\u{10ffff}".to_owned(),
        "acct_victim ".to_owned(),
        "ACCT_VICTIM".to_owned(),
    ];
    for attacker in &attackers {
        let scope = Scope::new(attacker.as_str());
        assert_eq!(
            store.get(&scope, &key).await.unwrap(),
            None,
            "scope {attacker:?} reads nothing of the victim's"
        );
        match store
            .reserve(reserve_request(&scope, &key, &fingerprint))
            .await
            .unwrap()
        {
            Reservation::Acquired { operation, .. } => {
                assert_eq!(operation.scope, scope, "{attacker:?}");
            }
            other => panic!("scope {attacker:?} reached another scope's record: {other:?}"),
        }
    }
    let read = store
        .get(&Scope::new(victim), &key)
        .await
        .unwrap()
        .expect("the victim's record");
    assert_eq!(read.replays, 0, "no attacker replayed the victim's record");
    assert_eq!(read.response.unwrap().body.unwrap(), "victim's");

    // Every key of every scope sits under its scope's tag, and no two scopes share a tag.
    let mut expected: Vec<String> = attackers.iter().map(|a| tag(a)).collect();
    expected.push(victim_tag.clone());
    let mut distinct = expected.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!(
        distinct.len(),
        expected.len(),
        "every scope has its own tag"
    );
    let stored = keys(server.port(), &prefix);
    assert!(!stored.is_empty());
    for stored_key in &stored {
        let found = hash_tag(stored_key);
        assert_eq!(found.len(), 32, "{stored_key}: the tag is 32 hex digits");
        assert!(found.bytes().all(|b| b.is_ascii_hexdigit()), "{stored_key}");
        assert!(
            expected.iter().any(|tag| tag == found),
            "{stored_key}: a tag of no scope"
        );
        assert_eq!(
            key_slot(stored_key.as_bytes()),
            key_slot(found.as_bytes()),
            "{stored_key}: the slot is the tag's"
        );
    }
    for tag in &expected {
        let own = stored.iter().filter(|k| hash_tag(k) == tag).count();
        assert!(
            own >= 2,
            "scope tag {tag}: its record and id index ({own} keys)"
        );
    }
}

#[test]
fn scopes_that_collide_on_a_naive_tag_do_not() {
    // With `{scope}` as the tag, Redis reads `a}x` as the tag `a`: the two would share a
    // slot, and an escaped or truncated name would share keys. Hashed, they do not.
    for (one, other) in [
        ("a", "a}x"),
        ("acct", "acct}:r:k"),
        ("tenant", "tenant}{other}"),
    ] {
        let (one_tag, other_tag) = (tag(one), tag(other));
        assert_ne!(one_tag, other_tag);
        assert_ne!(
            key_slot(format!("idem:{{{one_tag}}}:r:k").as_bytes()),
            key_slot(format!("idem:{{{other_tag}}}:r:k").as_bytes()),
            "{one:?} and {other:?}"
        );
        // The naive layout would have put them together:
        assert_eq!(
            key_slot(format!("idem:{{{one}}}:r:k").as_bytes()),
            key_slot(format!("idem:{{{other}}}:r:k").as_bytes()),
            "{one:?} and {other:?} collide on a naive tag"
        );
    }
}
