//! The demo's records in PostgreSQL (the default with a database URL): tickets, payments,
//! deploys, the environment locks and the notification sink, in the tables of `schema.sql`.
//!
//! Two write paths share the SQL and the domain rules (unique constraints, so two concurrent
//! writers cannot both win): inside the operation's transaction ([`PostgresTxGuard`], on
//! transactional routes), where a new ticket's notification is enqueued with the outbox API;
//! or in autocommit through the pool (`--non-transactional`, `--no-idempotency`), where the
//! ticket and its outbox row are written by one statement, so neither exists without the
//! other. Either way a dispatcher delivers notifications to the sink afterwards. Deploys are
//! never transactional (a deploy is an effect outside the database); they hold a leased
//! environment lock while they run.
//!
//! Every statement is sent the way the store sends its own ([`StatementMode`], the demo's
//! `--pg-statements`): prepared once per connection, or unnamed with its parameter types,
//! so that the demo works through a pooler in transaction mode as the store does.

use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::{ClientWrapper, Object, Pool};
use serde_json::json;
use tokio::task::JoinHandle;
use tokio_postgres::Row;
use tokio_postgres::types::ToSql;
use tower_idempotency::OperationId;
use tower_idempotency_postgres::{
    DeliveryError, DispatcherConfig, Effect, OutboxDispatcher, PostgresStore, PostgresTxGuard,
    StatementMode,
};
use uuid::Uuid;

use crate::commands::{NewDeploy, NewPayment, NewTicket};
use crate::ledger::{
    Deploy, EnvironmentLocked, InvoiceAlreadyPaid, Notification, Payment, Ticket, new_id, now,
};

/// The outbox effect name of a ticket's notification.
pub const TICKET_NOTIFICATION: &str = "notify-ticket";

type DbError = tokio_postgres::Error;

/// `$1`…`$8`: account, id, project, title, priority, description, source_event_id,
/// created_at. Nothing is inserted (and nothing returned) when the account already has a
/// ticket for the event.
const INSERT_TICKET: &str = "INSERT INTO demo_tickets (account, id, project, title, priority, \
         description, source_event_id, created_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8) \
     ON CONFLICT (account, source_event_id) DO NOTHING RETURNING *";

const EXISTING_TICKET: &str =
    "SELECT * FROM demo_tickets WHERE account = $1 AND source_event_id = $2";

const INSERT_PAYMENT: &str = "INSERT INTO demo_payments (account, id, amount_minor, currency, \
         invoice_ref, payee, created_at) VALUES ($1, $2, $3, $4, $5, $6, $7) \
     ON CONFLICT (account, invoice_ref) DO NOTHING RETURNING *";

const EXISTING_PAYMENT: &str =
    "SELECT id FROM demo_payments WHERE account = $1 AND invoice_ref = $2";

/// The demo's tables, reached through the idempotency store's pool.
#[derive(Debug, Clone)]
pub struct Database {
    pool: Pool,
    store: PostgresStore,
    /// [`INSERT_TICKET`] plus the notification's outbox row, in one statement: `$9` effect
    /// id, `$10` operation id. Built at start: the outbox lives in the store's schema.
    insert_ticket_with_notification: Arc<str>,
    /// How the statements are sent: the store's mode.
    statements: StatementMode,
}

/// A failure to prepare the demo's tables at start.
#[derive(Debug, thiserror::Error)]
#[error("cannot prepare the demo's tables")]
pub struct SchemaError(#[source] Box<dyn std::error::Error + Send + Sync>);

impl Database {
    /// Applies `schema.sql` (idempotent, serialized across instances by an advisory lock)
    /// and returns the records over `store`'s pool, their statements sent in the store's
    /// [`StatementMode`].
    pub async fn open(store: &PostgresStore) -> Result<Self, SchemaError> {
        let mut client = store
            .pool()
            .get()
            .await
            .map_err(|e| SchemaError(Box::new(e)))?;
        let tx = client
            .transaction()
            .await
            .map_err(|e| SchemaError(Box::new(e)))?;
        tx.batch_execute(concat!(
            "SELECT pg_advisory_xact_lock(7165536);\n",
            include_str!("../schema.sql")
        ))
        .await
        .map_err(|e| SchemaError(Box::new(e)))?;
        tx.commit().await.map_err(|e| SchemaError(Box::new(e)))?;
        // The same row `PostgresTxGuard::enqueue` writes; the schema name is a validated
        // identifier, not input.
        let insert_ticket_with_notification = format!(
            "WITH ticket AS ({INSERT_TICKET}), \
                  notification AS ( \
                      INSERT INTO \"{schema}\".idempotency_outbox \
                          (effect_id, operation_id, scope, name, payload) \
                      SELECT $9, $10, ticket.account, '{TICKET_NOTIFICATION}', \
                          jsonb_build_object('account', ticket.account, 'ticket_id', ticket.id) \
                      FROM ticket ON CONFLICT (effect_id) DO NOTHING) \
             SELECT * FROM ticket",
            schema = store.schema(),
        );
        Ok(Self {
            pool: store.pool().clone(),
            store: store.clone(),
            insert_ticket_with_notification: insert_ticket_with_notification.into(),
            statements: store.statement_mode(),
        })
    }

    /// Starts the outbox dispatcher that delivers ticket notifications to the sink. Every
    /// instance runs one; they share the work.
    pub fn spawn_dispatcher(&self) -> JoinHandle<()> {
        let (pool, statements) = (self.pool.clone(), self.statements);
        OutboxDispatcher::new(self.store.clone(), move |effect: Effect| {
            let pool = pool.clone();
            async move { deliver_notification(&pool, statements, effect).await }
        })
        .with_config(DispatcherConfig {
            poll_interval: Duration::from_millis(100),
            backoff_initial: Duration::from_millis(200),
            backoff_max: Duration::from_secs(5),
            ..DispatcherConfig::default()
        })
        .spawn()
    }

    /// A pooled connection in autocommit: every statement commits on its own.
    pub async fn connection(&self) -> Result<Object, RecordError> {
        Ok(self.pool.get().await?)
    }

    /// Creates a ticket in the operation's transaction and enqueues its notification, or
    /// returns the account's ticket with the same `source_event_id` (flag `false`, nothing
    /// enqueued). The unique constraint decides, so two concurrent operations with one
    /// event cannot both create: the second waits for the first to commit, then finds it.
    pub async fn create_ticket_in(
        &self,
        tx: &PostgresTxGuard<'_>,
        account: &str,
        command: NewTicket,
    ) -> Result<(Ticket, bool), RecordError> {
        let id = new_id("tkt");
        let created_at = now();
        let params = ticket_params(&account, &id, &command, &created_at);
        if let Some(row) = self.query_opt(tx, INSERT_TICKET, &params).await? {
            let ticket = ticket(&row)?;
            let payload = json!({"account": account, "ticket_id": ticket.id});
            tx.enqueue(TICKET_NOTIFICATION, &payload).await?;
            return Ok((ticket, true));
        }
        Ok((self.existing_ticket(tx, account, &command).await?, false))
    }

    /// [`Database::create_ticket_in`] outside any transaction of the operation: the ticket
    /// and its notification's outbox row are written by one autocommit statement. The
    /// effect id is derived from `operation` when the idempotency layer runs the request;
    /// without one (`--no-idempotency`) the ticket stands in for the operation, so the id
    /// is still derived from something that exists exactly once.
    pub async fn create_ticket(
        &self,
        account: &str,
        command: NewTicket,
        operation: Option<OperationId>,
    ) -> Result<(Ticket, bool), RecordError> {
        let ticket_uuid = Uuid::new_v4();
        let id = format!("tkt_{}", ticket_uuid.simple());
        let operation = operation.unwrap_or(OperationId::from_uuid(ticket_uuid));
        let effect_id = operation.derived_key(TICKET_NOTIFICATION);
        let operation_uuid = operation.as_uuid();
        let created_at = now();
        let mut params = ticket_params(&account, &id, &command, &created_at).to_vec();
        params.extend_from_slice(&[&effect_id as &(dyn ToSql + Sync), &operation_uuid]);
        let client = self.connection().await?;
        if let Some(row) = self
            .query_opt(&client, &self.insert_ticket_with_notification, &params)
            .await?
        {
            return Ok((ticket(&row)?, true));
        }
        Ok((
            self.existing_ticket(&client, account, &command).await?,
            false,
        ))
    }

    /// Captures a payment unless the account already paid the invoice (the unique
    /// constraint decides). `client` is the operation's transaction on a transactional
    /// route, or a pooled connection in autocommit.
    pub async fn capture_payment(
        &self,
        client: &ClientWrapper,
        account: &str,
        command: NewPayment,
    ) -> Result<Result<Payment, InvoiceAlreadyPaid>, RecordError> {
        // Validated to at most 2^53 - 1, so it fits.
        let amount = i64::try_from(command.amount_minor).unwrap_or(i64::MAX);
        let id = new_id("pay");
        let created_at = now();
        let params: [&(dyn ToSql + Sync); 7] = [
            &account,
            &id,
            &amount,
            &command.currency,
            &command.invoice_ref,
            &command.payee,
            &created_at,
        ];
        if let Some(row) = self.query_opt(client, INSERT_PAYMENT, &params).await? {
            return Ok(Ok(payment(&row)?));
        }
        let existing = self
            .query_one(client, EXISTING_PAYMENT, &[&account, &command.invoice_ref])
            .await?;
        Ok(Err(InvoiceAlreadyPaid {
            invoice_ref: command.invoice_ref,
            payment_id: existing.try_get("id")?,
        }))
    }

    /// Locks the environment for `hold` (a lease, so a crashed demo frees it), then records
    /// the deploy. Free the lock with [`Database::finish_deploy`].
    pub async fn start_deploy(
        &self,
        account: &str,
        command: NewDeploy,
        hold: Duration,
    ) -> Result<Result<Deploy, EnvironmentLocked>, RecordError> {
        let client = self.connection().await?;
        let id = new_id("dep");
        let hold_ms = i64::try_from(hold.as_millis()).unwrap_or(i64::MAX);
        let locked = self
            .query_opt(
                &client,
                "INSERT INTO demo_environment_locks AS l (account, environment, deploy_id, locked_until) \
                 VALUES ($1, $2, $3, now() + $4::bigint * interval '1 millisecond') \
                 ON CONFLICT (account, environment) DO UPDATE \
                     SET deploy_id = excluded.deploy_id, locked_until = excluded.locked_until \
                     WHERE l.locked_until <= now() \
                 RETURNING deploy_id",
                &[&account, &command.environment.as_str(), &id, &hold_ms],
            )
            .await?;
        if locked.is_none() {
            return Ok(Err(EnvironmentLocked {
                environment: command.environment.as_str().to_owned(),
            }));
        }
        let row = self
            .query_one(
                &client,
                "INSERT INTO demo_deploys (account, id, service, environment, artifact, created_at) \
                 VALUES ($1, $2, $3, $4, $5, $6) RETURNING *",
                &[
                    &account,
                    &id,
                    &command.service,
                    &command.environment.as_str(),
                    &command.artifact,
                    &now(),
                ],
            )
            .await?;
        Ok(Ok(deploy(&row)?))
    }

    /// Frees the environment `deploy` locked.
    pub async fn finish_deploy(&self, account: &str, deploy: &Deploy) -> Result<(), RecordError> {
        let client = self.connection().await?;
        self.statements
            .execute(
                &client,
                "DELETE FROM demo_environment_locks \
                 WHERE account = $1 AND environment = $2 AND deploy_id = $3",
                &[&account, &deploy.environment, &deploy.id],
            )
            .await?;
        Ok(())
    }

    /// The account's tickets, oldest first.
    pub async fn tickets(&self, account: &str) -> Result<Vec<Ticket>, RecordError> {
        self.list(
            "SELECT * FROM demo_tickets WHERE account = $1 ORDER BY seq",
            account,
            ticket,
        )
        .await
    }

    /// The account's payments, oldest first.
    pub async fn payments(&self, account: &str) -> Result<Vec<Payment>, RecordError> {
        self.list(
            "SELECT * FROM demo_payments WHERE account = $1 ORDER BY seq",
            account,
            payment,
        )
        .await
    }

    /// The account's deploys, oldest first.
    pub async fn deploys(&self, account: &str) -> Result<Vec<Deploy>, RecordError> {
        self.list(
            "SELECT * FROM demo_deploys WHERE account = $1 ORDER BY seq",
            account,
            deploy,
        )
        .await
    }

    /// The notifications the sink received for the account, one per effect id, oldest
    /// first.
    pub async fn notifications(&self, account: &str) -> Result<Vec<Notification>, RecordError> {
        self.list(
            "SELECT * FROM demo_notifications WHERE account = $1 ORDER BY seq",
            account,
            notification,
        )
        .await
    }

    async fn list<T>(
        &self,
        sql: &str,
        account: &str,
        decode: fn(&Row) -> Result<T, DbError>,
    ) -> Result<Vec<T>, RecordError> {
        let client = self.connection().await?;
        let rows = self.statements.query(&client, sql, &[&account]).await?;
        Ok(rows.iter().map(decode).collect::<Result<_, _>>()?)
    }

    /// The account's ticket for `command`'s event, after an insert found one.
    async fn existing_ticket(
        &self,
        client: &ClientWrapper,
        account: &str,
        command: &NewTicket,
    ) -> Result<Ticket, RecordError> {
        let row = self
            .query_one(
                client,
                EXISTING_TICKET,
                &[&account, &command.source_event_id],
            )
            .await?;
        Ok(ticket(&row)?)
    }

    /// The first row of `sql`, if any. Prepared statements are prepared once per pooled
    /// connection: a handler's write is then one round trip, not a parse round trip plus
    /// an execute round trip; unnamed ones are one round trip each time.
    async fn query_opt(
        &self,
        client: &ClientWrapper,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Option<Row>, RecordError> {
        let rows = self.statements.query(client, sql, params).await?;
        Ok(rows.into_iter().next())
    }

    /// The one row of `sql`, which always returns one.
    async fn query_one(
        &self,
        client: &ClientWrapper,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Row, RecordError> {
        self.query_opt(client, sql, params)
            .await?
            .ok_or(RecordError::NoRow)
    }
}

/// The parameters of [`INSERT_TICKET`].
fn ticket_params<'a>(
    account: &'a &'a str,
    id: &'a String,
    command: &'a NewTicket,
    created_at: &'a String,
) -> [&'a (dyn ToSql + Sync); 8] {
    [
        account as &(dyn ToSql + Sync),
        id,
        &command.project,
        &command.title,
        &command.priority,
        &command.description,
        &command.source_event_id,
        created_at,
    ]
}

/// A database failure in a demo handler (answered `500`; on a transactional route the
/// operation's transaction rolls back).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RecordError {
    /// No pooled connection.
    #[error("no database connection")]
    Pool(#[from] deadpool_postgres::PoolError),
    /// A statement failed (sent as the store sends its own, so failing as its calls do),
    /// or the outbox refused the notification.
    #[error("a database statement failed")]
    Statement(#[from] tower_idempotency::StoreError),
    /// A statement that always returns a row returned none.
    #[error("a database statement returned no row")]
    NoRow,
    /// A row did not hold what the demo's tables hold.
    #[error("a database row could not be read")]
    Row(#[from] tokio_postgres::Error),
}

/// The sink: records the notification under its effect id. A redelivery of the same effect
/// (a dispatcher that lost its claim) counts as an attempt and is never a second
/// notification.
async fn deliver_notification(
    pool: &Pool,
    statements: StatementMode,
    effect: Effect,
) -> Result<(), DeliveryError> {
    let (Some(account), Some(ticket_id)) = (
        effect.payload["account"].as_str(),
        effect.payload["ticket_id"].as_str(),
    ) else {
        return Err(DeliveryError::permanent(
            "a ticket notification needs account and ticket_id",
        ));
    };
    let client = pool.get().await.map_err(DeliveryError::retry)?;
    statements
        .execute(
            &client,
            "INSERT INTO demo_notifications (effect_id, account, ticket_id) VALUES ($1, $2, $3) \
             ON CONFLICT (effect_id) DO UPDATE SET attempts = demo_notifications.attempts + 1",
            &[&effect.effect_id, &account, &ticket_id],
        )
        .await
        .map_err(DeliveryError::retry)?;
    Ok(())
}

fn ticket(row: &Row) -> Result<Ticket, DbError> {
    Ok(Ticket {
        id: row.try_get("id")?,
        project: row.try_get("project")?,
        title: row.try_get("title")?,
        priority: row.try_get("priority")?,
        description: row.try_get("description")?,
        source_event_id: row.try_get("source_event_id")?,
        created_at: row.try_get("created_at")?,
    })
}

fn payment(row: &Row) -> Result<Payment, DbError> {
    let amount: i64 = row.try_get("amount_minor")?;
    Ok(Payment {
        id: row.try_get("id")?,
        amount_minor: u64::try_from(amount).unwrap_or(0),
        currency: row.try_get("currency")?,
        invoice_ref: row.try_get("invoice_ref")?,
        payee: row.try_get("payee")?,
        status: "captured",
        created_at: row.try_get("created_at")?,
    })
}

fn deploy(row: &Row) -> Result<Deploy, DbError> {
    Ok(Deploy {
        id: row.try_get("id")?,
        service: row.try_get("service")?,
        environment: row.try_get("environment")?,
        artifact: row.try_get("artifact")?,
        status: "started",
        created_at: row.try_get("created_at")?,
    })
}

fn notification(row: &Row) -> Result<Notification, DbError> {
    let effect_id: uuid::Uuid = row.try_get("effect_id")?;
    let attempts: i32 = row.try_get("attempts")?;
    Ok(Notification {
        effect_id: effect_id.to_string(),
        ticket_id: row.try_get("ticket_id")?,
        attempts: u32::try_from(attempts).unwrap_or(0),
    })
}
