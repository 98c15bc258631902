//! What the chaos soak found with `--non-transactional`: when the store is away at the
//! moment an operation completes, the client is sent the handler's `2xx` (the effect
//! happened) and the result cannot be recorded. The layer records it in the background
//! once the store is back, so retries of the key replay the acknowledged answer — at most
//! briefly preceded by `request-in-progress` or `outcome-unknown` while the store
//! recovers — instead of reading `outcome-unknown` for good.

use std::sync::Arc;
use std::time::{Duration, Instant};

use test_harness::pg;
use tokio::net::TcpListener;

const PAYMENT: &str =
    r#"{"amount_minor":1250,"currency":"EUR","invoice_ref":"INV-lost-completion","payee":"ACME"}"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_2xx_the_store_could_not_record_is_replayed_on_retry() {
    let cluster = Arc::new(
        tokio::task::spawn_blocking(pg::TestCluster::launch)
            .await
            .unwrap(),
    );
    let db = cluster.create_database().await;
    let config = demo::Config {
        listen: "127.0.0.1:0".parse().unwrap(),
        database_url: Some(db.url().to_owned()),
        // Long enough to take the database away between the effect and the answer.
        handler_delay: Duration::from_secs(3),
        lease: Duration::from_secs(1),
        records: demo::Records::NonTransactional,
        ..demo::Config::default()
    };
    let router = demo::app(&config).await.unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, router).await });
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    let send = {
        let http = http.clone();
        let base = base.clone();
        move || {
            let request = http
                .post(format!("{base}/v1/payments"))
                .bearer_auth("acme")
                .header("content-type", "application/json")
                .header("idempotency-key", "lost-completion-1")
                .body(PAYMENT);
            async move {
                let response = request.send().await.unwrap();
                let status = response.status().as_u16();
                (status, response.text().await.unwrap())
            }
        }
    };

    let first = tokio::spawn(send());
    // The handler has written the payment (autocommit) and now sleeps before answering.
    let client = db.client().await;
    let started = Instant::now();
    loop {
        let row = client
            .query_one("SELECT count(*) FROM demo_payments", &[])
            .await
            .unwrap();
        if row.get::<_, i64>(0) == 1 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "no payment written"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    drop(client);
    // The store goes away while the handler sleeps: its completion cannot be recorded.
    let stopping = cluster.clone();
    tokio::task::spawn_blocking(move || stopping.stop())
        .await
        .unwrap();
    let (status, body) = first.await.unwrap();
    assert_eq!(
        status, 201,
        "the effect happened and was acknowledged: {body}"
    );
    let starting = cluster.clone();
    tokio::task::spawn_blocking(move || starting.start())
        .await
        .unwrap();

    // Retry until the store answers for the key: past 503s while pools reconnect, and past
    // `request-in-progress` / `outcome-unknown` until the late completion lands.
    let started = Instant::now();
    let (retry_status, retry_body) = loop {
        let (status, body) = send().await;
        if status != 503
            && !body.contains("request-in-progress")
            && !body.contains("outcome-unknown")
        {
            break (status, body);
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "no answer: {status} {body}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(
        (retry_status, retry_body.as_str()),
        (201, body.as_str()),
        "a retry after an acknowledged 201 must replay it"
    );
}
