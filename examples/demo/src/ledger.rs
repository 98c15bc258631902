//! The demo's business state: tickets, payments, deploys and ticket notifications, per
//! account, in memory (without a database URL, or with `--memory-records`; otherwise they
//! live in PostgreSQL, see [`crate::database`]).
//!
//! Each write decides and records under one lock, so the business rules (one ticket per
//! `source_event_id`, one payment per `invoice_ref`, one running deploy per environment) hold
//! even without the idempotency layer. Those rules are domain deduplication; they complement
//! idempotency keys, they do not replace them (a retried deploy has no natural key).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::SystemTime;

use serde::Serialize;

use crate::commands::{NewDeploy, NewPayment, NewTicket};

/// A ticket as stored and returned.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Ticket {
    /// `tkt_<32 hex>`.
    pub id: String,
    /// Project the ticket belongs to.
    pub project: String,
    /// One-line summary.
    pub title: String,
    /// `low`, `normal` or `high`.
    pub priority: String,
    /// Free text.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// Upstream event that caused the ticket.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source_event_id: Option<String>,
    /// RFC 3339 creation time.
    pub created_at: String,
}

/// A captured payment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Payment {
    /// `pay_<32 hex>`.
    pub id: String,
    /// Amount in minor units.
    pub amount_minor: u64,
    /// ISO 4217 code.
    pub currency: String,
    /// The invoice paid.
    pub invoice_ref: String,
    /// Who was paid.
    pub payee: String,
    /// Always `captured` in the demo.
    pub status: &'static str,
    /// RFC 3339 creation time.
    pub created_at: String,
}

/// A started deploy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Deploy {
    /// `dep_<32 hex>`.
    pub id: String,
    /// Service deployed.
    pub service: String,
    /// Target environment.
    pub environment: String,
    /// Immutable artifact digest.
    pub artifact: String,
    /// Always `started` in the demo.
    pub status: &'static str,
    /// RFC 3339 creation time.
    pub created_at: String,
}

/// A ticket notification as the notification sink recorded it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Notification {
    /// The effect id the notification was delivered under (derived from the operation that
    /// created the ticket).
    pub effect_id: String,
    /// The ticket it announces.
    pub ticket_id: String,
    /// How many times the sink received this effect id.
    pub attempts: u32,
}

/// Why a deploy was refused: another deploy to the environment is still running.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("a deploy to environment {environment} is already running")]
pub struct EnvironmentLocked {
    /// The environment.
    pub environment: String,
}

/// Why a payment was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invoice {invoice_ref} was already paid by payment {payment_id}")]
pub struct InvoiceAlreadyPaid {
    /// The invoice.
    pub invoice_ref: String,
    /// The payment that paid it.
    pub payment_id: String,
}

#[derive(Debug, Default)]
struct Books {
    tickets: Vec<Ticket>,
    payments: Vec<Payment>,
    deploys: Vec<Deploy>,
    notifications: Vec<Notification>,
    running_deploys: HashSet<String>,
}

/// All accounts' records. Cheap to clone (shared).
#[derive(Debug, Clone, Default)]
pub struct Ledger {
    accounts: Arc<Mutex<HashMap<String, Books>>>,
}

impl Ledger {
    /// An empty ledger.
    pub fn new() -> Self {
        Self::default()
    }

    /// Creates a ticket, or returns the account's existing ticket for the same
    /// `source_event_id`. The flag is `true` when a ticket was created; only then is a
    /// notification recorded, under `effect_id`.
    pub fn create_ticket(
        &self,
        account: &str,
        command: NewTicket,
        effect_id: uuid::Uuid,
    ) -> (Ticket, bool) {
        let mut accounts = self.lock();
        let books = accounts.entry(account.to_owned()).or_default();
        if let Some(event) = &command.source_event_id
            && let Some(existing) = books
                .tickets
                .iter()
                .find(|t| t.source_event_id.as_ref() == Some(event))
        {
            return (existing.clone(), false);
        }
        let ticket = Ticket {
            id: new_id("tkt"),
            project: command.project,
            title: command.title,
            priority: command.priority,
            description: command.description,
            source_event_id: command.source_event_id,
            created_at: now(),
        };
        books.tickets.push(ticket.clone());
        books.notifications.push(Notification {
            effect_id: effect_id.to_string(),
            ticket_id: ticket.id.clone(),
            attempts: 1,
        });
        (ticket, true)
    }

    /// Captures a payment unless the account already paid the invoice.
    pub fn capture_payment(
        &self,
        account: &str,
        command: NewPayment,
    ) -> Result<Payment, InvoiceAlreadyPaid> {
        let mut accounts = self.lock();
        let books = accounts.entry(account.to_owned()).or_default();
        if let Some(existing) = books
            .payments
            .iter()
            .find(|p| p.invoice_ref == command.invoice_ref)
        {
            return Err(InvoiceAlreadyPaid {
                invoice_ref: command.invoice_ref,
                payment_id: existing.id.clone(),
            });
        }
        let payment = Payment {
            id: new_id("pay"),
            amount_minor: command.amount_minor,
            currency: command.currency,
            invoice_ref: command.invoice_ref,
            payee: command.payee,
            status: "captured",
            created_at: now(),
        };
        books.payments.push(payment.clone());
        Ok(payment)
    }

    /// Starts a deploy and locks its environment until the returned lease is dropped; a
    /// second deploy to the environment meanwhile is refused. Every other call starts one:
    /// deploys have no natural key, which is what the idempotency key is for.
    pub fn start_deploy(
        &self,
        account: &str,
        command: NewDeploy,
    ) -> Result<(Deploy, EnvironmentLease), EnvironmentLocked> {
        let mut accounts = self.lock();
        let books = accounts.entry(account.to_owned()).or_default();
        let environment = command.environment.as_str().to_owned();
        if !books.running_deploys.insert(environment.clone()) {
            return Err(EnvironmentLocked { environment });
        }
        let deploy = Deploy {
            id: new_id("dep"),
            service: command.service,
            environment,
            artifact: command.artifact,
            status: "started",
            created_at: now(),
        };
        books.deploys.push(deploy.clone());
        let lease = EnvironmentLease {
            ledger: self.clone(),
            account: account.to_owned(),
            environment: deploy.environment.clone(),
        };
        Ok((deploy, lease))
    }

    /// The account's ticket notifications, oldest first.
    pub fn notifications(&self, account: &str) -> Vec<Notification> {
        self.lock()
            .get(account)
            .map(|b| b.notifications.clone())
            .unwrap_or_default()
    }

    /// The account's tickets, oldest first.
    pub fn tickets(&self, account: &str) -> Vec<Ticket> {
        self.lock()
            .get(account)
            .map(|b| b.tickets.clone())
            .unwrap_or_default()
    }

    /// The account's payments, oldest first.
    pub fn payments(&self, account: &str) -> Vec<Payment> {
        self.lock()
            .get(account)
            .map(|b| b.payments.clone())
            .unwrap_or_default()
    }

    /// The account's deploys, oldest first.
    pub fn deploys(&self, account: &str) -> Vec<Deploy> {
        self.lock()
            .get(account)
            .map(|b| b.deploys.clone())
            .unwrap_or_default()
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, Books>> {
        // A panic while holding the lock cannot leave a half-written record (every write is
        // one push), so the data stays usable.
        self.accounts.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A running deploy's hold on its environment; dropping it frees the environment.
#[derive(Debug)]
pub struct EnvironmentLease {
    ledger: Ledger,
    account: String,
    environment: String,
}

impl Drop for EnvironmentLease {
    fn drop(&mut self) {
        if let Some(books) = self.ledger.lock().get_mut(&self.account) {
            books.running_deploys.remove(&self.environment);
        }
    }
}

pub(crate) fn new_id(prefix: &str) -> String {
    format!("{prefix}_{}", uuid::Uuid::new_v4().simple())
}

pub(crate) fn now() -> String {
    humantime::format_rfc3339_millis(SystemTime::now()).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ticket(event: Option<&str>) -> NewTicket {
        NewTicket {
            project: "p".into(),
            title: "t".into(),
            priority: "normal".into(),
            description: None,
            source_event_id: event.map(Into::into),
        }
    }

    #[test]
    fn source_event_dedupes_per_account() {
        let ledger = Ledger::new();
        let effect = uuid::Uuid::new_v4();
        let (first, created) = ledger.create_ticket("a", ticket(Some("evt_1")), effect);
        assert!(created);
        assert!(first.id.starts_with("tkt_") && first.id.len() == 36);
        let (again, created) =
            ledger.create_ticket("a", ticket(Some("evt_1")), uuid::Uuid::new_v4());
        assert!(!created);
        assert_eq!(again, first);
        let (_, created) = ledger.create_ticket("b", ticket(Some("evt_1")), uuid::Uuid::new_v4());
        assert!(created, "another account has its own events");
        ledger.create_ticket("a", ticket(None), uuid::Uuid::new_v4());
        ledger.create_ticket("a", ticket(None), uuid::Uuid::new_v4());
        assert_eq!(ledger.tickets("a").len(), 3);
        let notifications = ledger.notifications("a");
        assert_eq!(notifications.len(), 3, "one per created ticket");
        assert_eq!(notifications[0].effect_id, effect.to_string());
        assert_eq!(notifications[0].ticket_id, first.id);
        assert_eq!(ledger.tickets("b").len(), 1);
        assert!(ledger.tickets("c").is_empty());
    }

    #[test]
    fn an_invoice_is_paid_once() {
        let ledger = Ledger::new();
        let pay = || NewPayment {
            amount_minor: 5,
            currency: "EUR".into(),
            invoice_ref: "I-1".into(),
            payee: "P".into(),
        };
        let paid = ledger.capture_payment("a", pay()).unwrap();
        let refused = ledger.capture_payment("a", pay()).unwrap_err();
        assert_eq!(refused.payment_id, paid.id);
        assert!(ledger.capture_payment("b", pay()).is_ok());
        assert_eq!(ledger.payments("a").len(), 1);
    }

    #[test]
    fn one_running_deploy_per_environment() {
        let ledger = Ledger::new();
        let deploy = |environment: &str| NewDeploy {
            service: "api".into(),
            environment: crate::commands::Environment::parse(environment).unwrap(),
            artifact: "sha256:00".into(),
        };
        let (_, lease) = ledger.start_deploy("a", deploy("development")).unwrap();
        assert!(ledger.start_deploy("a", deploy("development")).is_err());
        assert!(ledger.start_deploy("a", deploy("staging")).is_ok());
        assert!(ledger.start_deploy("b", deploy("development")).is_ok());
        drop(lease);
        assert!(ledger.start_deploy("a", deploy("development")).is_ok());
        assert_eq!(ledger.deploys("a").len(), 3);
    }
}
