//! The example starts, guards `POST /orders` and replays a retry.

use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};

#[tokio::test]
async fn starts_and_replays_a_retry() {
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_axum-basic"))
        .arg("127.0.0.1:0")
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let line = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let base = line.strip_prefix("listening on ").unwrap().to_owned();

    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    let order = || {
        client
            .post(format!("{base}/orders"))
            .header("content-type", "application/json")
            .header("idempotency-key", "order-1")
            .body(r#"{"sku": "A-1", "qty": 2}"#)
            .send()
    };
    let first = order().await.unwrap();
    assert_eq!(first.status(), 201);
    assert!(first.headers().contains_key("operation-id"));
    let first_body = first.bytes().await.unwrap();
    let retry = order().await.unwrap();
    assert_eq!(retry.status(), 201);
    assert_eq!(retry.headers()["idempotent-replayed"], "true");
    assert_eq!(retry.bytes().await.unwrap(), first_body);

    let no_key = client
        .post(format!("{base}/orders"))
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(no_key.status(), 400);
    let status = client
        .get(format!("{base}/operations?idempotency_key=order-1"))
        .send()
        .await
        .unwrap();
    assert_eq!(status.status(), 200);
    let health = client.get(format!("{base}/healthz")).send().await.unwrap();
    assert_eq!(health.status(), 200);
}
