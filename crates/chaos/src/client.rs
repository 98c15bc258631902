//! The soak's clients: each creates tickets and payments one intent at a time, with the
//! retry behaviour of a careful real client, and records what it was told.
//!
//! Invariants the clients keep so that the final check is sound: one fresh key per intent
//! and the same key for every attempt of it (whatever happened: a timeout, a dropped
//! connection, a `5xx`, a `409 request-in-progress`, a restart of the client itself); every
//! intent carries a unique marker in the effect it asks for (the ticket's title, the
//! payment's invoice), so each effect in the database names the one intent that caused it,
//! and tickets never send `source_event_id`, whose natural-key deduplication would hide a
//! second execution. A key is reused with a changed payload only after its intent was
//! acknowledged, so a completed record exists and the answer must be a refusal.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use reqwest::header::{CONTENT_TYPE, HeaderMap, RETRY_AFTER};
use serde_json::{Value, json};

use crate::rng::Rng;

/// Counters shared by clients and fault injectors.
#[derive(Debug, Default)]
pub struct Stats {
    /// HTTP write attempts sent (probes and final replays included).
    pub attempts: AtomicU64,
    /// Answers by kind.
    pub answered_2xx: AtomicU64,
    /// `409 request-in-progress` answers.
    pub in_progress: AtomicU64,
    /// `409 outcome-unknown` answers.
    pub outcome_unknown: AtomicU64,
    /// `5xx` answers (and `408` / `429`, retried the same way).
    pub server_errors: AtomicU64,
    /// Connection refused, reset or closed before an answer.
    pub transport_errors: AtomicU64,
    /// Requests the client abandoned mid-flight (a short deadline).
    pub dropped: AtomicU64,
    /// Attempts sent as two concurrent copies.
    pub hedged: AtomicU64,
    /// Instances frozen with `SIGSTOP` past their lease, then resumed.
    pub pauses: AtomicU64,
    /// Clients thrown away and replaced (pool, connections and all).
    pub client_restarts: AtomicU64,
    /// Changed-payload reuses of an acknowledged key.
    pub probes: AtomicU64,
    /// Of those, refused with a `4xx` conflict.
    pub probes_refused: AtomicU64,
    /// `kill -9` of an instance.
    pub kills: AtomicU64,
    /// Rounds of `pg_terminate_backend` over the soak's sessions.
    pub severings: AtomicU64,
    /// Sessions terminated in those rounds.
    pub severed_sessions: AtomicU64,
    /// PostgreSQL stop/start cycles.
    pub pg_restarts: AtomicU64,
    /// PostgreSQL killed with `SIGKILL` and started again (crash recovery).
    pub pg_crashes: AtomicU64,
    /// Crash recoveries the server logs show (read at the end).
    pub crash_recoveries: AtomicU64,
    /// Primaries killed and standbys promoted.
    pub failovers: AtomicU64,
    /// Spells of added network latency.
    pub net_latency: AtomicU64,
    /// Network stalls (nothing forwarded for a while).
    pub net_stalls: AtomicU64,
    /// Rounds of connections cut by the proxies.
    pub net_cuts: AtomicU64,
    /// Connections cut in those rounds.
    pub net_cut_connections: AtomicU64,
    /// Network faults that hit one instance only (a partition), not every instance.
    pub net_one_instance: AtomicU64,
    /// PgBouncer killed with `SIGKILL` and started again (the `pgbouncer` topology).
    pub pgbouncer_kills: AtomicU64,
    /// Redis primaries killed with `SIGKILL`, their replica promoted and the killed node
    /// restarted as a replica (the `redis-cluster` topology).
    pub redis_kills: AtomicU64,
    /// The longest a killed primary's slots went unserved: from the kill until the cluster
    /// was healthy again with the replica promoted, in ms.
    pub redis_failover_ms_max: AtomicU64,
    /// Redis primaries stopped with `SIGSTOP`, then continued.
    pub redis_pauses: AtomicU64,
    /// Of those, paused past the node timeout: the replica took over and the paused node
    /// came back as a replica.
    pub redis_pause_promotions: AtomicU64,
    /// Slot migrations of a live account's slot to another primary.
    pub redis_migrations: AtomicU64,
    /// Keys those migrations moved.
    pub redis_migrated_keys: AtomicU64,
    /// Keys a migration found on both its source and its target (`BUSYKEY`): written on
    /// the target through `ASK` while the source held them, which only a script touching
    /// keys it does not declare can do.
    pub redis_keys_on_both_sides: std::sync::Mutex<Vec<String>>,
}

impl Stats {
    /// Adds one to `counter`.
    pub fn bump(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

/// What an intent asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `POST /v1/tickets`.
    Ticket,
    /// `POST /v1/payments`.
    Payment,
}

/// The first `2xx` seen for an intent.
#[derive(Debug, Clone)]
pub struct Ack {
    /// Status code.
    pub status: u16,
    /// Body bytes.
    pub body: Vec<u8>,
    /// `Operation-Id`.
    pub operation_id: Option<String>,
    /// The effect's id (`id` in the body).
    pub effect_id: Option<String>,
}

/// One intended action: one key, one marker, at most one effect.
#[derive(Debug, Clone)]
pub struct Intent {
    /// Ticket or payment.
    pub kind: Kind,
    /// The bearer account (the scope).
    pub account: String,
    /// The `Idempotency-Key`.
    pub key: String,
    /// The unique marker: the ticket's title or the payment's invoice reference.
    pub marker: String,
    /// The command's fields, in order.
    fields: Vec<(&'static str, Value)>,
    /// The changed command used to probe the key after acknowledgement.
    probe_fields: Vec<(&'static str, Value)>,
    /// The first `2xx`.
    pub ack: Option<Ack>,
    /// Answers that contradict the first acknowledgement or the contract (violations).
    pub contradictions: Vec<String>,
    /// The last answer was `409 outcome-unknown`: the client stops and leaves it to an
    /// operator.
    pub unknown: bool,
    /// Attempts sent.
    pub attempts: u32,
    /// `2xx` answers not marked `Idempotent-Replayed` (executions, as answered).
    pub originals: u32,
    /// Where the status route disagreed with the acknowledgement.
    pub status_disagreements: Vec<String>,
}

/// The marker of a probe's effect: any effect carrying it is a violation.
pub const PROBE_PREFIX: &str = "probe-";

impl Intent {
    /// A fresh intent; `run` names the soak, `client` and `n` the intent within it.
    pub fn new(rng: &mut Rng, run: &str, client: usize, n: u64, account: String) -> Self {
        let marker = format!("{run}-c{client}-i{n}");
        let key = format!("key-{marker}");
        if rng.chance(0.5) {
            let priority = ["low", "normal", "high"][rng.below(3) as usize];
            let mut fields = vec![
                ("project", json!("chaos")),
                ("title", json!(marker.clone())),
                ("priority", json!(priority)),
            ];
            if rng.chance(0.5) {
                fields.push((
                    "description",
                    json!(format!("soak intent {n} of client {client}")),
                ));
            }
            let mut probe_fields = fields.clone();
            probe_fields[1] = ("title", json!(format!("{PROBE_PREFIX}{marker}")));
            Self::with(Kind::Ticket, account, key, marker, fields, probe_fields)
        } else {
            // Below the demo's approval threshold (100000 minor units, the probe adds 1): a payment
            // that needs a person's approval never runs without one, and the soak has no approver.
            let amount = rng.between(1, 99_998);
            let currency = ["EUR", "USD", "CHF"][rng.below(3) as usize];
            let fields = vec![
                ("amount_minor", json!(amount)),
                ("currency", json!(currency)),
                ("invoice_ref", json!(marker.clone())),
                ("payee", json!("ACME Corp")),
            ];
            let probe_fields = vec![
                ("amount_minor", json!(amount + 1)),
                ("currency", json!(currency)),
                ("invoice_ref", json!(format!("{PROBE_PREFIX}{marker}"))),
                ("payee", json!("ACME Corp")),
            ];
            Self::with(Kind::Payment, account, key, marker, fields, probe_fields)
        }
    }

    fn with(
        kind: Kind,
        account: String,
        key: String,
        marker: String,
        fields: Vec<(&'static str, Value)>,
        probe_fields: Vec<(&'static str, Value)>,
    ) -> Self {
        Self {
            kind,
            account,
            key,
            marker,
            fields,
            probe_fields,
            ack: None,
            contradictions: Vec::new(),
            unknown: false,
            attempts: 0,
            originals: 0,
            status_disagreements: Vec::new(),
        }
    }

    fn path(&self) -> &'static str {
        match self.kind {
            Kind::Ticket => "/v1/tickets",
            Kind::Payment => "/v1/payments",
        }
    }

    /// Whether more attempts could still settle the intent.
    pub fn open(&self) -> bool {
        self.ack.is_none() && !self.unknown
    }
}

/// The same command spelled differently on different attempts (member order, whitespace),
/// as a client re-serializing it would: the fingerprint must not care.
fn spell(fields: &[(&'static str, Value)], rng: &mut Rng) -> String {
    let reversed = rng.chance(0.3);
    let spaced = rng.chance(0.3);
    let mut members: Vec<String> = fields
        .iter()
        .map(|(name, value)| {
            let sep = if spaced { ": " } else { ":" };
            format!("{}{sep}{}", json!(name), value)
        })
        .collect();
    if reversed {
        members.reverse();
    }
    let joined = members.join(if spaced { ",\n  " } else { "," });
    if spaced {
        format!("{{\n  {joined}\n}}")
    } else {
        format!("{{{joined}}}")
    }
}

/// How a client behaves; shared by all clients.
#[derive(Debug, Clone)]
pub struct Behaviour {
    /// Instance base URLs; each attempt picks one at random, like a load balancer.
    pub bases: Arc<Vec<String>>,
    /// Probability that an attempt is abandoned mid-flight.
    pub drop_rate: f64,
    /// Longest abandon deadline (the handler delay plus a little: faults land before and
    /// after the effect).
    pub drop_window: Duration,
    /// Probability that an acknowledged key is reused with a changed payload.
    pub probe_rate: f64,
    /// Probability that an attempt is sent twice at once, to two instances.
    pub hedge_rate: f64,
    /// Probability that a failed attempt is followed by a client restart.
    pub restart_rate: f64,
    /// Attempts per intent before the client gives up (it comes back in the settle phase).
    pub max_attempts: u32,
}

/// What one attempt does.
#[derive(Debug)]
struct Attempt {
    base: String,
    body: String,
    deadline: Option<Duration>,
}

/// What the client does after an answer.
#[derive(Debug)]
enum Step {
    Next,
    Pause(Duration),
    Stop,
}

/// One answer, classified.
#[derive(Debug)]
enum Answer {
    Success(Success),
    InProgress(Option<Duration>),
    Unknown,
    ServerError,
    Refused {
        status: u16,
        problem: String,
        body: String,
    },
    Dropped,
    Transport,
}

/// A `2xx` answer, as the client keeps it.
#[derive(Debug)]
struct Success {
    status: u16,
    body: Vec<u8>,
    operation_id: Option<String>,
    replayed: bool,
}

/// A reqwest client as a fresh client process would build it.
pub fn new_http() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .connect_timeout(Duration::from_secs(2))
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap_or_else(|_| reqwest::Client::new())
}

/// A client: its own randomness and its own reqwest client (replaced on restarts).
#[derive(Debug)]
pub struct Client {
    /// Its random stream.
    pub rng: Rng,
    http: reqwest::Client,
    behaviour: Behaviour,
    stats: Arc<Stats>,
}

impl Client {
    /// A client drawing from `rng`.
    pub fn new(rng: Rng, behaviour: Behaviour, stats: Arc<Stats>) -> Self {
        Self {
            rng,
            http: new_http(),
            behaviour,
            stats,
        }
    }

    /// Drives `intent` until acknowledged, unknown, or `max_attempts` attempts; `drops`
    /// says whether attempts may be abandoned or hedged on purpose (not in the settle phase).
    pub async fn drive(&mut self, intent: &mut Intent, max_attempts: u32, drops: bool) {
        let mut tries = 0;
        while intent.open() && tries < max_attempts {
            tries += 1;
            let first = self.plan(intent, drops);
            let answers = if drops && self.rng.chance(self.behaviour.hedge_rate) {
                // A hedged request: two copies at once, to two instances, as a client that
                // races a slow answer (or a double submit) would.
                Stats::bump(&self.stats.hedged);
                let second = self.plan(intent, drops);
                intent.attempts += 2;
                let (a, b) = tokio::join!(self.send(intent, first), self.send(intent, second));
                vec![a, b]
            } else {
                intent.attempts += 1;
                vec![self.send(intent, first).await]
            };
            let mut pause = None;
            for answer in answers {
                match self.handle(intent, answer, tries, drops) {
                    Step::Stop => return,
                    Step::Pause(p) => pause = Some(pause.map_or(p, |q: Duration| q.max(p))),
                    Step::Next => {}
                }
            }
            if intent.open()
                && let Some(pause) = pause
            {
                tokio::time::sleep(pause).await;
            }
        }
    }

    /// One attempt's choices: the instance, the spelling and whether it is abandoned.
    fn plan(&mut self, intent: &Intent, drops: bool) -> Attempt {
        let bases = &self.behaviour.bases;
        let base = bases[self.rng.below(bases.len() as u64) as usize].clone();
        let body = spell(&intent.fields, &mut self.rng);
        let deadline = (drops && self.rng.chance(self.behaviour.drop_rate)).then(|| {
            let window = self.behaviour.drop_window.as_millis() as u64;
            Duration::from_millis(self.rng.between(1, window.max(2)))
        });
        Attempt {
            base,
            body,
            deadline,
        }
    }

    fn handle(&mut self, intent: &mut Intent, answer: Answer, tries: u32, drops: bool) -> Step {
        match answer {
            Answer::Success(success) => {
                self.accept(intent, success);
                Step::Next
            }
            Answer::InProgress(retry_after) => {
                // Loosely: never longer than a second, never shorter than 50 ms.
                let hint = retry_after.unwrap_or(Duration::from_millis(200));
                let cap = hint.min(Duration::from_secs(1)).as_millis() as u64;
                Step::Pause(Duration::from_millis(self.rng.between(50, cap.max(50))))
            }
            Answer::Unknown => {
                intent.unknown = true;
                Step::Next
            }
            Answer::Refused {
                status,
                problem,
                body,
            } => {
                // The intent's own command was refused: with a unique invoice and a valid
                // body this can only mean a second execution was caught by the domain rule
                // (invoice-already-paid) or the key mixed up payloads.
                intent.contradictions.push(format!(
                    "attempt {} answered {status} {problem}: {body}",
                    intent.attempts
                ));
                Step::Stop
            }
            Answer::ServerError | Answer::Transport | Answer::Dropped => {
                if drops && self.rng.chance(self.behaviour.restart_rate) {
                    self.restart();
                }
                let exp = 50u64 << tries.min(5);
                Step::Pause(Duration::from_millis(
                    self.rng.between(exp / 2, exp.min(1500)),
                ))
            }
        }
    }

    /// Reuses an acknowledged intent's key with a changed payload: the answer must be a
    /// `4xx` conflict and nothing may execute.
    pub async fn probe(&mut self, intent: &mut Intent) {
        Stats::bump(&self.stats.probes);
        for _ in 0..5 {
            let mut attempt = self.plan(intent, false);
            attempt.body = spell(&intent.probe_fields, &mut self.rng);
            match self.send(intent, attempt).await {
                Answer::Refused { status, .. } if (400..500).contains(&status) => {
                    Stats::bump(&self.stats.probes_refused);
                    return;
                }
                Answer::Success(Success { status, body, .. }) => {
                    intent.contradictions.push(format!(
                        "a changed payload under the acknowledged key was answered {status}: {}",
                        String::from_utf8_lossy(&body)
                    ));
                    return;
                }
                // Any 409 refuses the request without running it; whether the effect
                // table stayed clean is checked from the database.
                Answer::InProgress(_) | Answer::Unknown => {
                    Stats::bump(&self.stats.probes_refused);
                    return;
                }
                Answer::Refused { .. }
                | Answer::ServerError
                | Answer::Transport
                | Answer::Dropped => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        }
    }

    /// Sends the acknowledged intent again: the answer must be the acknowledgement, byte for
    /// byte, marked as a replay. `false` when no answer came (the caller may retry).
    pub async fn verify_replay(&mut self, intent: &mut Intent) -> bool {
        let attempt = self.plan(intent, false);
        match self.send(intent, attempt).await {
            Answer::Success(success) => {
                if !success.replayed {
                    intent
                        .contradictions
                        .push("a final retry was not marked Idempotent-Replayed".to_owned());
                }
                self.accept(intent, success);
                true
            }
            Answer::Refused {
                status,
                problem,
                body,
            } => {
                intent
                    .contradictions
                    .push(format!("a final retry answered {status} {problem}: {body}"));
                true
            }
            Answer::Unknown | Answer::InProgress(_) => {
                intent.contradictions.push(
                    "a final retry of an acknowledged intent was not answered with its replay"
                        .to_owned(),
                );
                true
            }
            Answer::ServerError | Answer::Transport | Answer::Dropped => false,
        }
    }

    /// Reads the acknowledged operation from the status route: it must be `completed`,
    /// under the intent's key, with the acknowledged status. `false` when no answer came.
    pub async fn verify_status(&mut self, intent: &mut Intent) -> bool {
        let Some(ack) = &intent.ack else {
            return true;
        };
        let Some(operation_id) = &ack.operation_id else {
            intent
                .status_disagreements
                .push("the acknowledgement carried no Operation-Id".to_owned());
            return true;
        };
        let base =
            &self.behaviour.bases[self.rng.below(self.behaviour.bases.len() as u64) as usize];
        let reply = self
            .http
            .get(format!("{base}/operations/{operation_id}"))
            .bearer_auth(&intent.account)
            .send()
            .await;
        let Ok(reply) = reply else {
            return false;
        };
        let status = reply.status().as_u16();
        if status >= 500 {
            return false;
        }
        let document: Value = reply.json().await.unwrap_or(Value::Null);
        let agrees = status == 200
            && document["state"] == "completed"
            && document["idempotency_key"] == intent.key.as_str()
            && document["response_status"] == ack.status;
        if !agrees {
            intent.status_disagreements.push(format!(
                "GET /operations/{operation_id} answered {status} {document} for an acknowledged {}",
                ack.status
            ));
        }
        true
    }

    fn accept(&mut self, intent: &mut Intent, success: Success) {
        let Success {
            status,
            body,
            operation_id,
            replayed,
        } = success;
        match &intent.ack {
            None => {
                let effect_id = serde_json::from_slice::<Value>(&body)
                    .ok()
                    .and_then(|v| v["id"].as_str().map(str::to_owned));
                intent.ack = Some(Ack {
                    status,
                    body,
                    operation_id,
                    effect_id,
                });
            }
            Some(first) => {
                if first.status != status || first.body != body {
                    intent.contradictions.push(format!(
                        "a replay differed: first {} {}, later {status} {}",
                        first.status,
                        String::from_utf8_lossy(&first.body),
                        String::from_utf8_lossy(&body)
                    ));
                } else if first.operation_id != operation_id {
                    intent.contradictions.push(format!(
                        "a replay named another operation: {:?} then {operation_id:?}",
                        first.operation_id
                    ));
                }
            }
        }
        if !replayed {
            intent.originals += 1;
            // Hedged copies may answer in either order, so the original (not marked as a
            // replay) need not be the first 2xx seen; but there is only one.
            if intent.originals == 2 {
                intent
                    .contradictions
                    .push("two 2xx answers were not marked as replays".to_owned());
            }
        }
    }

    fn restart(&mut self) {
        Stats::bump(&self.stats.client_restarts);
        self.http = new_http();
    }

    async fn send(&self, intent: &Intent, attempt: Attempt) -> Answer {
        Stats::bump(&self.stats.attempts);
        let Attempt {
            base,
            body,
            deadline,
        } = attempt;
        let request = self
            .http
            .post(format!("{base}{}", intent.path()))
            .bearer_auth(&intent.account)
            .header(CONTENT_TYPE, "application/json")
            .header("idempotency-key", &intent.key)
            .body(body);
        let exchange = async {
            let response = request.send().await?;
            let status = response.status().as_u16();
            let headers = response.headers().clone();
            let body = response.bytes().await?.to_vec();
            Ok::<_, reqwest::Error>((status, headers, body))
        };
        let result = match deadline {
            Some(deadline) => match tokio::time::timeout(deadline, exchange).await {
                Ok(result) => result,
                Err(_) => {
                    Stats::bump(&self.stats.dropped);
                    return Answer::Dropped;
                }
            },
            None => exchange.await,
        };
        let Ok((status, headers, body)) = result else {
            Stats::bump(&self.stats.transport_errors);
            return Answer::Transport;
        };
        classify(&self.stats, status, &headers, body)
    }
}

fn classify(stats: &Stats, status: u16, headers: &HeaderMap, body: Vec<u8>) -> Answer {
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    if (200..300).contains(&status) {
        Stats::bump(&stats.answered_2xx);
        return Answer::Success(Success {
            status,
            body,
            operation_id: header("operation-id"),
            replayed: header("idempotent-replayed").as_deref() == Some("true"),
        });
    }
    if status >= 500 {
        Stats::bump(&stats.server_errors);
        return Answer::ServerError;
    }
    let problem = serde_json::from_slice::<Value>(&body)
        .ok()
        .and_then(|v| v["type"].as_str().map(str::to_owned))
        .unwrap_or_default();
    let slug = problem.rsplit('/').next().unwrap_or_default().to_owned();
    match (status, slug.as_str()) {
        (409, "request-in-progress") => {
            Stats::bump(&stats.in_progress);
            let retry_after = headers
                .get(RETRY_AFTER)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.trim().parse::<u64>().ok())
                .map(Duration::from_secs);
            Answer::InProgress(retry_after)
        }
        // A body that arrived too slowly (a frozen instance, a loaded machine) or a server
        // shedding load: nothing was stored, so the retry is the client's normal move.
        (408 | 429, _) => {
            Stats::bump(&stats.server_errors);
            Answer::ServerError
        }
        (409, "outcome-unknown") => {
            Stats::bump(&stats.outcome_unknown);
            Answer::Unknown
        }
        _ => Answer::Refused {
            status,
            problem: slug,
            body: String::from_utf8_lossy(&body).into_owned(),
        },
    }
}

/// Runs one client until `end`: intents one after another, each probed now and then once
/// acknowledged. Returns every intent it created.
pub async fn run(
    mut client: Client,
    index: usize,
    run: String,
    accounts: Arc<Vec<String>>,
    end: Instant,
) -> Vec<Intent> {
    let mut intents = Vec::new();
    let mut n = 0u64;
    while Instant::now() < end {
        n += 1;
        let account = accounts[client.rng.below(accounts.len() as u64) as usize].clone();
        let mut intent = Intent::new(&mut client.rng, &run, index, n, account);
        let max_attempts = client.behaviour.max_attempts;
        client.drive(&mut intent, max_attempts, true).await;
        if intent.ack.is_some() && client.rng.chance(client.behaviour.probe_rate) {
            client.probe(&mut intent).await;
        }
        intents.push(intent);
        // Think time, so that the clients do not march in lock step.
        let think = client.rng.between(0, 50);
        tokio::time::sleep(Duration::from_millis(think)).await;
    }
    intents
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_spelling_is_the_same_command() {
        let mut rng = Rng::new(42, 0);
        for n in 0..200 {
            let intent = Intent::new(&mut rng, "run", 0, n, "acct".to_owned());
            let meaning: Value = serde_json::from_str(&spell(&intent.fields, &mut rng)).unwrap();
            let mut spellings = std::collections::HashSet::new();
            for _ in 0..20 {
                let text = spell(&intent.fields, &mut rng);
                assert_eq!(
                    serde_json::from_str::<Value>(&text).unwrap(),
                    meaning,
                    "{text}"
                );
                spellings.insert(text);
            }
            assert!(spellings.len() > 1, "retries vary the spelling");
            let probe: Value =
                serde_json::from_str(&spell(&intent.probe_fields, &mut rng)).unwrap();
            assert_ne!(probe, meaning, "a probe changes the command");
        }
    }

    #[test]
    fn markers_and_keys_are_unique_per_intent() {
        let mut rng = Rng::new(7, 1);
        let intents: Vec<Intent> = (0..100)
            .map(|n| Intent::new(&mut rng, "run", 3, n, "acct".to_owned()))
            .collect();
        let markers: std::collections::HashSet<_> = intents.iter().map(|i| &i.marker).collect();
        let keys: std::collections::HashSet<_> = intents.iter().map(|i| &i.key).collect();
        assert_eq!(markers.len(), 100);
        assert_eq!(keys.len(), 100);
        assert!(intents.iter().any(|i| i.kind == Kind::Ticket));
        assert!(intents.iter().any(|i| i.kind == Kind::Payment));
        for intent in &intents {
            // Tickets never carry the natural key that would hide a second execution.
            assert!(
                intent
                    .fields
                    .iter()
                    .all(|(name, _)| *name != "source_event_id")
            );
        }
    }

    #[test]
    fn answers_are_classified_by_problem_type() {
        let stats = Stats::default();
        let problem = |slug: &str| {
            format!(r#"{{"type":"https://tower-idempotency.dev/problems/{slug}","status":409}}"#)
                .into_bytes()
        };
        let mut headers = HeaderMap::new();
        headers.insert(RETRY_AFTER, "2".parse().unwrap());
        assert!(matches!(
            classify(&stats, 409, &headers, problem("request-in-progress")),
            Answer::InProgress(Some(d)) if d == Duration::from_secs(2)
        ));
        assert!(matches!(
            classify(&stats, 409, &HeaderMap::new(), problem("outcome-unknown")),
            Answer::Unknown
        ));
        assert!(matches!(
            classify(
                &stats,
                409,
                &HeaderMap::new(),
                problem("fingerprint-mismatch")
            ),
            Answer::Refused { status: 409, .. }
        ));
        assert!(matches!(
            classify(&stats, 503, &HeaderMap::new(), problem("store-unavailable")),
            Answer::ServerError
        ));
        let mut replayed = HeaderMap::new();
        replayed.insert("idempotent-replayed", "true".parse().unwrap());
        assert!(matches!(
            classify(&stats, 201, &replayed, b"{}".to_vec()),
            Answer::Success(Success { replayed: true, .. })
        ));
    }
}
