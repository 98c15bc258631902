//! The layer's HTTP surface as OpenAPI 3.1 fragments, for merging into your own document.
//!
//! The layer adds a request header, response headers and problem answers to your write
//! operations, and generates routes of its own (status, approvals). This module describes
//! them as plain [`serde_json::Value`]s, built from the layer's configuration (its key
//! header name, problem base, status and approvals paths, route policies) and from the one
//! table of problem types, [`ProblemType::ALL`]:
//!
//! - [`components`]: `headers` (`Operation-Id`, `Idempotent-Replayed`, `Retry-After`),
//!   `parameters` (the key header, required and optional), `schemas` (the RFC 9457
//!   `Problem`, one schema per problem type with its `type` URI, status and members, the
//!   operation record, the approval);
//! - [`paths`]: the path items of the status routes and the approvals routes;
//! - [`decorate_operation`]: adds the key parameter (required or optional, as the route's
//!   policy says), the replay headers and the problem answers the policy can give to one of
//!   your operations;
//! - [`merge_into`]: all three at once into a whole document, decorating every operation
//!   whose method the layer guards.
//!
//! ```
//! use serde_json::json;
//! use tower_idempotency::{IdempotencyLayer, MemoryStore, openapi};
//!
//! let layer = IdempotencyLayer::new(MemoryStore::default());
//! let mut document = json!({
//!     "openapi": "3.1.0",
//!     "info": {"title": "Payments", "version": "1"},
//!     "paths": {"/v1/payments": {"post": {"responses": {"201": {"description": "Created"}}}}},
//! });
//! openapi::merge_into(&layer, &mut document);
//! let post = &document["paths"]["/v1/payments"]["post"];
//! assert_eq!(post["parameters"][0]["$ref"], "#/components/parameters/IdempotencyKey");
//! assert!(post["responses"]["409"].is_object());
//! assert!(document["paths"]["/operations/{operation_id}"]["get"].is_object());
//! assert!(document["components"]["schemas"]["Problem-fingerprint-mismatch"].is_object());
//! ```
//!
//! There is no `utoipa` integration behind a feature: utoipa's `OpenApi` serializes to and
//! from this same JSON, so `serde_json::to_value(api)`, [`merge_into`] and
//! `serde_json::from_value` merge these fragments without tying the crate to utoipa's
//! release cycle.

use std::collections::BTreeMap;

use http::Method;
use serde_json::{Map, Value, json};

use crate::config::Shared;
use crate::layer::IdempotencyLayer;
use crate::policy::{KeyRequirement, RoutePolicy};
use crate::problem::ProblemType;

/// The name of the key parameter when the route requires it (under
/// `#/components/parameters/`).
pub const KEY_PARAMETER: &str = "IdempotencyKey";
/// The name of the key parameter when the route makes it optional.
pub const OPTIONAL_KEY_PARAMETER: &str = "IdempotencyKeyOptional";
/// The name of the base RFC 9457 schema (under `#/components/schemas/`); each problem type
/// has its own schema, `Problem-{slug}`.
pub const PROBLEM_SCHEMA: &str = "Problem";

/// The key header's format: a bare token of 1–255 visible ASCII characters, or an RFC 8941
/// sf-string whose content is (with `\"` and `\\` escapes).
const KEY_PATTERN: &str = r#"^(?:[!#-~][!-~]{0,254}|"(?:[!#-\[\]-~]|\\["\\]){1,255}")$"#;

/// The name of the schema of one problem type.
pub fn problem_schema_name(slug: &str) -> String {
    format!("{PROBLEM_SCHEMA}-{slug}")
}

fn schema_ref(name: &str) -> Value {
    json!({ "$ref": format!("#/components/schemas/{name}") })
}

fn header_ref(name: &str) -> Value {
    json!({ "$ref": format!("#/components/headers/{name}") })
}

/// The schema of a problem's extension member.
fn member_schema(name: &str) -> Value {
    match name {
        "operation_id" => {
            json!({"type": "string", "format": "uuid", "description": "The operation."})
        }
        "status_url" => json!({"type": "string", "format": "uri-reference",
            "description": "The operation's status route."}),
        "state" => json!({"type": "string", "description": "The operation's or approval's state."}),
        "reason" => json!({"type": ["string", "null"],
            "description": "Why: the JSON error's code, or the denial's reason."}),
        "original_status" => json!({"type": ["integer", "null"],
            "description": "The original response's status, when known."}),
        "approval_id" => {
            json!({"type": "string", "format": "uuid", "description": "The approval."})
        }
        "approval_url" => json!({"type": "string", "format": "uri-reference",
            "description": "Where the approval is read and decided."}),
        "expires_at" | "decided_at" => json!({"type": ["string", "null"], "format": "date-time"}),
        "summary" => json!({"description": "What the approver is shown of the command."}),
        "fingerprint" => json!({"type": "string",
            "description": "The fingerprint the approver must confirm."}),
        _ => json!({}),
    }
}

/// The schema of one problem type under the layer's problem base.
fn problem_type_schema(shared: &Shared, problem: &ProblemType) -> Value {
    let mut properties = Map::new();
    properties.insert(
        "type".into(),
        json!({"const": shared.problem_base.type_uri(problem.slug)}),
    );
    properties.insert("title".into(), json!({"const": problem.title}));
    properties.insert("status".into(), json!({"const": problem.status.as_u16()}));
    for member in problem.members {
        properties.insert((*member).into(), member_schema(member));
    }
    json!({
        "title": problem.slug,
        "description": format!("`{}` {}: {}", problem.status.as_u16(), problem.slug, problem.title),
        "allOf": [schema_ref(PROBLEM_SCHEMA)],
        "type": "object",
        "properties": properties,
        "required": ["type", "title", "status"],
    })
}

/// The `components` of the layer: `headers`, `parameters` and `schemas`.
pub fn components(layer: &IdempotencyLayer) -> Value {
    let shared = layer.shared();
    // Header names are case-insensitive; the default is shown as the drafts spell it.
    let header = if shared.header_name == crate::IDEMPOTENCY_KEY {
        "Idempotency-Key"
    } else {
        shared.header_name.as_str()
    };
    let key = |required: bool| {
        json!({
            "name": header,
            "in": "header",
            "required": required,
            "description": "Names one intended action: a retry with the same key gets the \
                original answer instead of a second execution. 1–255 visible ASCII \
                characters, bare or as an RFC 8941 sf-string (`\"…\"`); anything else is \
                `400 invalid-idempotency-key`.",
            "schema": {"type": "string", "minLength": 1, "maxLength": 512, "pattern": KEY_PATTERN},
        })
    };
    let mut schemas = Map::new();
    schemas.insert(
        PROBLEM_SCHEMA.into(),
        json!({
            "description": "An RFC 9457 problem (`application/problem+json`).",
            "type": "object",
            "properties": {
                "type": {"type": "string", "format": "uri-reference"},
                "title": {"type": "string"},
                "status": {"type": "integer", "minimum": 100, "maximum": 599},
                "detail": {"type": "string"},
                "instance": {"type": "string", "format": "uri-reference"},
            },
            "required": ["type", "title", "status"],
        }),
    );
    for problem in ProblemType::ALL {
        schemas.insert(
            problem_schema_name(problem.slug),
            problem_type_schema(shared, &problem),
        );
    }
    let time = json!({"type": ["string", "null"], "format": "date-time"});
    schemas.insert(
        "IdempotencyOperation".into(),
        json!({
            "description": "An operation record, as the status routes show it.",
            "type": "object",
            "properties": {
                "operation_id": {"type": "string", "format": "uuid"},
                "idempotency_key": {"type": "string"},
                "state": {"type": "string", "enum": ["in_progress", "awaiting_approval", "completed", "unknown"]},
                "method": {"type": "string"},
                "route": {"type": "string"},
                "created_at": {"type": "string", "format": "date-time"},
                "dispatched_at": time, "completed_at": time, "lease_expires_at": time,
                "expires_at": time, "delivered_at": time,
                "response_status": {"type": ["integer", "null"]},
                "response_stored": {"type": ["boolean", "null"]},
                "attempts": {"type": "integer", "minimum": 0},
                "replays": {"type": "integer", "minimum": 0},
                "delivered": {"type": "boolean"},
                "approval": {
                    "type": ["object", "null"],
                    "properties": {
                        "approval_id": {"type": "string", "format": "uuid"},
                        "state": {"type": "string"},
                    },
                },
            },
            "required": ["operation_id", "idempotency_key", "state", "method", "route", "created_at", "attempts", "replays", "delivered"],
        }),
    );
    schemas.insert(
        "IdempotencyApproval".into(),
        json!({
            "description": "An approval bound to one operation's fingerprint.",
            "type": "object",
            "properties": {
                "approval_id": {"type": "string", "format": "uuid"},
                "operation_id": {"type": "string", "format": "uuid"},
                "state": {"type": "string", "enum": ["pending", "approved", "denied", "expired"]},
                "fingerprint": {"type": "string"},
                "summary": {},
                "requested_by": {"type": "string"},
                "requested_at": {"type": "string", "format": "date-time"},
                "expires_at": {"type": "string", "format": "date-time"},
                "decided_by": {"type": ["string", "null"]},
                "decided_at": time,
                "reason": {"type": ["string", "null"]},
                "approval_url": {"type": "string", "format": "uri-reference"},
            },
            "required": ["approval_id", "operation_id", "state", "fingerprint", "requested_by", "requested_at", "expires_at", "approval_url"],
        }),
    );
    json!({
        "headers": {
            "Operation-Id": {
                "description": "The operation this answer belongs to (its status route: the status path and this id).",
                "schema": {"type": "string", "format": "uuid"},
            },
            "Idempotent-Replayed": {
                "description": "Present on an answer replayed from the stored result; the request was not executed again.",
                "schema": {"type": "string", "enum": ["true"]},
            },
            "Retry-After": {
                "description": "Seconds after which a retry with the same key is worth sending.",
                "schema": {"type": "integer", "minimum": 1},
            },
        },
        "parameters": {
            KEY_PARAMETER: key(true),
            OPTIONAL_KEY_PARAMETER: key(false),
        },
        "schemas": schemas,
    })
}

/// An answer of `problems`, all of one status: `application/problem+json` of one of their
/// schemas, with `Retry-After` when one of them sends it.
fn problem_response(problems: &[ProblemType]) -> Value {
    let slugs: Vec<String> = problems.iter().map(|p| format!("`{}`", p.slug)).collect();
    let schemas: Vec<Value> = problems
        .iter()
        .map(|p| schema_ref(&problem_schema_name(p.slug)))
        .collect();
    let schema = match schemas.as_slice() {
        [one] => one.clone(),
        _ => json!({"oneOf": schemas}),
    };
    let mut response = json!({
        "description": format!("Problem: {}", slugs.join(", ")),
        "content": {"application/problem+json": {"schema": schema}},
    });
    if problems.iter().any(|p| p.retry_after) {
        response["headers"] = json!({"Retry-After": header_ref("Retry-After")});
    }
    response
}

/// The problem answers of `slugs`, grouped by status.
fn problem_responses(slugs: &[&str]) -> BTreeMap<String, Value> {
    let mut by_status: BTreeMap<String, Vec<ProblemType>> = BTreeMap::new();
    for slug in slugs {
        if let Some(problem) = ProblemType::by_slug(slug) {
            by_status
                .entry(problem.status.as_u16().to_string())
                .or_default()
                .push(problem);
        }
    }
    by_status
        .into_iter()
        .map(|(status, problems)| (status, problem_response(&problems)))
        .collect()
}

/// The problem types a guarded request under `policy` can be answered with.
fn write_problems(policy: &RoutePolicy) -> Vec<&'static str> {
    let mut slugs = vec![
        "invalid-idempotency-key",
        "missing-scope",
        "body-too-large",
        "body-read-failed",
        "body-read-timeout",
        "invalid-json",
        "unsupported-media-type",
        "invalid-command",
        "fingerprint-mismatch",
        "request-in-progress",
        "outcome-unknown",
        "response-not-replayable",
        "store-unavailable",
        "store-full",
        "scope-quota-exceeded",
        "detached-limit",
        "handler-failed",
    ];
    if policy.key == KeyRequirement::Required || policy.approval.is_some() {
        slugs.push("missing-idempotency-key");
    }
    if policy.transactional {
        slugs.extend(["transactions-unsupported", "not-committed"]);
    }
    if policy.approval.is_some() {
        slugs.extend([
            "approval-required",
            "approval-denied",
            "approval-expired",
            "approvals-unsupported",
        ]);
    }
    slugs
}

/// Adds to `operation` (an OpenAPI Operation Object of `method` on `route`, the route
/// template as the layer sees it) what the layer does to it under its policy: the key
/// parameter (required or optional), `Operation-Id` and `Idempotent-Replayed` on its
/// success answers, and the problem answers the policy can give. A status the operation
/// already answers is kept as written; a method the layer does not guard is left alone.
pub fn decorate_operation(
    layer: &IdempotencyLayer,
    method: &Method,
    route: &str,
    operation: &mut Value,
) {
    let shared = layer.shared();
    if !shared.guards(method) {
        return;
    }
    let Some(operation) = operation.as_object_mut() else {
        return;
    };
    let policy = shared.policy_for(method, route);
    let required = policy.key == KeyRequirement::Required || policy.approval.is_some();
    let parameter = if required {
        KEY_PARAMETER
    } else {
        OPTIONAL_KEY_PARAMETER
    };
    let reference = json!({"$ref": format!("#/components/parameters/{parameter}")});
    let parameters = operation
        .entry("parameters")
        .or_insert_with(|| Value::Array(Vec::new()));
    if let Some(parameters) = parameters.as_array_mut() {
        if !parameters.contains(&reference) {
            parameters.insert(0, reference);
        }
    }
    let responses = operation
        .entry("responses")
        .or_insert_with(|| Value::Object(Map::new()));
    let Some(responses) = responses.as_object_mut() else {
        return;
    };
    for (status, response) in responses.iter_mut() {
        if !status.starts_with('2') {
            continue;
        }
        if let Some(response) = response.as_object_mut() {
            let headers = response
                .entry("headers")
                .or_insert_with(|| Value::Object(Map::new()));
            if let Some(headers) = headers.as_object_mut() {
                headers.insert("Operation-Id".into(), header_ref("Operation-Id"));
                headers.insert(
                    "Idempotent-Replayed".into(),
                    header_ref("Idempotent-Replayed"),
                );
            }
        }
    }
    for (status, response) in problem_responses(&write_problems(policy)) {
        responses.entry(status).or_insert(response);
    }
}

fn path_parameter(name: &str, description: &str) -> Value {
    json!({"name": name, "in": "path", "required": true, "description": description,
           "schema": {"type": "string", "format": "uuid"}})
}

fn ok(description: &str, schema: Value) -> Value {
    json!({"description": description, "content": {"application/json": {"schema": schema}}})
}

fn responses(success: Value, problems: &[&str]) -> Value {
    let mut all = Map::new();
    all.insert("200".into(), success);
    for (status, response) in problem_responses(problems) {
        all.insert(status, response);
    }
    Value::Object(all)
}

/// The path items of the generated routes: the status routes under the status path and
/// the approvals routes under the approvals path (mount both to serve all of them).
pub fn paths(layer: &IdempotencyLayer) -> Value {
    let shared = layer.shared();
    let status = &shared.status_path;
    let approvals = &shared.approvals_path;
    let root = |path: &str| {
        if path.is_empty() {
            "/".to_owned()
        } else {
            path.to_owned()
        }
    };
    let operation = || ok("The operation record.", schema_ref("IdempotencyOperation"));
    let approval = || ok("The approval.", schema_ref("IdempotencyApproval"));
    let decision = |member: &str, description: &str, problems: &[&str]| {
        json!({
            "tags": ["idempotency"],
            "summary": description,
            "parameters": [path_parameter("approval_id", "The approval.")],
            "requestBody": {
                "required": true,
                "content": {"application/json": {"schema": {
                    "type": "object",
                    "properties": {member: {"type": "string", "minLength": 1}},
                    "required": [member],
                    "additionalProperties": false,
                }}},
            },
            "responses": responses(approval(), problems),
        })
    };
    let deciding = [
        "missing-scope",
        "not-an-approver",
        "approval-not-found",
        "unsupported-media-type",
        "body-too-large",
        "body-read-failed",
        "body-read-timeout",
        "invalid-json",
        "invalid-command",
        "approval-fingerprint-mismatch",
        "approval-decided",
        "approval-expired",
        "approvals-unsupported",
        "store-unavailable",
    ];
    let mut approving = deciding.to_vec();
    approving.push("self-approval-forbidden");
    let mut paths = Map::new();
    paths.insert(
        format!("{status}/{{operation_id}}"),
        json!({"get": {
            "tags": ["idempotency"],
            "summary": "Read an operation of the caller's scope by its id",
            "parameters": [path_parameter("operation_id", "The operation (its `Operation-Id`).")],
            "responses": responses(operation(), &["missing-scope", "operation-not-found", "store-unavailable"]),
        }}),
    );
    paths.insert(
        root(status),
        json!({"get": {
            "tags": ["idempotency"],
            "summary": "Read an operation of the caller's scope by its idempotency key",
            "parameters": [{
                "name": "idempotency_key", "in": "query", "required": true,
                "description": "The key, as sent in the key header.",
                "schema": {"type": "string", "minLength": 1, "maxLength": 512, "pattern": KEY_PATTERN},
            }],
            "responses": responses(operation(), &["missing-idempotency-key", "invalid-idempotency-key", "missing-scope", "operation-not-found", "store-unavailable"]),
        }}),
    );
    paths.insert(
        root(approvals),
        json!({"get": {
            "tags": ["idempotency"],
            "summary": "List the approvals of the caller's scope, oldest request first",
            "parameters": [
                {"name": "state", "in": "query", "required": false,
                 "schema": {"type": "string", "enum": ["pending", "approved", "denied", "expired"]}},
                {"name": "limit", "in": "query", "required": false,
                 "description": "At most this many approvals in the page (a page also stops at 256 KiB).",
                 "schema": {"type": "integer", "minimum": 1, "maximum": 1000, "default": 100}},
                {"name": "cursor", "in": "query", "required": false,
                 "description": "The `next_cursor` of the previous page: the page after it.",
                 "schema": {"type": "string"}},
            ],
            "responses": responses(
                ok("One page of the approvals.", json!({"type": "object",
                    "properties": {
                        "approvals": {"type": "array", "items": schema_ref("IdempotencyApproval")},
                        "next_cursor": {"type": ["string", "null"],
                            "description": "The cursor of the next page; null on the last page."},
                    },
                    "required": ["approvals", "next_cursor"]})),
                &["invalid-query", "missing-scope", "approvals-unsupported", "store-unavailable"],
            ),
        }}),
    );
    paths.insert(
        format!("{approvals}/{{approval_id}}"),
        json!({"get": {
            "tags": ["idempotency"],
            "summary": "Read an approval of the caller's scope",
            "parameters": [path_parameter("approval_id", "The approval.")],
            "responses": responses(approval(), &["missing-scope", "approval-not-found", "approvals-unsupported", "store-unavailable"]),
        }}),
    );
    paths.insert(
        format!("{approvals}/{{approval_id}}/approve"),
        json!({"post": decision("fingerprint", "Approve, confirming the fingerprint the approver was shown", &approving)}),
    );
    paths.insert(
        format!("{approvals}/{{approval_id}}/deny"),
        json!({"post": decision("reason", "Deny, with a reason (at most 2000 characters)", &deciding)}),
    );
    Value::Object(paths)
}

/// Merges the layer's fragments into `document` (an OpenAPI 3.1 document as JSON): its
/// [`components`] and [`paths`] (entries the document already has are kept), and
/// [`decorate_operation`] on each operation of the document's paths.
pub fn merge_into(layer: &IdempotencyLayer, document: &mut Value) {
    let Some(root) = document.as_object_mut() else {
        return;
    };
    let paths = root
        .entry("paths")
        .or_insert_with(|| Value::Object(Map::new()));
    if let Some(paths) = paths.as_object_mut() {
        for (route, item) in paths.iter_mut() {
            let Some(item) = item.as_object_mut() else {
                continue;
            };
            for (method, operation) in item.iter_mut() {
                if let Ok(method) = Method::from_bytes(method.to_ascii_uppercase().as_bytes()) {
                    decorate_operation(layer, &method, route, operation);
                }
            }
        }
        if let Value::Object(generated) = self::paths(layer) {
            for (route, item) in generated {
                paths.entry(route).or_insert(item);
            }
        }
    }
    let components = root
        .entry("components")
        .or_insert_with(|| Value::Object(Map::new()));
    if let (Some(components), Value::Object(ours)) =
        (components.as_object_mut(), self::components(layer))
    {
        for (section, entries) in ours {
            let section = components
                .entry(section)
                .or_insert_with(|| Value::Object(Map::new()));
            if let (Some(section), Value::Object(entries)) = (section.as_object_mut(), entries) {
                for (name, entry) in entries {
                    section.entry(name).or_insert(entry);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ApprovalPolicy, MemoryStore, RoutePolicy};

    #[test]
    fn every_problem_type_of_the_table_has_its_schema_with_its_status() {
        let layer = IdempotencyLayer::new(MemoryStore::default())
            .with_problem_base("https://example.com/p/");
        let components = components(&layer);
        for problem in ProblemType::ALL {
            let schema = &components["schemas"][problem_schema_name(problem.slug)];
            assert_eq!(
                schema["properties"]["status"]["const"],
                problem.status.as_u16()
            );
            assert_eq!(
                schema["properties"]["type"]["const"],
                format!("https://example.com/p/{}", problem.slug)
            );
        }
    }

    #[test]
    fn the_key_parameter_follows_the_route_policy() {
        let layer = IdempotencyLayer::new(
            test_harness::stores::HookedStore::default()
                .with_approvals()
                .with_failing_transactions(),
        )
        .with_default_policy(RoutePolicy::optional())
        .expect("the store has what the policy needs")
        .with_route_policy(
            Method::POST,
            "/v1/deploys",
            RoutePolicy::required().with_approval(ApprovalPolicy::always()),
        )
        .expect("the store has what the policy needs");
        let mut optional = json!({"responses": {"201": {"description": "made"}}});
        decorate_operation(&layer, &Method::POST, "/v1/notes", &mut optional);
        assert_eq!(
            optional["parameters"][0]["$ref"],
            "#/components/parameters/IdempotencyKeyOptional"
        );
        assert!(optional["responses"]["403"].is_null());
        assert!(optional["responses"]["201"]["headers"]["Idempotent-Replayed"].is_object());
        let mut deploy = json!({"responses": {"201": {"description": "made"}}});
        decorate_operation(&layer, &Method::POST, "/v1/deploys", &mut deploy);
        assert_eq!(
            deploy["parameters"][0]["$ref"],
            "#/components/parameters/IdempotencyKey"
        );
        let forbidden = deploy["responses"]["403"].to_string();
        assert!(
            forbidden.contains("Problem-approval-required"),
            "{forbidden}"
        );
        assert!(deploy["responses"]["409"]["headers"]["Retry-After"].is_object());
        let layer = layer
            .with_route_policy(Method::PUT, "/v1/ledger", RoutePolicy::transactional())
            .expect("the store has what the policy needs");
        let mut ledger = json!({"responses": {"200": {"description": "ok"}}});
        decorate_operation(&layer, &Method::PUT, "/v1/ledger", &mut ledger);
        let unavailable = ledger["responses"]["503"].to_string();
        assert!(
            unavailable.contains("Problem-not-committed"),
            "{unavailable}"
        );
        assert!(
            deploy["responses"]["503"]
                .to_string()
                .contains("Problem-store-unavailable")
        );
        assert!(
            !deploy["responses"]["503"]
                .to_string()
                .contains("Problem-not-committed")
        );
        let mut read = json!({"responses": {"200": {"description": "ok"}}});
        decorate_operation(&layer, &Method::GET, "/v1/deploys", &mut read);
        assert_eq!(read, json!({"responses": {"200": {"description": "ok"}}}));
    }
}
