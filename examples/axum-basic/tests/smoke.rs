//! The example starts, guards `POST /orders` and replays a retry.

use test_harness::example::Example;

#[tokio::test]
async fn starts_and_replays_a_retry() {
    let example = Example::start(env!("CARGO_BIN_EXE_axum-basic")).await;
    let order = r#"{"sku": "A-1", "qty": 2}"#;
    example.assert_retry_replays("order-1", order, order).await;

    let no_key = example
        .client
        .post(format!("{}/orders", example.base))
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(no_key.status(), 400);
    let status = example
        .client
        .get(format!(
            "{}/operations?idempotency_key=order-1",
            example.base
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(status.status(), 200);
    let health = example
        .client
        .get(format!("{}/healthz", example.base))
        .send()
        .await
        .unwrap();
    assert_eq!(health.status(), 200);
}
