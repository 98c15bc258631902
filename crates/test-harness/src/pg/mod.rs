//! A real PostgreSQL for tests: a throwaway cluster started by the test process itself, or
//! the server named by `DATABASE_URL`. Every test gets a fresh database, so tests run in
//! parallel without seeing each other's rows.
//!
//! Without `DATABASE_URL`, the first call starts one cluster per test process: `initdb` into
//! a temporary directory (trust auth, `fsync=off` — see [`ClusterOptions`]), then `pg_ctl start` on a free loopback
//! port with the socket in that directory. The binaries are found via `PG_BINDIR`,
//! `pg_config --bindir`, `PATH`, or Debian's `/usr/lib/postgresql/<version>/bin`. As root,
//! the server runs under the `postgres` system account (PostgreSQL refuses to run as root).
//! A small shell guard owns the cluster: it holds a pipe from the test process and, when
//! that pipe closes — the process exited, normally or not — stops the server and deletes the
//! directory. When no PostgreSQL can be found or started the call **panics** with
//! installation advice: PostgreSQL tests fail, they never skip.
//!
//! Besides the tests, the load benchmark starts a durable cluster with
//! [`TestCluster::launch_with`] and the chaos soak one with [`TestCluster::launch`]; the
//! module depends on nothing but `tokio`, `tokio-postgres` and `uuid`.

mod cluster;
mod system;

use std::sync::OnceLock;

pub use cluster::{ClusterOptions, TestCluster};
pub use system::{account_ids, find_bindir, running_as_root};

const INSTALL_HINT: &str = "PostgreSQL tests need a PostgreSQL server. Either install the server binaries \
     (Debian/Ubuntu: `apt-get install postgresql`; the tests find initdb/pg_ctl/postgres via PG_BINDIR, \
     `pg_config --bindir`, PATH or /usr/lib/postgresql/<version>/bin and start a throwaway cluster), or set \
     DATABASE_URL to a server where the test role may CREATE DATABASE.";

/// A fresh, empty database for one test.
#[derive(Debug)]
pub struct TestDatabase {
    url: String,
    name: String,
    /// Set when the database lives on an external server (`DATABASE_URL`) and must be
    /// dropped; a throwaway cluster is deleted wholesale instead.
    drop_via: Option<String>,
}

impl TestDatabase {
    /// Connection URL of the database (`postgres://…`).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The database name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// A plain client on the database, for tests that read or set up tables directly.
    pub async fn client(&self) -> tokio_postgres::Client {
        connect(&self.url).await
    }
}

/// A plain client on `url`; its connection runs in a task of its own. Panics when the
/// server cannot be reached: PostgreSQL tests fail, they never skip.
pub async fn connect(url: &str) -> tokio_postgres::Client {
    admin_client(url)
        .await
        .unwrap_or_else(|err| panic!("cannot connect to {url}: {err}"))
}

impl Drop for TestDatabase {
    fn drop(&mut self) {
        let Some(admin_url) = self.drop_via.take() else {
            return;
        };
        let name = self.name.clone();
        // Best effort, on a thread of its own: Drop cannot await, and the test's runtime
        // may be shutting down.
        let _ = std::thread::spawn(move || {
            let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            runtime.block_on(async move {
                if let Ok(client) = admin_client(&admin_url).await {
                    let _ = client
                        .batch_execute(&format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"))
                        .await;
                }
            });
        })
        .join();
    }
}

/// A fresh database on the process's throwaway cluster, or on the `DATABASE_URL` server when
/// that variable is set. Panics (with installation advice) when neither works.
pub async fn test_database() -> TestDatabase {
    match std::env::var("DATABASE_URL") {
        Ok(url) if !url.trim().is_empty() => {
            let name = fresh_name();
            create_database(&url, &name).await;
            TestDatabase {
                url: with_database(&url, &name),
                name,
                drop_via: Some(url),
            }
        }
        _ => shared_cluster().create_database().await,
    }
}

/// The throwaway cluster shared by every test of this process (started on first use).
pub fn shared_cluster() -> &'static TestCluster {
    static SHARED: OnceLock<TestCluster> = OnceLock::new();
    SHARED.get_or_init(TestCluster::launch)
}

fn fresh_name() -> String {
    format!("test_{}", uuid::Uuid::new_v4().simple())
}

async fn admin_client(url: &str) -> Result<tokio_postgres::Client, tokio_postgres::Error> {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls).await?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(client)
}

async fn create_database(admin_url: &str, name: &str) {
    let client = admin_client(admin_url).await.unwrap_or_else(|err| {
        panic!("cannot connect to the test PostgreSQL server: {err}. {INSTALL_HINT}")
    });
    client
        .batch_execute(&format!("CREATE DATABASE \"{name}\""))
        .await
        .unwrap_or_else(|err| panic!("cannot create test database {name}: {err}. {INSTALL_HINT}"));
}

/// `url` with its database replaced by `name`; handles URLs and `key=value` strings.
fn with_database(url: &str, name: &str) -> String {
    if let Some(scheme_end) = url.find("://") {
        let after = scheme_end + 3;
        let rest = &url[after..];
        let query_at = rest.find('?').map_or(url.len(), |i| after + i);
        let path_at = rest[..query_at - after]
            .find('/')
            .map_or(query_at, |i| after + i);
        format!("{}/{name}{}", &url[..path_at], &url[query_at..])
    } else {
        let kept: Vec<&str> = url
            .split_whitespace()
            .filter(|pair| !pair.starts_with("dbname="))
            .collect();
        format!("{} dbname={name}", kept.join(" "))
    }
}

#[cfg(test)]
mod tests {
    use super::with_database;

    #[test]
    fn replaces_the_database_in_urls() {
        assert_eq!(
            with_database("postgres://u@h:5432/app", "t"),
            "postgres://u@h:5432/t"
        );
        assert_eq!(
            with_database("postgres://u@h:5432", "t"),
            "postgres://u@h:5432/t"
        );
        assert_eq!(
            with_database("postgres://u@h/app?sslmode=disable", "t"),
            "postgres://u@h/t?sslmode=disable"
        );
        assert_eq!(
            with_database("host=h user=u dbname=app", "t"),
            "host=h user=u dbname=t"
        );
    }
}
