//! The `demo` binary's process contract: it prints `listening on http://ADDR` once it
//! accepts connections, serves `/healthz` and `/metrics`, and exits 0 on SIGTERM.

use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

use crate::support::DemoProcess;

const DEADLINE: Duration = Duration::from_secs(30);

fn demo() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_demo"));
    command
        .env_remove("DATABASE_URL")
        .env("RUST_LOG", "warn")
        .kill_on_drop(true);
    command
}

#[cfg(unix)]
#[tokio::test]
async fn prints_its_address_serves_and_stops_on_sigterm() {
    let mut child = demo()
        .args(["--listen", "127.0.0.1:0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let mut lines = BufReader::new(stdout).lines();
    let line = tokio::time::timeout(DEADLINE, lines.next_line())
        .await
        .expect("the demo printed nothing in time")
        .unwrap()
        .expect("the demo closed stdout without printing its address");
    let base = line
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"));
    assert!(base.starts_with("http://127.0.0.1:"), "{base}");
    assert!(
        !base.ends_with(":0"),
        "the real bound port is printed: {base}"
    );

    let client = reqwest::Client::builder()
        .timeout(DEADLINE)
        .build()
        .unwrap();
    let health = client.get(format!("{base}/healthz")).send().await.unwrap();
    assert_eq!(health.status(), 200);
    let anonymous = client
        .get(format!("{base}/v1/tickets"))
        .send()
        .await
        .unwrap();
    assert_eq!(anonymous.status(), 401);
    let metrics = client.get(format!("{base}/metrics")).send().await.unwrap();
    assert_eq!(metrics.status(), 200, "/metrics needs no authentication");
    assert_eq!(
        metrics.headers()["content-type"],
        "text/plain; version=0.0.4"
    );

    let pid = child.id().unwrap().to_string();
    let kill = Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .await
        .unwrap();
    assert!(kill.success());
    let status = tokio::time::timeout(DEADLINE, child.wait())
        .await
        .expect("the demo did not stop after SIGTERM")
        .unwrap();
    assert!(status.success(), "exit status after SIGTERM: {status}");
}

#[tokio::test]
async fn help_exits_zero_and_bad_arguments_exit_two() {
    let help = demo().arg("--help").output().await.unwrap();
    assert!(help.status.success());
    assert!(String::from_utf8_lossy(&help.stdout).contains("--handler-delay-ms"));

    let bad = demo().arg("--lease-ms").arg("soon").output().await.unwrap();
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("--lease-ms"));
    assert!(bad.stdout.is_empty());

    let excluded = demo()
        .args(["--non-transactional", "--memory-records"])
        .output()
        .await
        .unwrap();
    assert_eq!(excluded.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&excluded.stderr);
    assert!(
        stderr.contains("--non-transactional") && stderr.contains("--memory-records"),
        "{stderr}"
    );
}

#[tokio::test]
async fn version_prints_the_crate_version_and_exits_zero() {
    let version = demo().arg("--version").output().await.unwrap();
    assert!(version.status.success(), "{version:?}");
    assert_eq!(
        String::from_utf8_lossy(&version.stdout).trim(),
        format!("demo {}", env!("CARGO_PKG_VERSION"))
    );
}

#[tokio::test]
async fn database_url_comes_from_the_environment_unless_empty() {
    // A URL nobody answers: the demo read it, tried PostgreSQL and gave up (exit 1).
    let unreachable = demo()
        .args(["--listen", "127.0.0.1:0"])
        .env("DATABASE_URL", "postgres://postgres@127.0.0.1:1/none")
        .output()
        .await
        .unwrap();
    assert_eq!(unreachable.status.code(), Some(1), "{unreachable:?}");
    assert!(
        String::from_utf8_lossy(&unreachable.stderr).contains("PostgreSQL"),
        "{unreachable:?}"
    );
    assert!(unreachable.stdout.is_empty());

    // An empty DATABASE_URL counts as unset: memory mode, so the database-only flag is
    // refused as needing a database URL.
    let empty = demo()
        .args(["--listen", "127.0.0.1:0", "--memory-records"])
        .env("DATABASE_URL", "")
        .output()
        .await
        .unwrap();
    assert_eq!(empty.status.code(), Some(1), "{empty:?}");
    assert!(String::from_utf8_lossy(&empty.stderr).contains("needs a database URL"));
}

#[tokio::test]
async fn database_flags_without_a_database_are_a_startup_error() {
    for flags in [
        &["--non-transactional"][..],
        &["--memory-records"],
        &["--pg-statements", "unnamed"],
    ] {
        let flag = flags[0];
        let refused = demo()
            .args(["--listen", "127.0.0.1:0"])
            .args(flags)
            .output()
            .await
            .unwrap();
        assert_eq!(refused.status.code(), Some(1), "{flag}: {refused:?}");
        let stderr = String::from_utf8_lossy(&refused.stderr);
        assert!(
            stderr.contains(flag) && stderr.contains("needs a database URL"),
            "{flag}: {stderr}"
        );
        assert!(
            refused.stdout.is_empty(),
            "{flag}: it never listened: {}",
            String::from_utf8_lossy(&refused.stdout)
        );
    }
}

/// `--approver` and `--approval-ttl-ms` reach the running binary: a production deploy
/// waits for the named approver of the account, and nobody else decides it.
#[cfg(unix)]
#[tokio::test]
async fn the_approval_flags_name_who_approves_and_for_how_long() {
    use serde_json::{Value, json};

    let mut child = demo()
        .args(["--listen", "127.0.0.1:0", "--approver", "alice"])
        .args(["--approver", "bob", "--approval-ttl-ms", "600000"])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let mut lines = BufReader::new(stdout).lines();
    let line = tokio::time::timeout(DEADLINE, lines.next_line())
        .await
        .expect("the demo printed nothing in time")
        .unwrap()
        .unwrap();
    let base = line.strip_prefix("listening on ").unwrap().to_owned();
    let http = reqwest::Client::builder()
        .no_proxy()
        .timeout(DEADLINE)
        .build()
        .unwrap();
    let artifact = format!("sha256:{}", "ab".repeat(32));
    let deploy = json!({"service": "api", "environment": "production", "artifact": artifact});
    let send = |credential: &str, url: String, key: Option<&str>, body: &Value| {
        let mut request = http
            .post(url)
            .bearer_auth(credential)
            .header("content-type", "application/json")
            .body(body.to_string());
        if let Some(key) = key {
            request = request.header("idempotency-key", key);
        }
        request.send()
    };
    let url = format!("{base}/v1/deploys");
    let required = send("acme", url.clone(), Some("k-1"), &deploy)
        .await
        .unwrap();
    assert_eq!(required.status(), 403);
    let problem: Value = required.json().await.unwrap();
    assert!(
        problem["type"]
            .as_str()
            .unwrap()
            .ends_with("/approval-required")
    );
    let expires = problem["expires_at"].as_str().unwrap();
    assert!(expires.ends_with('Z'), "{expires}");

    let approve = format!(
        "{base}{}/approve",
        problem["approval_url"].as_str().unwrap()
    );
    let body = json!({"fingerprint": problem["fingerprint"]});
    let refused = send("acme:approver", approve.clone(), None, &body)
        .await
        .unwrap();
    assert_eq!(
        refused.status(),
        403,
        "`approver` is not named by --approver"
    );
    let approved = send("acme:bob", approve, None, &body).await.unwrap();
    assert_eq!(approved.status(), 200);
    let executed = send("acme", url, Some("k-1"), &deploy).await.unwrap();
    assert_eq!(executed.status(), 201);
    child.kill().await.unwrap();
}

/// `docs/openapi.json`, the demo's document as published.
const OPENAPI_DOC: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/openapi.json");

/// The Python of the test virtualenv, where `scripts/mcp-python` installs
/// `openapi-spec-validator` (override: `OPENAPI_PYTHON`).
fn validator_python() -> std::path::PathBuf {
    if let Some(path) = std::env::var_os("OPENAPI_PYTHON") {
        return path.into();
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| concat!(env!("CARGO_MANIFEST_DIR"), "/../../target").into());
    let path = target.join("mcp-python/bin/python");
    assert!(
        path.exists(),
        "openapi-spec-validator is not installed at {}: run scripts/mcp-python (or set OPENAPI_PYTHON)",
        path.display()
    );
    path
}

/// The demo serves its OpenAPI 3.1 document at `GET /openapi.json` (no authentication);
/// `docs/openapi.json` is that document, byte for byte once pretty-printed
/// (`UPDATE_OPENAPI=1` rewrites it); `openapi-spec-validator` accepts it; and it describes
/// every problem type the layer emits (the table `ProblemType::ALL`), each with its status,
/// used by some answer, besides the status, approvals and audit routes.
#[tokio::test]
async fn the_openapi_document_is_served_published_valid_and_complete() {
    let demo = DemoProcess::start_in_memory(&[]).await;
    let base = &demo.base;
    let client = reqwest::Client::builder()
        .timeout(DEADLINE)
        .build()
        .unwrap();
    let response = client
        .get(format!("{base}/openapi.json"))
        .send()
        .await
        .unwrap();
    assert_eq!(
        response.status(),
        200,
        "/openapi.json needs no authentication"
    );
    let served: serde_json::Value = response.json().await.unwrap();
    drop(demo);
    let pretty = format!("{}\n", serde_json::to_string_pretty(&served).unwrap());

    if std::env::var_os("UPDATE_OPENAPI").is_some_and(|v| v == "1") {
        std::fs::write(OPENAPI_DOC, &pretty).unwrap();
    }
    let published = std::fs::read_to_string(OPENAPI_DOC).unwrap_or_default();
    assert!(
        published == pretty,
        "docs/openapi.json is stale (not what the demo serves at /openapi.json); regenerate it \
         with `UPDATE_OPENAPI=1 cargo test -p demo --test integration -- openapi`"
    );

    let file = std::env::temp_dir().join(format!("demo-openapi-{}.json", std::process::id()));
    std::fs::write(&file, &pretty).unwrap();
    let output = std::process::Command::new(validator_python())
        .args([
            "-c",
            "import json, sys\n\
             from openapi_spec_validator import OpenAPIV31SpecValidator, validate\n\
             with open(sys.argv[1]) as f: spec = json.load(f)\n\
             validate(spec, cls=OpenAPIV31SpecValidator)\n\
             print('valid')",
        ])
        .arg(&file)
        .output()
        .expect("run openapi-spec-validator's Python (scripts/mcp-python installs it)");
    let _ = std::fs::remove_file(&file);
    assert!(
        output.status.success(),
        "openapi-spec-validator refused the document:\n{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );

    assert_eq!(served["openapi"], "3.1.0");
    let paths = &served["paths"];
    let text = paths.to_string();
    for problem in tower_idempotency::problem::ProblemType::ALL {
        let name = tower_idempotency::openapi::problem_schema_name(problem.slug);
        let schema = &served["components"]["schemas"][&name];
        assert_eq!(
            schema["properties"]["status"]["const"],
            problem.status.as_u16(),
            "{name}"
        );
        assert_eq!(
            schema["properties"]["type"]["const"],
            format!("https://tower-idempotency.dev/problems/{}", problem.slug)
        );
        // The demo's routes are transactional only with their records in PostgreSQL.
        let transactional = matches!(problem.slug, "transactions-unsupported" | "not-committed");
        assert!(
            transactional || text.contains(&format!("\"#/components/schemas/{name}\"")),
            "no answer uses {name}"
        );
    }
    for path in [
        "/operations/{operation_id}",
        "/operations",
        "/approvals",
        "/approvals/{approval_id}",
        "/approvals/{approval_id}/approve",
        "/approvals/{approval_id}/deny",
        "/audit",
    ] {
        assert!(paths[path].is_object(), "{path}");
    }
    let post = &paths["/v1/deploys"]["post"];
    assert_eq!(
        post["parameters"][0]["$ref"],
        "#/components/parameters/IdempotencyKey"
    );
    let created = &post["responses"]["201"]["headers"];
    assert!(created["Idempotent-Replayed"].is_object() && created["Operation-Id"].is_object());
    let key = &served["components"]["parameters"]["IdempotencyKey"];
    assert_eq!(key["in"], "header");
    assert_eq!(key["name"], "Idempotency-Key");
    assert_eq!(key["required"], true);
}

/// Starts the binary with `args` (records in memory) and returns it with its `host:port`.
async fn started(args: &[&str]) -> (DemoProcess, String) {
    let demo = DemoProcess::start_in_memory(args).await;
    let addr = demo.base.trim_start_matches("http://").to_owned();
    (demo, addr)
}

/// Reads until the peer closes (or `limit` passes); what it sent.
async fn read_to_close(stream: &mut tokio::net::TcpStream, limit: Duration) -> Option<Vec<u8>> {
    use tokio::io::AsyncReadExt;
    let mut answer = Vec::new();
    let read = tokio::time::timeout(limit, async {
        let mut buffer = [0u8; 1024];
        loop {
            match stream.read(&mut buffer).await {
                Ok(0) | Err(_) => break,
                Ok(n) => answer.extend_from_slice(&buffer[..n]),
            }
        }
    })
    .await;
    read.ok().map(|()| answer)
}

/// A client that stops in the middle of its request head is disconnected once
/// `--header-read-timeout-ms` passes: it cannot hold a connection open.
#[tokio::test]
async fn a_half_sent_request_head_is_disconnected_after_the_header_read_timeout() {
    use tokio::io::AsyncWriteExt;
    let (_child, addr) = started(&["--header-read-timeout-ms", "300"]).await;
    for half in [
        &b"POST /v1/tickets HTTP/1.1\r\nHost: localhost\r\nX-Slow: "[..],
        &b"GET /healthz HTT"[..],
    ] {
        let mut stream = tokio::net::TcpStream::connect(&addr).await.unwrap();
        stream.write_all(half).await.unwrap();
        let started = std::time::Instant::now();
        let answer = read_to_close(&mut stream, Duration::from_secs(10)).await;
        let answer = answer.expect("the connection was still open after 10 s");
        let elapsed = started.elapsed();
        assert!(elapsed < Duration::from_secs(5), "closed after {elapsed:?}");
        assert!(
            answer.is_empty() || answer.starts_with(b"HTTP/1.1 408"),
            "{}",
            String::from_utf8_lossy(&answer)
        );
    }
    // A whole request is still served.
    let health = reqwest::get(format!("http://{addr}/healthz"))
        .await
        .unwrap();
    assert_eq!(health.status(), 200);
}

/// Past `--max-connections`, a new connection is not served until one of the open ones
/// closes.
#[tokio::test]
async fn connections_past_the_limit_wait_until_one_closes() {
    use tokio::io::AsyncWriteExt;
    let (_child, addr) = started(&[
        "--max-connections",
        "2",
        "--header-read-timeout-ms",
        "30000",
    ])
    .await;
    let mut held = Vec::new();
    for _ in 0..2 {
        let mut stream = tokio::net::TcpStream::connect(&addr).await.unwrap();
        stream
            .write_all(b"GET /healthz HTTP/1.1\r\n")
            .await
            .unwrap();
        held.push(stream);
    }
    // Give the server time to take both.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut third = tokio::net::TcpStream::connect(&addr).await.unwrap();
    third
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    assert!(
        read_to_close(&mut third, Duration::from_millis(1000))
            .await
            .is_none(),
        "the third connection was served past the limit"
    );
    drop(held.pop());
    let answer = read_to_close(&mut third, DEADLINE)
        .await
        .expect("the third connection was not served after one closed");
    assert!(
        answer.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&answer)
    );
}
