//! The console's pages, rendered with maud: every interpolated value is HTML-escaped (keys,
//! summaries, reasons and principals come from agents and may carry markup), the one
//! stylesheet is inline and allowed by its hash, and no page carries a script.

use std::sync::LazyLock;
use std::time::SystemTime;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use maud::{DOCTYPE, Markup, PreEscaped, html};
use serde_json::Value;
use sha2::{Digest, Sha256};
use tower_idempotency_audit::{AuditEventKind, Correlation, SealedEvent};
use tower_idempotency_core::{Approval, ApprovalState, Operation, OperationState};

use super::journal::{EventCheck, Verification};

/// The stylesheet, inlined in every page.
const STYLE: &str = include_str!("style.css");

/// The CSP source allowing exactly [`STYLE`]: `'sha256-…'`.
pub(crate) static STYLE_HASH: LazyLock<String> =
    LazyLock::new(|| format!("'sha256-{}'", STANDARD.encode(Sha256::digest(STYLE))));

/// Who is looking, and where the console is mounted.
#[derive(Debug, Clone)]
pub(crate) struct Viewer {
    /// The scope's name (the account).
    pub(crate) scope: String,
    /// The principal (user).
    pub(crate) principal: String,
    /// Whether the principal may decide approvals.
    pub(crate) approver: bool,
    /// The console's prefix (no trailing slash).
    pub(crate) base: String,
}

/// A message shown above a page's content.
#[derive(Debug, Clone)]
pub(crate) struct Notice {
    pub(crate) class: &'static str,
    pub(crate) text: String,
}

impl Notice {
    pub(crate) fn error(text: impl Into<String>) -> Self {
        Self {
            class: "error",
            text: text.into(),
        }
    }
}

/// What the operation page shows of the audit journal.
#[derive(Debug)]
pub(crate) enum AuditView {
    /// The console has no journal.
    NotConfigured,
    /// The journal could not be read.
    Unavailable,
    /// The scope's events of the operation and their checks.
    Events(Vec<SealedEvent>, Verification),
}

pub(crate) fn layout(viewer: Option<&Viewer>, title: &str, content: Markup) -> Markup {
    let base = viewer.map_or("", |v| v.base.as_str());
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                meta name="referrer" content="same-origin";
                // No icon request (it would be a 404 outside the console's routes).
                link rel="icon" href="data:,";
                title { (title) " · console" }
                style { (PreEscaped(STYLE)) }
            }
            body {
                header {
                    nav aria-label="Console" {
                        a href={ (base) "/approvals" } { "Pending approvals" }
                        form.search method="get" action={ (base) "/operations" } role="search" {
                            label for="search-key" { "Idempotency key" }
                            input #search-key type="search" name="idempotency_key" required maxlength="255";
                            button type="submit" { "Find operation" }
                        }
                    }
                    @if let Some(viewer) = viewer {
                        p {
                            "Signed in as " strong { (viewer.principal) } " in account " strong { (viewer.scope) }
                            @if viewer.approver { " · approver" }
                        }
                    }
                }
                main { (content) }
            }
        }
    }
}

pub(crate) fn message(viewer: Option<&Viewer>, title: &str, text: &str) -> Markup {
    layout(viewer, title, html! { h1 { (title) } p { (text) } })
}

fn utc(at: SystemTime) -> String {
    let text = humantime::format_rfc3339_seconds(at).to_string();
    format!("{} UTC", text.trim_end_matches('Z').replacen('T', " ", 1))
}

fn age(at: SystemTime, now: SystemTime) -> String {
    let (span, past) = match now.duration_since(at) {
        Ok(span) => (span, true),
        Err(ahead) => (ahead.duration(), false),
    };
    let secs = span.as_secs();
    let amount = match secs {
        0..5 => return "just now".to_owned(),
        5..60 => format!("{secs} s"),
        60..3600 => format!("{} min", secs / 60),
        3600..86_400 => format!("{} h", secs / 3600),
        _ => format!("{} d", secs / 86_400),
    };
    if past {
        format!("{amount} ago")
    } else {
        format!("in {amount}")
    }
}

/// A time in UTC with its relative age.
fn when(at: SystemTime, now: SystemTime) -> Markup {
    html! {
        time datetime=(humantime::format_rfc3339_millis(at).to_string()) { (utc(at)) }
        " " span.muted { "(" (age(at, now)) ")" }
    }
}

fn maybe_when(at: Option<SystemTime>, now: SystemTime) -> Markup {
    match at {
        Some(at) => when(at, now),
        None => html! { span.muted { "—" } },
    }
}

/// A summary value as text: strings as they are, anything else as JSON.
fn text(value: &Value) -> String {
    value
        .as_str()
        .map_or_else(|| value.to_string(), str::to_owned)
}

/// The one-line description of an approval in a list.
fn headline(approval: &Approval) -> String {
    let summary = &approval.summary;
    let target = ["target", "title", "payee", "service"]
        .iter()
        .find_map(|name| summary.get(*name));
    match (summary.get("operation"), target) {
        (Some(operation), Some(target)) => format!("{}: {}", text(operation), text(target)),
        (Some(operation), None) => text(operation),
        _ => {
            let all = text(summary);
            match all.char_indices().nth(80) {
                Some((cut, _)) => format!("{}…", &all[..cut]),
                None => all,
            }
        }
    }
}

/// The summary as the route's policy built it, one row per member; an amount in minor
/// units is shown with its currency.
fn summary(value: &Value) -> Markup {
    let Some(members) = value.as_object() else {
        return html! { p { code { (text(value)) } } };
    };
    let currency = members.get("currency").map(text);
    html! {
        dl {
            @for (name, member) in members {
                dt { (name.replace('_', " ")) }
                dd {
                    @if let Some((units, unit_currency)) = amount(member) {
                        (units) " " span.muted { "(minor units of " (unit_currency) ")" }
                    } @else {
                        (text(member))
                    }
                    @if let (true, Some(currency)) = (name.ends_with("_minor"), &currency) {
                        " " span.muted { "(minor units of " (currency) ")" }
                    }
                }
            }
        }
    }
}

/// An `ApprovalSummary` amount field, `{"minor_units": N, "currency": "EUR"}`: its units and
/// currency, shown together so the approver never reads a bare number.
fn amount(value: &Value) -> Option<(i64, String)> {
    let members = value.as_object()?;
    if members.len() != 2 {
        return None;
    }
    Some((
        members.get("minor_units")?.as_i64()?,
        members.get("currency")?.as_str()?.to_owned(),
    ))
}

fn state_class(state: ApprovalState) -> &'static str {
    match state {
        ApprovalState::Approved => "ok",
        ApprovalState::Denied | ApprovalState::Expired => "bad",
        _ => "warn",
    }
}

pub(crate) fn approvals(viewer: &Viewer, list: &[Approval], now: SystemTime) -> Markup {
    let base = &viewer.base;
    layout(
        Some(viewer),
        "Pending approvals",
        html! {
            h1 { "Pending approvals" }
            @if list.is_empty() {
                p { "Nothing waits for a decision in account " (viewer.scope) "." }
            } @else {
                div.scroll {
                    table {
                        caption { (list.len()) " waiting for a decision, newest first" }
                        thead { tr {
                            th scope="col" { "Command" }
                            th scope="col" { "Requested by" }
                            th scope="col" { "Requested" }
                            th scope="col" { "Expires" }
                        } }
                        tbody {
                            @for approval in list {
                                tr {
                                    td { a href={ (base) "/approvals/" (approval.id) } { (headline(approval)) } }
                                    td { (approval.requested_by) }
                                    td { (when(approval.requested_at, now)) }
                                    td { (when(approval.expires_at, now)) }
                                }
                            }
                        }
                    }
                }
            }
        },
    )
}

/// What the approval page needs besides the approval.
#[derive(Debug)]
pub(crate) struct ApprovalContext<'a> {
    pub(crate) operation: Option<&'a Operation>,
    /// Commands refused under the same key because they differ (409).
    pub(crate) conflicts: usize,
    /// The CSRF token of the forms, when the viewer may decide.
    pub(crate) csrf: Option<String>,
    pub(crate) notice: Option<Notice>,
    pub(crate) now: SystemTime,
}

pub(crate) fn approval(
    viewer: &Viewer,
    approval: &Approval,
    context: &ApprovalContext<'_>,
) -> Markup {
    let base = &viewer.base;
    let now = context.now;
    let pending = approval.state == ApprovalState::Pending;
    let executed = context
        .operation
        .filter(|operation| operation.state != OperationState::AwaitingApproval);
    let title = format!("Approval: {}", headline(approval));
    layout(
        Some(viewer),
        &title,
        html! {
            h1 { (title) }
            @if let Some(notice) = &context.notice {
                div class={ "notice " (notice.class) } role="alert" { (notice.text) }
            }
            p { "State: " strong class=(state_class(approval.state)) { (approval.state.as_str()) }
                @if approval.used { " (used: the operation was started)" } }
            @if context.conflicts > 0 {
                div.notice.warn role="status" {
                    strong { "Conflict: " }
                    "a different command was sent under this key " (context.conflicts)
                    @if context.conflicts == 1 { " time" } @else { " times" }
                    " and refused (409). This approval can only authorize the command shown here, \
                     whose fingerprint is below."
                }
            }
            section aria-labelledby="command" {
                h2 #command { "The command" }
                (summary(&approval.summary))
            }
            section aria-labelledby="identity" {
                h2 #identity { "What is approved" }
                dl {
                    dt { "Fingerprint" } dd { code { (approval.fingerprint.as_str()) } }
                    dt { "Idempotency key" } dd { code { (approval.key.as_str()) } }
                    dt { "Operation" } dd { a.mono href={ (base) "/operations/" (approval.operation_id) } { (approval.operation_id) } }
                    dt { "Requested by" } dd { (approval.requested_by) }
                    dt { "Requested" } dd { (when(approval.requested_at, now)) }
                    dt { "Expires" } dd { (when(approval.expires_at, now)) }
                    @if let Some(by) = &approval.decided_by {
                        dt { "Decided by" } dd { (by) }
                        dt { "Decided" } dd { (maybe_when(approval.decided_at, now)) }
                    }
                    @if let Some(reason) = &approval.reason {
                        dt { "Reason" } dd { (reason) }
                    }
                }
            }
            @if let Some(operation) = executed {
                section aria-labelledby="execution" {
                    h2 #execution { "Its execution" }
                    p { "This command already has an execution; a retry is shown it, never a new prompt." }
                    (operation_facts(viewer, operation, now))
                }
            }
            @if pending {
                @match &context.csrf {
                    Some(token) => div.decide {
                        form.card method="post" action={ (base) "/approvals/" (approval.id) "/approve" } {
                            input type="hidden" name="csrf" value=(token);
                            input type="hidden" name="fingerprint" value=(approval.fingerprint.as_str());
                            p { "Approve exactly the command above, fingerprint " code { (short(approval.fingerprint.as_str())) } "." }
                            button #approve type="submit" { "Approve" }
                        }
                        form.card method="post" action={ (base) "/approvals/" (approval.id) "/deny" } {
                            input type="hidden" name="csrf" value=(token);
                            label for="reason" { "Reason for denying (the agent is told)" }
                            textarea #reason name="reason" rows="3" required maxlength="2000" {}
                            button #deny .deny type="submit" { "Deny" }
                        }
                    },
                    None => p.muted { "Only an approver of this account can decide." },
                }
            }
        },
    )
}

fn short(fingerprint: &str) -> String {
    let (algorithm, hex) = fingerprint.split_once(':').unwrap_or(("", fingerprint));
    let head: String = hex.chars().take(12).collect();
    format!("{algorithm}:{head}…")
}

/// The operation's identity and counters, as a definition list.
fn operation_facts(viewer: &Viewer, operation: &Operation, now: SystemTime) -> Markup {
    let base = &viewer.base;
    html! {
        dl {
            dt { "Operation" } dd { a.mono href={ (base) "/operations/" (operation.id) } { (operation.id) } }
            dt { "State" } dd { strong { (operation.state.as_str()) } }
            dt { "Call" } dd { code { (operation.method) " " (operation.route) } }
            dt { "Idempotency key" } dd { code { (operation.key.as_str()) } }
            dt { "Attempts" } dd { (operation.attempts) }
            dt { "Replays" } dd { (operation.replays) }
            dt { "Response status" } dd {
                @match &operation.response {
                    Some(response) => { (response.status) }
                    None => span.muted { "none yet" },
                }
            }
            dt { "Delivered" } dd {
                @if operation.delivered { "yes, " (maybe_when(operation.delivered_at, now)) }
                @else { "no" }
            }
        }
    }
}

pub(crate) fn operation(
    viewer: &Viewer,
    operation: &Operation,
    audit: &AuditView,
    now: SystemTime,
) -> Markup {
    let base = &viewer.base;
    let approval = operation.approval.as_deref();
    let authorized = approval
        .filter(|a| a.state == ApprovalState::Approved)
        .and_then(|a| a.decided_at);
    let title = format!("Operation {}", operation.id);
    layout(
        Some(viewer),
        &title,
        html! {
            h1 { "Operation " span.mono { (operation.id) } }
            (operation_facts(viewer, operation, now))
            section aria-labelledby="timeline" {
                h2 #timeline { "Timeline" }
                div.scroll { table {
                    thead { tr { th scope="col" { "Step" } th scope="col" { "When" } } }
                    tbody {
                        tr { th scope="row" { "Accepted" } td { (when(operation.created_at, now)) } }
                        @if approval.is_some() {
                            tr { th scope="row" { "Authorized" } td { (maybe_when(authorized, now)) } }
                        }
                        tr { th scope="row" { "Dispatched" } td { (maybe_when(operation.dispatched_at, now)) } }
                        tr { th scope="row" { "Completed" } td { (maybe_when(operation.completed_at, now)) } }
                        tr { th scope="row" { "Delivered" } td { (maybe_when(operation.delivered_at, now)) } }
                    }
                } }
            }
            section aria-labelledby="approval" {
                h2 #approval { "Approval" }
                @match approval {
                    Some(approval) => p {
                        a href={ (base) "/approvals/" (approval.id) } { (headline(approval)) }
                        ": " strong class=(state_class(approval.state)) { (approval.state.as_str()) }
                        @if let Some(by) = &approval.decided_by { " by " (by) }
                        @if let Some(reason) = &approval.reason { " — " (reason) }
                    },
                    None => p.muted { "This operation needed no approval." },
                }
            }
            section aria-labelledby="audit" {
                h2 #audit { "Audit events" }
                (audit_events(audit, now))
            }
        },
    )
}

fn audit_events(audit: &AuditView, now: SystemTime) -> Markup {
    match audit {
        AuditView::NotConfigured => html! { p.muted { "This service keeps no audit journal." } },
        AuditView::Unavailable => html! {
            div.notice.error role="alert" { "The audit journal cannot be read right now; try again later." }
        },
        AuditView::Events(events, _) if events.is_empty() => html! {
            p.muted { "No journaled event of this operation (yet)." }
        },
        AuditView::Events(events, verification) => html! {
            @match (&verification.checkpoint, verification.all_verified()) {
                (Some(checkpoint), true) => div.notice.ok #verification role="status" {
                    strong.ok { "Verified" } ": all " (events.len()) " events are proved in the signed checkpoint of "
                    code { (checkpoint.origin) } " at size " (checkpoint.size) "."
                },
                (Some(checkpoint), false) if verification.signature_ok => div.notice.warn #verification role="status" {
                    strong.warn { "Not verified" } ": some events are not (yet) proved in the newest signed checkpoint ("
                    code { (checkpoint.origin) } ", size " (checkpoint.size) "); checkpoints are signed every few seconds."
                },
                (Some(checkpoint), false) => div.notice.error #verification role="alert" {
                    strong.bad { "Verification failed" } ": the checkpoint of " code { (checkpoint.origin) }
                    " (size " (checkpoint.size) ") or its proofs do not verify with the journal's public key."
                },
                (None, _) => div.notice.warn #verification role="status" {
                    strong.warn { "Not verified" } ": no signed checkpoint covers these events yet; checkpoints are signed every few seconds."
                },
            }
            div.scroll { table #events {
                caption { "In journal order" }
                thead { tr {
                    th scope="col" { "#" } th scope="col" { "Event" } th scope="col" { "When" }
                    th scope="col" { "Details" } th scope="col" { "Hash" } th scope="col" { "Proof" }
                } }
                tbody {
                    @for (event, check) in events.iter().zip(&verification.checks) {
                        tr {
                            td { (event.seq) }
                            td { strong { (event.event.kind.name()) } }
                            td { (when(event.event.time, now)) }
                            td { (details(event)) }
                            td { code { (event.hash.to_base64()) } }
                            td { @match check {
                                EventCheck::Verified => span.ok { "verified" },
                                EventCheck::Unsigned => span.warn { "not signed yet" },
                                EventCheck::Failed(why) => span.bad { "failed: " (why) },
                            } }
                        }
                    }
                }
            } }
        },
    }
}

fn correlation(correlation: Option<&Correlation>) -> Markup {
    match correlation {
        Some(Correlation::Http { method, route }) => {
            html! { "HTTP " code { (method) " " (route) } }
        }
        Some(Correlation::Mcp {
            tool,
            jsonrpc_id,
            session,
        }) => html! {
            "MCP tool " code { (tool) } ", JSON-RPC id " code { (jsonrpc_id) }
            @if let Some(session) = session { ", session " code { (session) } }
        },
        Some(_) | None => html! {},
    }
}

/// What an event says beyond its kind: who, how it arrived, what it decided.
fn details(event: &SealedEvent) -> Markup {
    let explanation = match &event.event.kind {
        AuditEventKind::Replayed { .. } => "a retry received the stored result (no new execution)",
        AuditEventKind::Attached { .. } => "a retry attached to this execution (no new execution)",
        AuditEventKind::Conflict { .. } => "a different command under the same key was refused",
        AuditEventKind::RefusedInProgress { .. } => "a retry was refused while this execution ran",
        AuditEventKind::Unknown => "the lease ran out after dispatch: the outcome is unknown",
        _ => "",
    };
    let by = match &event.event.kind {
        AuditEventKind::ApprovalApproved { approver }
        | AuditEventKind::ApprovalDenied { approver } => Some(approver.as_str()),
        AuditEventKind::Resolved { operator, .. } => Some(operator.as_str()),
        _ => event.event.principal.as_deref(),
    };
    html! {
        (correlation(event.event.kind.correlation()))
        @if let AuditEventKind::Completed { status } = &event.event.kind { "status " (status) }
        @if let AuditEventKind::Resolved { reason, .. } = &event.event.kind { "reason: " (reason) }
        @if !explanation.is_empty() { " " span.muted { (explanation) } }
        @if let Some(by) = by { " by " (by) }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn ages_read_naturally() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        assert_eq!(age(now - Duration::from_secs(1), now), "just now");
        assert_eq!(age(now - Duration::from_secs(5), now), "5 s ago");
        assert_eq!(age(now - Duration::from_secs(600), now), "10 min ago");
        assert_eq!(age(now + Duration::from_secs(7200), now), "in 2 h");
        assert_eq!(age(now - Duration::from_secs(3 * 86_400), now), "3 d ago");
        assert_eq!(utc(SystemTime::UNIX_EPOCH), "1970-01-01 00:00:00 UTC");
    }
}
