//! The verdict of a soak: what the database and the API hold, set against what the clients
//! were told.
//!
//! Every effect carries its intent's unique marker, so effects are counted per intent. The
//! violations: an intent with two effects (a duplicate execution), an acknowledged intent
//! with no effect or with another effect than the one its answer named (a lost or invented
//! acknowledgement), an answer that contradicts the first acknowledgement (a differing
//! replay, a refusal of the intent's own command), an effect of a changed-payload reuse, a
//! ticket without exactly one notification or a notification without its ticket, and API
//! listings that disagree with the tables. An intent never acknowledged may have 0 or 1
//! effect: its client cannot know, and that is what the status route is for.
//!
//! With the idempotency records in Redis ([`check_instances`]) the demo keeps its business
//! records in each instance's memory: the effects are then read from every instance's
//! listings and judged the same way.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio_postgres::NoTls;

use crate::client::{Intent, Kind, PROBE_PREFIX};

/// What was found.
#[derive(Debug, Default)]
pub struct Findings {
    /// Effects that belong to an intent of this run.
    pub effects: u64,
    /// Ticket effects.
    pub tickets: u64,
    /// Payment effects.
    pub payments: u64,
    /// Extra effects beyond the first, summed over intents.
    pub duplicates: u64,
    /// Acknowledged intents without their effect.
    pub ack_missing: u64,
    /// Intents whose answers contradicted their first acknowledgement or the contract.
    pub differing: u64,
    /// Effects of changed-payload reuses.
    pub probe_effects: u64,
    /// Notifications delivered for this run's tickets.
    pub notifications: u64,
    /// Deliveries of a notification beyond its first (at-least-once delivery, absorbed by
    /// the sink's effect id): information, not a violation.
    pub redeliveries: i64,
    /// Tickets without exactly one notification, plus notifications without a ticket.
    pub notification_mismatches: u64,
    /// Unacknowledged intents with an effect (the request ran, the answer was lost).
    pub unacked_with_effect: u64,
    /// Idempotency records by state.
    pub records: BTreeMap<String, i64>,
    /// Operations executed again after their lease lapsed (a take-over: `attempts > 1`).
    pub taken_over: i64,
    /// Replays the store counted.
    pub replays: i64,
    /// Outbox rows by state.
    pub outbox: BTreeMap<String, i64>,
    /// Acknowledged intents whose status-route record disagrees with the acknowledgement.
    pub status_disagreements: u64,
    /// Disagreements between the API's listings and the tables.
    pub api_mismatches: u64,
    /// One line per violation, for the log.
    pub violations: Vec<String>,
}

async fn connect(url: &str) -> Result<tokio_postgres::Client, String> {
    let (client, connection) = tokio_postgres::connect(url, NoTls)
        .await
        .map_err(|e| format!("cannot connect to the soak database: {e}"))?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(client)
}

/// Waits until the outbox has no pending row (the dispatchers delivered every
/// notification), or `deadline` passes.
pub async fn drain_outbox(url: &str, deadline: Duration) -> Result<(), String> {
    let client = connect(url).await?;
    let started = Instant::now();
    loop {
        let pending: i64 = client
            .query_one(
                "SELECT count(*) FROM idempotency_outbox WHERE state = 'pending'",
                &[],
            )
            .await
            .map_err(|e| e.to_string())?
            .get(0);
        if pending == 0 || started.elapsed() > deadline {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// The effects `sql` lists as `(account, id, marker)` rows, grouped by marker: marker ->
/// `[(account, id)]`, only for the markers `ours` accepts.
async fn effects(
    client: &tokio_postgres::Client,
    sql: &str,
    ours: impl Fn(&str) -> bool,
) -> Result<HashMap<String, Vec<(String, String)>>, String> {
    let mut effects: HashMap<String, Vec<(String, String)>> = HashMap::new();
    for row in client.query(sql, &[]).await.map_err(|e| e.to_string())? {
        let marker: String = row.get(2);
        if ours(&marker) {
            effects
                .entry(marker)
                .or_default()
                .push((row.get(0), row.get(1)));
        }
    }
    Ok(effects)
}

/// Counts effects per intent and checks every invariant.
pub async fn check(
    url: &str,
    run: &str,
    intents: &[Intent],
    base: &str,
    accounts: &[String],
) -> Result<Findings, String> {
    let client = connect(url).await?;
    let mut found = Findings::default();
    let ours = |marker: &str| marker.starts_with(run) || marker.starts_with(PROBE_PREFIX);

    let ticket_effects = effects(
        &client,
        "SELECT account, id, title FROM demo_tickets WHERE project = 'chaos'",
        ours,
    )
    .await?;
    let payment_effects = effects(
        &client,
        "SELECT account, id, invoice_ref FROM demo_payments",
        ours,
    )
    .await?;

    let ticket_ids = judge(&mut found, intents, &ticket_effects, &payment_effects);

    // Notifications: exactly one per ticket, none without a ticket.
    let mut per_ticket: HashMap<String, u64> = HashMap::new();
    for row in client
        .query(
            "SELECT n.ticket_id FROM demo_notifications n \
             LEFT JOIN demo_tickets t ON t.id = n.ticket_id \
             WHERE t.project = 'chaos' OR t.id IS NULL",
            &[],
        )
        .await
        .map_err(|e| e.to_string())?
    {
        let ticket_id: String = row.get(0);
        *per_ticket.entry(ticket_id).or_default() += 1;
    }
    judge_notifications(&mut found, &ticket_ids, &per_ticket);

    for (table, target) in [
        ("idempotency_operations", &mut found.records),
        ("idempotency_outbox", &mut found.outbox),
    ] {
        for row in client
            .query(
                &format!("SELECT state::text, count(*) FROM {table} GROUP BY state ORDER BY 1"),
                &[],
            )
            .await
            .map_err(|e| e.to_string())?
        {
            target.insert(row.get(0), row.get(1));
        }
    }

    let row = client
        .query_one(
            "SELECT count(*) FILTER (WHERE attempts > 1), coalesce(sum(replays), 0)::bigint \
             FROM idempotency_operations",
            &[],
        )
        .await
        .map_err(|e| e.to_string())?;
    found.taken_over = row.get(0);
    found.replays = row.get(1);
    found.redeliveries = client
        .query_one(
            "SELECT coalesce(sum(attempts - 1), 0)::bigint FROM demo_notifications",
            &[],
        )
        .await
        .map_err(|e| e.to_string())?
        .get(0);

    check_api(
        &mut found,
        base,
        accounts,
        run,
        &ticket_effects,
        &payment_effects,
    )
    .await?;
    Ok(found)
}

/// The verdict of a soak whose business records live in the instances' memory (the
/// `redis-cluster` topology: the idempotency records are in Redis, the demo keeps tickets,
/// payments and notifications in its process). The effects are read from every instance's
/// listings, per account, and judged like the tables' rows: an intent with effects on two
/// instances executed twice. The instances must not have been restarted (a restart empties
/// its memory), which that topology's faults respect.
pub async fn check_instances(
    run: &str,
    intents: &[Intent],
    bases: &[String],
    accounts: &[String],
) -> Result<Findings, String> {
    let mut found = Findings::default();
    let ours = |marker: &str| marker.starts_with(run) || marker.starts_with(PROBE_PREFIX);
    let mut tickets: HashMap<String, Vec<(String, String)>> = HashMap::new();
    let mut payments: HashMap<String, Vec<(String, String)>> = HashMap::new();
    let mut per_ticket: HashMap<String, u64> = HashMap::new();
    let http = crate::client::new_http();
    for base in bases {
        for account in accounts {
            for (path, list, marker_field) in [
                ("/v1/tickets", "tickets", "title"),
                ("/v1/payments", "payments", "invoice_ref"),
            ] {
                let json = listing(&http, base, path, account).await?;
                let target = if list == "tickets" {
                    &mut tickets
                } else {
                    &mut payments
                };
                for item in json[list].as_array().map_or(&[][..], Vec::as_slice) {
                    let marker = item[marker_field].as_str().unwrap_or_default();
                    if ours(marker) {
                        let id = item["id"].as_str().unwrap_or_default().to_owned();
                        target
                            .entry(marker.to_owned())
                            .or_default()
                            .push((account.clone(), id));
                    }
                }
            }
            let json = listing(&http, base, "/v1/notifications", account).await?;
            for item in json["notifications"]
                .as_array()
                .map_or(&[][..], Vec::as_slice)
            {
                let ticket_id = item["ticket_id"].as_str().unwrap_or_default().to_owned();
                *per_ticket.entry(ticket_id).or_default() += 1;
            }
        }
    }
    let ticket_ids = judge(&mut found, intents, &tickets, &payments);
    // Notifications of other runs' tickets cannot be here: the accounts are this run's.
    judge_notifications(&mut found, &ticket_ids, &per_ticket);
    Ok(found)
}

/// `GET base+path` for `account`, retried for a while; the JSON body.
async fn listing(
    http: &reqwest::Client,
    base: &str,
    path: &str,
    account: &str,
) -> Result<Value, String> {
    for _ in 0..10 {
        let reply = http
            .get(format!("{base}{path}"))
            .bearer_auth(account)
            .send()
            .await;
        if let Ok(reply) = reply
            && reply.status().is_success()
            && let Ok(json) = reply.json::<Value>().await
        {
            return Ok(json);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    Err(format!("GET {base}{path} never answered 200"))
}

/// Effects per intent against what the clients were told: duplicates, lost or invented
/// acknowledgements, effects of changed-payload reuses, status-route disagreements and
/// contradicting answers. `tickets` and `payments` map an effect's marker to its
/// `(account, id)` rows. Returns the ids of the run's tickets (for the notification check).
fn judge(
    found: &mut Findings,
    intents: &[Intent],
    ticket_effects: &HashMap<String, Vec<(String, String)>>,
    payment_effects: &HashMap<String, Vec<(String, String)>>,
) -> HashSet<String> {
    let mut ticket_ids: HashSet<String> = HashSet::new();
    for (marker, effects) in ticket_effects.iter().chain(payment_effects.iter()) {
        if marker.starts_with(PROBE_PREFIX) {
            if ticket_effects.contains_key(marker) {
                // Counted as a violation here; its notification is not a second one.
                ticket_ids.extend(effects.iter().map(|(_, id)| id.clone()));
            }
            found.probe_effects += effects.len() as u64;
            found.violations.push(format!(
                "{marker}: a changed payload under an acknowledged key executed ({effects:?})"
            ));
        }
    }

    for intent in intents {
        let table = match intent.kind {
            Kind::Ticket => &ticket_effects,
            Kind::Payment => &payment_effects,
        };
        let effects = table.get(&intent.marker).map_or(&[][..], Vec::as_slice);
        found.effects += effects.len() as u64;
        match intent.kind {
            Kind::Ticket => {
                found.tickets += effects.len() as u64;
                ticket_ids.extend(effects.iter().map(|(_, id)| id.clone()));
            }
            Kind::Payment => found.payments += effects.len() as u64,
        }
        if effects.len() > 1 {
            found.duplicates += effects.len() as u64 - 1;
            found.violations.push(format!(
                "{}: {} effects for one intent: {effects:?} (key {}, {} attempts)",
                intent.marker,
                effects.len(),
                intent.key,
                intent.attempts
            ));
        }
        if let Some((account, _)) = effects.iter().find(|(a, _)| *a != intent.account) {
            found.violations.push(format!(
                "{}: effect written for account {account}, the intent's is {}",
                intent.marker, intent.account
            ));
        }
        match &intent.ack {
            Some(ack) => {
                let named = ack.effect_id.as_deref();
                if effects.is_empty() {
                    found.ack_missing += 1;
                    found.violations.push(format!(
                        "{}: acknowledged ({} {}) but no effect exists",
                        intent.marker,
                        ack.status,
                        String::from_utf8_lossy(&ack.body)
                    ));
                } else if !effects.iter().any(|(_, id)| Some(id.as_str()) == named) {
                    found.ack_missing += 1;
                    found.violations.push(format!(
                        "{}: acknowledged effect {named:?} is not in the database (found {effects:?})",
                        intent.marker
                    ));
                }
            }
            None if !effects.is_empty() => found.unacked_with_effect += 1,
            None => {}
        }
        if !intent.status_disagreements.is_empty() {
            found.status_disagreements += 1;
            for disagreement in &intent.status_disagreements {
                found
                    .violations
                    .push(format!("{}: {disagreement}", intent.marker));
            }
        }
        if !intent.contradictions.is_empty() {
            found.differing += 1;
            for contradiction in &intent.contradictions {
                found.violations.push(format!(
                    "{} (key {}): {contradiction}",
                    intent.marker, intent.key
                ));
            }
        }
    }
    ticket_ids
}

/// Exactly one notification per ticket of the run, none without its ticket.
/// `per_ticket` counts the notifications found per ticket id.
fn judge_notifications(
    found: &mut Findings,
    ticket_ids: &HashSet<String>,
    per_ticket: &HashMap<String, u64>,
) {
    for (ticket_id, count) in per_ticket {
        if ticket_ids.contains(ticket_id) {
            found.notifications += count;
            if *count != 1 {
                found.notification_mismatches += 1;
                found
                    .violations
                    .push(format!("ticket {ticket_id}: {count} notifications"));
            }
        } else {
            found.notification_mismatches += 1;
            found.violations.push(format!(
                "notification for ticket {ticket_id}, which does not exist (a rolled-back effect escaped)"
            ));
        }
    }
    for ticket_id in ticket_ids {
        if !per_ticket.contains_key(ticket_id) {
            found.notification_mismatches += 1;
            found
                .violations
                .push(format!("ticket {ticket_id}: no notification delivered"));
        }
    }
}

/// The API lists, per account, exactly the run's effects the tables hold.
async fn check_api(
    found: &mut Findings,
    base: &str,
    accounts: &[String],
    run: &str,
    tickets: &HashMap<String, Vec<(String, String)>>,
    payments: &HashMap<String, Vec<(String, String)>>,
) -> Result<(), String> {
    let http = crate::client::new_http();
    for account in accounts {
        for (path, list, marker_field, table) in [
            ("/v1/tickets", "tickets", "title", tickets),
            ("/v1/payments", "payments", "invoice_ref", payments),
        ] {
            let mut listed: Vec<String> = Vec::new();
            let mut fetched = None;
            for _ in 0..10 {
                let reply = http
                    .get(format!("{base}{path}"))
                    .bearer_auth(account)
                    .send()
                    .await;
                if let Ok(reply) = reply
                    && reply.status().is_success()
                    && let Ok(json) = reply.json::<Value>().await
                {
                    fetched = Some(json);
                    break;
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            let json = fetched.ok_or(format!("GET {path} never answered 200"))?;
            for item in json[list].as_array().map_or(&[][..], Vec::as_slice) {
                let marker = item[marker_field].as_str().unwrap_or_default();
                if marker.starts_with(run) || marker.starts_with(PROBE_PREFIX) {
                    listed.push(item["id"].as_str().unwrap_or_default().to_owned());
                }
            }
            let mut stored: Vec<String> = table
                .values()
                .flatten()
                .filter(|(a, _)| a == account)
                .map(|(_, id)| id.clone())
                .collect();
            listed.sort();
            stored.sort();
            if listed != stored {
                found.api_mismatches += 1;
                found.violations.push(format!(
                    "GET {path} for {account} lists {} of the run's effects, the table holds {}",
                    listed.len(),
                    stored.len()
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use axum::Json;
    use axum::routing::get;
    use serde_json::json;

    use super::*;
    use crate::client::Ack;
    use crate::rng::Rng;

    /// `(marker, id)` pairs an instance lists.
    type Listed = Vec<(String, String)>;

    /// An instance that lists `tickets` and `payments`, with one notification per ticket.
    async fn instance(tickets: Listed, payments: Listed) -> String {
        let notifications: Vec<Value> = tickets
            .iter()
            .map(|(_, id)| json!({"effect_id": "e", "ticket_id": id, "attempts": 1}))
            .collect();
        let tickets: Vec<Value> = tickets
            .into_iter()
            .map(|(marker, id)| json!({"id": id, "title": marker}))
            .collect();
        let payments: Vec<Value> = payments
            .into_iter()
            .map(|(marker, id)| json!({"id": id, "invoice_ref": marker}))
            .collect();
        let router = axum::Router::new()
            .route(
                "/v1/tickets",
                get(move || async move { Json(json!({"tickets": tickets})) }),
            )
            .route(
                "/v1/payments",
                get(move || async move { Json(json!({"payments": payments})) }),
            )
            .route(
                "/v1/notifications",
                get(move || async move { Json(json!({"notifications": notifications})) }),
            );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, router).await });
        base
    }

    fn acknowledged(n: u64, effect_id: &str) -> Intent {
        let mut intent = Intent::new(&mut Rng::new(n, n), "run", 0, n, "acct".to_owned());
        intent.ack = Some(Ack {
            status: 201,
            body: Vec::new(),
            operation_id: None,
            effect_id: Some(effect_id.to_owned()),
        });
        intent
    }

    fn listed(intent: &Intent, id: &str) -> (Listed, Listed) {
        let effect = vec![(intent.marker.clone(), id.to_owned())];
        match intent.kind {
            Kind::Ticket => (effect, Vec::new()),
            Kind::Payment => (Vec::new(), effect),
        }
    }

    #[tokio::test]
    async fn effects_on_two_instances_are_a_duplicate_and_an_acknowledgement_found_nowhere_is_lost()
    {
        let once = acknowledged(1, "id-once");
        let twice = acknowledged(2, "id-twice");
        let lost = acknowledged(3, "id-lost");
        let (mut tickets_a, mut payments_a) = listed(&once, "id-once");
        let (tickets, payments) = listed(&twice, "id-twice");
        tickets_a.extend(tickets);
        payments_a.extend(payments);
        // The second instance executed `twice` again.
        let (tickets_b, payments_b) = listed(&twice, "id-again");
        let bases = vec![
            instance(tickets_a, payments_a).await,
            instance(tickets_b, payments_b).await,
        ];

        let found = check_instances("run", &[once, twice, lost], &bases, &["acct".to_owned()])
            .await
            .unwrap();

        assert_eq!(found.effects, 3);
        assert_eq!(found.duplicates, 1, "{:?}", found.violations);
        assert_eq!(found.ack_missing, 1, "{:?}", found.violations);
        assert_eq!(found.notification_mismatches, 0);
        assert_eq!(found.notifications, found.tickets);
        assert_eq!(found.violations.len(), 2);
    }
}
