//! Where the demo's side effects happen and are counted: tickets, charges and deploys per
//! actor, in memory or in a PostgreSQL table (so counts survive a restart or a kill -9).
//!
//! Sequence numbers (and the ticket ids made from them) count per actor: an actor learns
//! nothing from them about what other actors do.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use deadpool_postgres::Pool;
use serde_json::{Value, json};

/// The tools whose effects are counted.
pub const EFFECT_TOOLS: [&str; 3] = ["create_ticket", "charge", "deploy_release"];

const SCHEMA: &str = "CREATE TABLE IF NOT EXISTS mcp_demo_effects (
    id bigserial PRIMARY KEY,
    actor text NOT NULL,
    tool text NOT NULL,
    execution_id text NOT NULL,
    detail jsonb NOT NULL,
    at timestamptz NOT NULL DEFAULT now()
);
ALTER TABLE mcp_demo_effects ADD COLUMN IF NOT EXISTS actor_seq bigint;
CREATE TABLE IF NOT EXISTS mcp_demo_actor_sequences (
    actor text PRIMARY KEY,
    last bigint NOT NULL
)";

/// One statement: the actor's next sequence number and the effect that takes it.
const RECORD: &str = "WITH next AS (
    INSERT INTO mcp_demo_actor_sequences (actor, last) VALUES ($1, 1)
    ON CONFLICT (actor) DO UPDATE SET last = mcp_demo_actor_sequences.last + 1
    RETURNING last
)
INSERT INTO mcp_demo_effects (actor, tool, execution_id, detail, actor_seq)
SELECT $1, $2, $3, $4, last FROM next
RETURNING actor_seq";

/// A backend failure while recording or reading effects.
#[derive(Debug, thiserror::Error)]
#[error("the effects table failed: {0}")]
pub struct EffectsError(String);

/// One recorded effect: actor, tool, execution id, detail, the actor's sequence number.
type EffectRow = (String, String, String, Value, i64);

/// The effects ledger.
#[derive(Debug, Clone)]
pub enum Effects {
    /// In this process only.
    Memory(Arc<Mutex<Vec<EffectRow>>>),
    /// In the `mcp_demo_effects` table.
    Postgres(Pool),
}

impl Effects {
    /// An in-memory ledger.
    pub fn memory() -> Self {
        Self::Memory(Arc::default())
    }

    /// A ledger in PostgreSQL; creates its table when missing.
    pub async fn postgres(pool: Pool) -> Result<Self, EffectsError> {
        let client = pool.get().await.map_err(|e| EffectsError(e.to_string()))?;
        client
            .batch_execute(SCHEMA)
            .await
            .map_err(|e| EffectsError(e.to_string()))?;
        Ok(Self::Postgres(pool))
    }

    /// Performs one effect: appends it to the ledger and returns its sequence number among
    /// the actor's effects (1, 2, …).
    pub async fn record(
        &self,
        actor: &str,
        tool: &str,
        execution_id: &str,
        detail: Value,
    ) -> Result<i64, EffectsError> {
        match self {
            Self::Memory(rows) => {
                let mut rows = rows.lock().unwrap_or_else(|e| e.into_inner());
                // The actor's last effect holds its highest number: found from the end, so
                // an actor calling in a loop does not scan the whole ledger each time.
                let sequence = rows
                    .iter()
                    .rev()
                    .find(|row| row.0 == actor)
                    .map_or(1, |row| row.4 + 1);
                rows.push((
                    actor.into(),
                    tool.into(),
                    execution_id.into(),
                    detail,
                    sequence,
                ));
                Ok(sequence)
            }
            Self::Postgres(pool) => {
                let client = pool.get().await.map_err(|e| EffectsError(e.to_string()))?;
                let row = client
                    .query_one(RECORD, &[&actor, &tool, &execution_id, &detail])
                    .await
                    .map_err(|e| EffectsError(e.to_string()))?;
                Ok(row.get(0))
            }
        }
    }

    /// How many times each effect ran for `actor`.
    pub async fn counts(&self, actor: &str) -> Result<Value, EffectsError> {
        let mut counts: HashMap<String, i64> =
            EFFECT_TOOLS.iter().map(|t| ((*t).to_owned(), 0)).collect();
        match self {
            Self::Memory(rows) => {
                let rows = rows.lock().unwrap_or_else(|e| e.into_inner());
                for (who, tool, _, _, _) in rows.iter() {
                    if who == actor {
                        *counts.entry(tool.clone()).or_default() += 1;
                    }
                }
            }
            Self::Postgres(pool) => {
                let client = pool.get().await.map_err(|e| EffectsError(e.to_string()))?;
                let rows = client
                    .query(
                        "SELECT tool, count(*) FROM mcp_demo_effects WHERE actor = $1 GROUP BY tool",
                        &[&actor],
                    )
                    .await
                    .map_err(|e| EffectsError(e.to_string()))?;
                for row in rows {
                    counts.insert(row.get(0), row.get(1));
                }
            }
        }
        Ok(json!(counts))
    }

    /// The actor's tickets, oldest first.
    pub async fn tickets(&self, actor: &str) -> Result<Vec<Value>, EffectsError> {
        match self {
            Self::Memory(rows) => {
                let rows = rows.lock().unwrap_or_else(|e| e.into_inner());
                Ok(rows
                    .iter()
                    .filter(|(who, tool, _, _, _)| who == actor && tool == "create_ticket")
                    .map(|(_, _, _, detail, sequence)| ticket(*sequence, detail))
                    .collect())
            }
            Self::Postgres(pool) => {
                let client = pool.get().await.map_err(|e| EffectsError(e.to_string()))?;
                let rows = client
                    .query(
                        "SELECT coalesce(actor_seq, id), detail FROM mcp_demo_effects \
                         WHERE actor = $1 AND tool = 'create_ticket' ORDER BY id",
                        &[&actor],
                    )
                    .await
                    .map_err(|e| EffectsError(e.to_string()))?;
                Ok(rows
                    .iter()
                    .map(|row| ticket(row.get(0), &row.get::<_, Value>(1)))
                    .collect())
            }
        }
    }
}

fn ticket(id: i64, detail: &Value) -> Value {
    json!({"ticket_id": format!("T-{id}"), "project": detail["project"], "title": detail["title"]})
}
