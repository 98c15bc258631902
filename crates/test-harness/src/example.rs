//! What the axum-basic and hyper-basic smoke tests share: start an example binary on a free
//! port, send it `POST /orders` with a key, and check that a retry is a byte-for-byte
//! replay.

use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Child;

const DEADLINE: Duration = Duration::from_secs(30);

/// A running example; dropping it kills the process.
#[derive(Debug)]
pub struct Example {
    /// `http://127.0.0.1:PORT`, as the example printed it.
    pub base: String,
    /// A client with the test's deadline.
    pub client: reqwest::Client,
    _child: Child,
}

impl Example {
    /// Starts `binary` with a listen address of port 0 and waits for its
    /// `listening on URL` line.
    pub async fn start(binary: &str) -> Self {
        let mut child = tokio::process::Command::new(binary)
            .arg("127.0.0.1:0")
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let line = tokio::time::timeout(DEADLINE, lines.next_line())
            .await
            .expect("the example printed nothing in time")
            .unwrap()
            .expect("the example closed stdout without printing its address");
        let base = line
            .strip_prefix("listening on ")
            .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
            .to_owned();
        let client = reqwest::Client::builder()
            .timeout(DEADLINE)
            .build()
            .unwrap();
        Self {
            base,
            client,
            _child: child,
        }
    }

    /// `POST /orders` as JSON under idempotency key `key`.
    pub async fn order(&self, key: &str, body: &'static str) -> reqwest::Response {
        self.client
            .post(format!("{}/orders", self.base))
            .header("content-type", "application/json")
            .header("idempotency-key", key)
            .body(body)
            .send()
            .await
            .unwrap()
    }

    /// Sends `first` and then `retry` (the same command, however spelled) under one key:
    /// the first is executed (`201` with an `Operation-Id`), the retry replays it.
    pub async fn assert_retry_replays(&self, key: &str, first: &'static str, retry: &'static str) {
        let original = self.order(key, first).await;
        assert_eq!(original.status(), 201);
        assert!(original.headers().contains_key("operation-id"));
        let original_body = original.bytes().await.unwrap();
        let replay = self.order(key, retry).await;
        assert_eq!(replay.status(), 201);
        assert_eq!(replay.headers()["idempotent-replayed"], "true");
        assert_eq!(replay.bytes().await.unwrap(), original_body);
    }
}
