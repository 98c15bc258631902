//! Schema migrations: the plain SQL files in this crate's `migrations/` folder, embedded at
//! build time and applied in order.
//!
//! All pending migrations run in one transaction that first takes a transaction-scoped
//! advisory lock (one per schema), so any number of app instances may call `migrate()` at
//! start-up at once: one applies, the others wait and then find nothing left to do. What
//! ran is recorded in `idempotency_schema_migrations`; the files are also idempotent on their
//! own (`IF NOT EXISTS` throughout).

use deadpool_postgres::Client;
use tower_idempotency_core::StoreError;

use crate::executor::classify::from_pg;

/// One embedded migration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Migration {
    /// Order and identity of the migration (the file's numeric prefix).
    pub version: i32,
    /// The file name.
    pub name: &'static str,
    /// The SQL text.
    pub sql: &'static str,
}

/// Every migration this version of the crate knows, in order.
pub const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        name: "0001_operations.sql",
        sql: include_str!("../migrations/0001_operations.sql"),
    },
    Migration {
        version: 2,
        name: "0002_resolutions.sql",
        sql: include_str!("../migrations/0002_resolutions.sql"),
    },
    Migration {
        version: 3,
        name: "0003_outbox.sql",
        sql: include_str!("../migrations/0003_outbox.sql"),
    },
    Migration {
        version: 4,
        name: "0004_resolution_operator.sql",
        sql: include_str!("../migrations/0004_resolution_operator.sql"),
    },
    Migration {
        version: 5,
        name: "0005_scope_quotas.sql",
        sql: include_str!("../migrations/0005_scope_quotas.sql"),
    },
    Migration {
        version: 6,
        name: "0006_lifecycle.sql",
        sql: include_str!("../migrations/0006_lifecycle.sql"),
    },
    Migration {
        version: 7,
        name: "0007_audit.sql",
        sql: include_str!("../migrations/0007_audit.sql"),
    },
    Migration {
        version: 8,
        name: "0008_scope_expiry_index.sql",
        sql: include_str!("../migrations/0008_scope_expiry_index.sql"),
    },
    Migration {
        version: 9,
        name: "0009_open_index.sql",
        sql: include_str!("../migrations/0009_open_index.sql"),
    },
    Migration {
        version: 10,
        name: "0010_audit_superseded.sql",
        sql: include_str!("../migrations/0010_audit_superseded.sql"),
    },
    Migration {
        version: 11,
        name: "0011_audit_lookup_columns.sql",
        sql: include_str!("../migrations/0011_audit_lookup_columns.sql"),
    },
    Migration {
        version: 12,
        name: "0012_inline_journal.sql",
        sql: include_str!("../migrations/0012_inline_journal.sql"),
    },
    Migration {
        version: 13,
        name: "0013_hot_completion.sql",
        sql: include_str!("../migrations/0013_hot_completion.sql"),
    },
    Migration {
        version: 14,
        name: "0014_lean_record.sql",
        sql: include_str!("../migrations/0014_lean_record.sql"),
    },
    Migration {
        version: 15,
        name: "0015_insert_completed.sql",
        sql: include_str!("../migrations/0015_insert_completed.sql"),
    },
];

/// Advisory lock key for migrating `schema`: a fixed tag mixed with an FNV-1a hash of the
/// schema name, so two schemas in one database migrate independently. The hash is spelled
/// out (not `DefaultHasher`) because every app version must compute the same key.
fn lock_key(schema: &str) -> i64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in "tower-idempotency/migrate/".bytes().chain(schema.bytes()) {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    i64::from_ne_bytes(hash.to_ne_bytes())
}

/// Applies every pending migration to `schema` (a validated identifier); returns the
/// versions applied by this call.
pub(crate) async fn run(client: &mut Client, schema: &str) -> Result<Vec<i32>, StoreError> {
    let tx = client.transaction().await.map_err(from_pg)?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&lock_key(schema)])
        .await
        .map_err(from_pg)?;
    // Look before creating: `CREATE SCHEMA IF NOT EXISTS` demands the database-level CREATE
    // privilege even when the schema exists, which an app role often lacks.
    let exists = tx
        .query_opt(
            "SELECT 1 FROM pg_catalog.pg_namespace WHERE nspname = $1",
            &[&schema],
        )
        .await
        .map_err(from_pg)?
        .is_some();
    if !exists {
        tx.batch_execute(&format!("CREATE SCHEMA \"{schema}\""))
            .await
            .map_err(from_pg)?;
    }
    tx.batch_execute(&format!(
        "SET LOCAL search_path TO \"{schema}\";
         CREATE TABLE IF NOT EXISTS idempotency_schema_migrations (
             version    integer     PRIMARY KEY,
             name       text        NOT NULL,
             applied_at timestamptz NOT NULL DEFAULT now()
         );"
    ))
    .await
    .map_err(from_pg)?;
    let done: Vec<i32> = tx
        .query("SELECT version FROM idempotency_schema_migrations", &[])
        .await
        .map_err(from_pg)?
        .iter()
        .map(|row| row.get(0))
        .collect();
    let mut applied = Vec::new();
    for migration in MIGRATIONS.iter().filter(|m| !done.contains(&m.version)) {
        tx.batch_execute(migration.sql).await.map_err(from_pg)?;
        tx.execute(
            "INSERT INTO idempotency_schema_migrations (version, name) VALUES ($1, $2)",
            &[&migration.version, &migration.name],
        )
        .await
        .map_err(from_pg)?;
        applied.push(migration.version);
    }
    tx.commit().await.map_err(from_pg)?;
    if applied.is_empty() {
        tracing::debug!(schema, "idempotency schema is up to date");
    } else {
        tracing::info!(schema, ?applied, "applied idempotency schema migrations");
    }
    Ok(applied)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn migrations_are_ordered_and_named_by_version() {
        for (index, migration) in MIGRATIONS.iter().enumerate() {
            assert_eq!(migration.version, i32::try_from(index + 1).unwrap());
            assert!(
                migration
                    .name
                    .starts_with(&format!("{:04}_", migration.version))
            );
            assert!(!migration.sql.trim().is_empty());
        }
    }

    #[test]
    fn lock_keys_differ_per_schema_and_are_stable() {
        assert_eq!(lock_key("public"), lock_key("public"));
        assert_ne!(lock_key("public"), lock_key("other"));
    }
}
