//! The example starts, guards `POST /orders` and replays a retry.

use test_harness::example::Example;

#[tokio::test]
async fn starts_and_replays_a_retry() {
    let example = Example::start(env!("CARGO_BIN_EXE_hyper-basic")).await;
    // The retry spells the same command differently: the fingerprint is of its meaning.
    example
        .assert_retry_replays(
            "order-1",
            r#"{"sku": "A-1", "qty": 2}"#,
            r#"{ "qty": 2, "sku": "A-1" }"#,
        )
        .await;
    let changed = example
        .order("order-1", r#"{"sku": "A-1", "qty": 3}"#)
        .await;
    assert_eq!(changed.status(), 409);

    let read = example
        .client
        .get(format!("{}/orders", example.base))
        .send()
        .await
        .unwrap();
    assert_eq!(read.status(), 404, "reads pass through to the service");
}
