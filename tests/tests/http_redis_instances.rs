//! Several demo instances on one Redis Cluster.

use std::time::Duration;

use integration_tests::app::{TestServer, demo_config, fresh_key_prefix, new_account, new_key};

const TICKET: &str = r#"{"project":"ops","title":"Disk full on db-1","priority":"high"}"#;

/// Two demo instances on one Redis Cluster, sharing their records (one key prefix), take
/// the same request with the same key at the same moment, over and over: each key runs
/// its handler once, in one of the two processes, and both answers carry its response.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_instances_racing_on_one_key_execute_it_once() {
    let prefix = fresh_key_prefix();
    let config = || demo::Config {
        handler_delay: Duration::from_millis(50),
        ..demo_config()
    };
    let first = TestServer::demo_on_redis_cluster_sharing(config(), &prefix).await;
    let second = TestServer::demo_on_redis_cluster_sharing(config(), &prefix).await;
    let account = new_account();
    let (a, b) = (first.client(&account), second.client(&account));
    const KEYS: usize = 20;
    for _ in 0..KEYS {
        let key = new_key();
        let (one, two) = tokio::join!(
            a.post("/v1/tickets", Some(&key), TICKET),
            b.post("/v1/tickets", Some(&key), TICKET)
        );
        assert_eq!(one.status, 201, "{}", one.text());
        assert_eq!(two.status, 201, "{}", two.text());
        assert_eq!(
            one.body, two.body,
            "both answers carry the one execution's response"
        );
        assert_eq!(one.operation_id(), two.operation_id());
        assert!(
            one.is_replay() != two.is_replay(),
            "exactly one of the two answers is the execution, the other its replay"
        );
    }
    // Each process keeps the tickets it created: together, one per key.
    let created = a.list("tickets").await.len() + b.list("tickets").await.len();
    assert_eq!(created, KEYS);
}
