//! The PgBouncer of the `pgbouncer` topology: the test harness's ([`Pgbouncer`]: Debian's
//! package in transaction pooling mode on loopback) between the instances and PostgreSQL,
//! its fault (`SIGKILL`, then a start on the same port), and what it saw: transactions and
//! queries it pooled (its admin console's `SHOW STATS`, summed over its restarts), client
//! logins and server connections opened and closed (its log).
//!
//! PgBouncer runs each transaction, or each statement outside one, on whichever server
//! connection is free, so the instances send unnamed statements (`--pg-statements
//! unnamed`); its server pool is smaller than the instances' pools together, so their
//! transactions share server connections.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use test_harness::pgbouncer::{Pgbouncer, PgbouncerOptions};
use tokio_postgres::SimpleQueryMessage;

/// PgBouncer's settings beyond the harness's: a failed server login is retried after 1 s
/// (not 15: PostgreSQL restarts and crashes are short), a server connect gives up after 2 s
/// like the store's, and `SHOW STATS` totals are refreshed every second (without a log
/// line each time).
const SETTINGS: &str = "server_login_retry = 1\n\
                        server_connect_timeout = 2\n\
                        stats_period = 1\n\
                        log_stats = 0\n";

/// The soak's PgBouncer.
#[derive(Debug)]
pub struct Bouncer {
    pgbouncer: Arc<Pgbouncer>,
    /// The database whose statistics count.
    dbname: String,
    /// Transactions and queries of the PgBouncer processes killed so far (their last
    /// `SHOW STATS`).
    earlier: [AtomicU64; 2],
}

/// What PgBouncer saw over the soak.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Seen {
    /// Transactions it pooled (each statement outside a transaction counts as one).
    pub transactions: u64,
    /// Queries it forwarded.
    pub queries: u64,
    /// Client logins (the instances' pooled connections, each time one was opened).
    pub client_logins: u64,
    /// Server connections it opened to PostgreSQL.
    pub server_connections: u64,
    /// Server connections closed, by PgBouncer's reason.
    pub server_closes: BTreeMap<String, u64>,
}

impl Bouncer {
    /// Starts PgBouncer in front of the PostgreSQL server (or the proxy to it) on
    /// `upstream_port`, with `pool_size` server connections for `dbname`.
    pub async fn start(upstream_port: u16, pool_size: usize, dbname: &str) -> Result<Self, String> {
        let options = PgbouncerOptions {
            pool_size,
            settings: SETTINGS.to_owned(),
        };
        let pgbouncer =
            tokio::task::spawn_blocking(move || Pgbouncer::start(upstream_port, &options))
                .await
                .map_err(|e| format!("PgBouncer did not start: {e}"))??;
        Ok(Self {
            pgbouncer: Arc::new(pgbouncer),
            dbname: dbname.to_owned(),
            earlier: [AtomicU64::new(0), AtomicU64::new(0)],
        })
    }

    /// The port PgBouncer listens on.
    pub fn port(&self) -> u16 {
        self.pgbouncer.port()
    }

    /// Kills PgBouncer with `SIGKILL`: every client and server connection dies with it.
    /// Its statistics are read first, so that they count.
    pub async fn kill(&self) -> Result<(), String> {
        if let Ok((transactions, queries)) = self.stats().await {
            self.earlier[0].fetch_add(transactions, Ordering::Relaxed);
            self.earlier[1].fetch_add(queries, Ordering::Relaxed);
        }
        let pgbouncer = self.pgbouncer.clone();
        tokio::task::spawn_blocking(move || pgbouncer.kill())
            .await
            .map_err(|e| format!("PgBouncer could not be killed: {e}"))
    }

    /// Starts PgBouncer again on its port after [`Bouncer::kill`].
    pub async fn start_again(&self) -> Result<(), String> {
        let pgbouncer = self.pgbouncer.clone();
        tokio::task::spawn_blocking(move || pgbouncer.restart())
            .await
            .map_err(|e| format!("PgBouncer did not start again: {e}"))?
            .map_err(|e| format!("PgBouncer did not start again: {e}"))
    }

    /// `SHOW STATS` of the running PgBouncer: total transactions and queries for the
    /// soak's database.
    async fn stats(&self) -> Result<(u64, u64), String> {
        let url = self.pgbouncer.admin_url();
        let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
            .await
            .map_err(|e| format!("PgBouncer's admin console: {e}"))?;
        tokio::spawn(connection);
        let messages = client
            .simple_query("SHOW STATS")
            .await
            .map_err(|e| format!("SHOW STATS: {e}"))?;
        for message in messages {
            let SimpleQueryMessage::Row(row) = message else {
                continue;
            };
            if row.get("database") != Some(self.dbname.as_str()) {
                continue;
            }
            let total = |column: &str| {
                row.get(column)
                    .and_then(|value| value.parse::<u64>().ok())
                    .ok_or_else(|| format!("SHOW STATS has no {column}"))
            };
            return Ok((total("total_xact_count")?, total("total_query_count")?));
        }
        Ok((0, 0))
    }

    /// What PgBouncer saw, its restarts included.
    pub async fn seen(&self) -> Result<Seen, String> {
        let (transactions, queries) = self.stats().await?;
        let mut seen = read_log(&self.pgbouncer.log());
        seen.transactions = transactions + self.earlier[0].load(Ordering::Relaxed);
        seen.queries = queries + self.earlier[1].load(Ordering::Relaxed);
        Ok(seen)
    }
}

/// Counts client logins and server connections opened and closed in PgBouncer's log. Its
/// lines name the connection (`C-0x…` a client, `S-0x…` a server) and then the event:
/// `login attempt: …`, `new connection to server …`, `closing because: REASON (age=…)`.
fn read_log(log: &str) -> Seen {
    let mut seen = Seen::default();
    for line in log.lines() {
        if line.contains(" C-0x") && line.contains("login attempt:") {
            seen.client_logins += 1;
        }
        if !line.contains(" S-0x") {
            continue;
        }
        if line.contains("new connection to server") {
            seen.server_connections += 1;
        } else if let Some((_, reason)) = line.split_once("closing because: ") {
            let reason = reason.split(" (age=").next().unwrap_or(reason).trim();
            *seen.server_closes.entry(reason.to_owned()).or_default() += 1;
        }
    }
    seen
}

impl Seen {
    /// The server connections closed, most frequent reason first: `N (REASON: n, …)`.
    pub fn closes(&self) -> String {
        let total: u64 = self.server_closes.values().sum();
        let mut reasons: Vec<(&String, &u64)> = self.server_closes.iter().collect();
        reasons.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
        let listed: Vec<String> = reasons
            .iter()
            .map(|(reason, n)| format!("{reason}: {n}"))
            .collect();
        if listed.is_empty() {
            total.to_string()
        } else {
            format!("{total} ({})", listed.join(", "))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_log_is_read_by_connection_and_event() {
        // Lines as PgBouncer 1.18 writes them.
        let log = "\
2026-12-02 00:00:01.000 UTC [100] LOG C-0x55d1: chaos_x/postgres@127.0.0.1:40000 login attempt: db=chaos_x user=postgres tls=no
2026-12-02 00:00:01.001 UTC [100] LOG S-0x55e1: chaos_x/postgres@127.0.0.1:5432 new connection to server (from 127.0.0.1:41000)
2026-12-02 00:00:01.002 UTC [100] LOG S-0x55e2: chaos_x/postgres@127.0.0.1:5432 new connection to server (from 127.0.0.1:41001)
2026-12-02 00:00:02.000 UTC [100] LOG S-0x55e1: chaos_x/postgres@127.0.0.1:5432 closing because: server conn crashed? (age=1s)
2026-12-02 00:00:02.001 UTC [100] LOG S-0x55e2: chaos_x/postgres@127.0.0.1:5432 closing because: server conn crashed? (age=1s)
2026-12-02 00:00:02.002 UTC [100] LOG C-0x55d1: chaos_x/postgres@127.0.0.1:40000 closing because: client unexpected eof (age=1s)
2026-12-02 00:00:03.000 UTC [101] LOG S-0x55e3: chaos_x/postgres@127.0.0.1:5432 closing because: unclean server (age=0s)
2026-12-02 00:00:03.000 UTC [101] LOG stats: 0 xacts/s, 0 queries/s
";
        let seen = read_log(log);
        assert_eq!(seen.client_logins, 1);
        assert_eq!(seen.server_connections, 2);
        assert_eq!(
            seen.server_closes,
            BTreeMap::from([
                ("server conn crashed?".to_owned(), 2),
                ("unclean server".to_owned(), 1),
            ])
        );
        assert_eq!(
            seen.closes(),
            "3 (server conn crashed?: 2, unclean server: 1)"
        );
        assert_eq!(Seen::default().closes(), "0");
    }
}
