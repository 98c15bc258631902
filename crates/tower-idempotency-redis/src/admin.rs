//! The operator's reads and writes (the CLI's): find, show, list, resolve. Purging is the
//! key TTL's job (and [`Store::purge_expired`](tower_idempotency_core::Store::purge_expired)'s
//! for `unknown` records past their unknown retention).

use tower_idempotency_core::{IdempotencyKey, Operation, OperationId, OperationState, Scope};

use crate::error::{RedisStoreError, Resolution};
use crate::keys;
use crate::record::{Stored, micros};
use crate::scripts;
use crate::store::RedisStore;

impl RedisStore {
    /// The record of `(scope, key)`, as of the server's clock; `None` when there is none
    /// (or its retention ended).
    pub async fn find(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
    ) -> Result<Option<Operation>, RedisStoreError> {
        self.load(scope, key).await
    }

    /// The operation `id` of `scope`; `None` when it does not exist in this scope.
    pub async fn show(
        &self,
        scope: &Scope,
        id: OperationId,
    ) -> Result<Option<Operation>, RedisStoreError> {
        self.load_by_id(scope, id).await
    }

    /// Up to `limit` operations in `state` (as of the server's clock: an in-progress record
    /// whose lease lapsed after dispatch is `unknown`), across every scope.
    ///
    /// Redis keeps no index across scopes (a scope's keys live on its own shard), so this
    /// walks the keyspace: `SCAN … TYPE string` of the record keys on every primary, then one
    /// read per record until `limit` match — O(keys in Redis), for an operator's tool, not
    /// a request path.
    pub async fn list(
        &self,
        state: OperationState,
        limit: usize,
    ) -> Result<Vec<Operation>, RedisStoreError> {
        let mut found = Vec::new();
        if limit == 0 {
            return Ok(found);
        }
        let pattern = keys::pattern(&self.inner.prefix, "r:*");
        let records = self.inner.conn.scan(&pattern, "string", usize::MAX).await?;
        for key in records {
            let Some(base) = keys::base_of(&key) else {
                continue;
            };
            let (now, record) = self.read_at(base, &key, false).await?;
            let Some(record) = record else {
                continue;
            };
            if let Some(operation) = record.operation(now)? {
                if operation.state == state {
                    found.push(operation);
                    if found.len() >= limit {
                        break;
                    }
                }
            }
        }
        found.sort_by_key(|operation| operation.created_at);
        Ok(found)
    }

    /// Records `operator`'s decision about the `unknown` operation `id` of `scope`, in one
    /// script that also revokes the lease (a worker somehow still running gets `LeaseLost`):
    /// [`Resolution::Failed`] removes the record (the client's retry executes again),
    /// [`Resolution::Completed`] makes it `completed` with no stored response, keeping the
    /// operator, the reason and the time in the record (`res`, `rop`, `rreason`, `rat`).
    ///
    /// Fails with [`RedisStoreError::NotFound`] when the scope has no such operation,
    /// [`RedisStoreError::NotUnknown`] when it is not `unknown`, and
    /// [`RedisStoreError::AnonymousOperator`] for a blank `operator` (checked before Redis
    /// is touched).
    pub async fn resolve(
        &self,
        scope: &Scope,
        id: OperationId,
        resolution: Resolution,
        operator: &str,
        reason: &str,
    ) -> Result<(), RedisStoreError> {
        let operator = operator.trim();
        if operator.is_empty() {
            return Err(RedisStoreError::AnonymousOperator);
        }
        let keys = self.keys(scope);
        let index = keys.id(id);
        let id_text = id.as_uuid().to_string();
        let answer = self
            .run(
                &scripts::RESOLVE,
                &[&index],
                &[
                    keys.base().as_bytes(),
                    scope.as_str().as_bytes(),
                    id_text.as_bytes(),
                    resolution.as_str().as_bytes(),
                    operator.as_bytes(),
                    reason.as_bytes(),
                ],
            )
            .await?;
        match answer.as_slice() {
            [outcome, ..] if outcome.as_slice() == b"ok" => {
                tracing::info!(
                    operation_id = %id,
                    scope = %scope,
                    resolution = %resolution,
                    reason,
                    operator,
                    "operator resolved an idempotent operation with unknown outcome"
                );
                Ok(())
            }
            [outcome, now, record @ ..] if outcome.as_slice() == b"not_unknown" => {
                let state = Stored::parse(record)
                    .map(|record| record.operation(micros(now)?))
                    .transpose()?
                    .flatten()
                    .map(|operation| operation.state);
                match state {
                    Some(state) => Err(RedisStoreError::NotUnknown { id, state }),
                    None => Err(RedisStoreError::NotFound(id)),
                }
            }
            _ => Err(RedisStoreError::NotFound(id)),
        }
    }
}
