//! Command-line configuration of the demo server.
//!
//! Parsing is hand-written and strict: an unknown flag, a missing value or a value that does
//! not parse is an error, so a typo never silently runs the server with a default.

use std::net::SocketAddr;
use std::time::Duration;

/// The `--help` text.
pub const USAGE: &str = "\
demo: a small write API (tickets, payments, deploys) guarded by tower-idempotency

USAGE:
    demo [--listen ADDR] [--database-url URL] [--handler-delay-ms N] [--lease-ms N]
         [--wait-ms N] [--no-heartbeat] [--no-idempotency]
         [--non-transactional | --memory-records]

OPTIONS:
    --listen ADDR           address to listen on (default 127.0.0.1:3000; port 0 picks one)
    --database-url URL      PostgreSQL: the idempotency store and the tickets, payments,
                            deploys and notifications live there; ticket and payment
                            writes commit in one transaction with their idempotency
                            record, and ticket notifications go through the outbox.
                            Without it (and without DATABASE_URL) everything is in
                            memory and lives in this process only
    --handler-delay-ms N    every write handler sleeps N ms after its write (default 0)
    --lease-ms N            in-progress lease of an operation (default 60000); renewed
                            every third of it while the handler runs
    --no-heartbeat          do not renew leases: a handler slower than its lease reads
                            as an unknown outcome (for demonstrating that case)
    --wait-ms N             how long a duplicate waits for an in-progress original
                            (default 10000)
    --no-idempotency        same routes without the idempotency layer (baseline); with a
                            database URL the records stay in PostgreSQL, written in
                            autocommit as with --non-transactional
    --non-transactional     with a database URL: records in PostgreSQL, but every handler
                            writes in autocommit through the pool, outside the
                            operation's transaction (ordinary, non-transactional routes)
    --memory-records        with a database URL: only the idempotency store is in
                            PostgreSQL; the records live in this process's memory
    -h, --help              print this help

ENVIRONMENT:
    DATABASE_URL            used when --database-url is not given
    RUST_LOG                log filter (default info); logs go to stderr
";

/// Where the business records (tickets, payments, deploys, notifications) live and how the
/// handlers write them, when the demo has a database URL. Without one, everything is in
/// memory, and the two flags that only make sense with a database are refused as mistakes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Records {
    /// In PostgreSQL; tickets and payments are transactional routes: the handler's write,
    /// the stored response and the operation's completion commit together, and a new
    /// ticket's notification is enqueued in the same transaction (the default). Without the
    /// idempotency layer there is no operation transaction, and the handlers write as with
    /// [`Records::NonTransactional`].
    #[default]
    Transactional,
    /// In PostgreSQL, written in autocommit through the pool, outside the operation's
    /// transaction; the routes have ordinary policies (`--non-transactional`).
    NonTransactional,
    /// In this process's memory; only the idempotency store is in PostgreSQL
    /// (`--memory-records`).
    Memory,
}

/// How the demo server runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Address to listen on; port 0 lets the OS pick one.
    pub listen: SocketAddr,
    /// PostgreSQL URL of the idempotency store and, unless [`Records::Memory`], of the
    /// records; `None` keeps everything in memory.
    pub database_url: Option<String>,
    /// How long every write handler sleeps after performing its write, so that faults
    /// (disconnects, crashes, lease expiry) can be made to land between effect and response.
    pub handler_delay: Duration,
    /// In-progress lease of an operation: past it, an unfinished operation's outcome is
    /// unknown.
    pub lease: Duration,
    /// How long a duplicate request waits for an in-progress original before answering
    /// `409 request-in-progress`.
    pub wait: Duration,
    /// Whether the layer renews leases while handlers run (`--no-heartbeat` turns it
    /// off, so that a slow handler shows the unknown-outcome case without a crash).
    pub heartbeat: bool,
    /// Whether write routes are guarded by the idempotency layer (`--no-idempotency`
    /// turns it off, as a baseline).
    pub idempotency: bool,
    /// Where the records live with a database URL, and how they are written.
    pub records: Records,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 3000)),
            database_url: None,
            handler_delay: Duration::ZERO,
            lease: Duration::from_secs(60),
            wait: Duration::from_secs(10),
            heartbeat: true,
            idempotency: true,
            records: Records::Transactional,
        }
    }
}

impl Config {
    /// Parses the command-line arguments that follow the program name.
    ///
    /// Accepts `--flag VALUE` and `--flag=VALUE`. `--help` is answered with
    /// `Err(USAGE)`; callers that want to print help and exit 0 check for it first
    /// (see [`Config::wants_help`]). `DATABASE_URL` is not read here: the environment is
    /// the binary's business.
    ///
    /// ```
    /// use std::time::Duration;
    ///
    /// let args = ["--listen", "127.0.0.1:0", "--handler-delay-ms=250", "--no-idempotency"];
    /// let config = demo::Config::from_args(args.iter().map(|a| a.to_string())).unwrap();
    /// assert_eq!(config.listen.port(), 0);
    /// assert_eq!(config.handler_delay, Duration::from_millis(250));
    /// assert!(!config.idempotency);
    /// assert!(demo::Config::from_args(["--lease-ms".to_string()].into_iter()).is_err());
    /// ```
    pub fn from_args(args: impl Iterator<Item = String>) -> Result<Self, String> {
        let mut config = Self::default();
        let mut args = args;
        while let Some(arg) = args.next() {
            let (flag, inline) = match arg.split_once('=') {
                Some((flag, value)) if flag.starts_with("--") => {
                    (flag.to_owned(), Some(value.to_owned()))
                }
                _ => (arg, None),
            };
            let mut value = |name: &str| -> Result<String, String> {
                match inline.clone().or_else(|| args.next()) {
                    Some(v) => Ok(v),
                    None => Err(format!("{name} needs a value\n\n{USAGE}")),
                }
            };
            match flag.as_str() {
                "--listen" => {
                    let raw = value("--listen")?;
                    config.listen = raw.parse().map_err(|_| {
                        format!("--listen: `{raw}` is not an address like 127.0.0.1:3000")
                    })?;
                }
                "--database-url" => {
                    let raw = value("--database-url")?;
                    if raw.is_empty() {
                        return Err("--database-url: the URL is empty".to_owned());
                    }
                    config.database_url = Some(raw);
                }
                "--handler-delay-ms" => {
                    config.handler_delay =
                        millis("--handler-delay-ms", &value("--handler-delay-ms")?)?
                }
                "--lease-ms" => {
                    config.lease = millis("--lease-ms", &value("--lease-ms")?)?;
                    if config.lease.is_zero() {
                        return Err("--lease-ms: the lease must be at least 1 ms".to_owned());
                    }
                }
                "--wait-ms" => config.wait = millis("--wait-ms", &value("--wait-ms")?)?,
                "--no-idempotency" if inline.is_none() => config.idempotency = false,
                "--no-heartbeat" if inline.is_none() => config.heartbeat = false,
                "--non-transactional" if inline.is_none() => {
                    config.records = pick(config.records, Records::NonTransactional)?
                }
                "--memory-records" if inline.is_none() => {
                    config.records = pick(config.records, Records::Memory)?
                }
                "-h" | "--help" => return Err(USAGE.to_owned()),
                other => return Err(format!("unknown argument `{other}`\n\n{USAGE}")),
            }
        }
        Ok(config)
    }

    /// Whether the arguments ask for `--help` (checked before parsing, so that help wins
    /// over any other mistake on the line).
    pub fn wants_help(args: &[String]) -> bool {
        args.iter().any(|a| a == "--help" || a == "-h")
    }
}

/// `--non-transactional` and `--memory-records` contradict each other.
fn pick(current: Records, wanted: Records) -> Result<Records, String> {
    if current == Records::Transactional || current == wanted {
        Ok(wanted)
    } else {
        Err("--non-transactional and --memory-records exclude each other".to_owned())
    }
}

fn millis(flag: &str, raw: &str) -> Result<Duration, String> {
    raw.parse::<u64>()
        .map(Duration::from_millis)
        .map_err(|_| format!("{flag}: `{raw}` is not a whole number of milliseconds"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Config, String> {
        Config::from_args(args.iter().map(|a| (*a).to_owned()))
    }

    #[test]
    fn defaults_without_arguments() {
        assert_eq!(parse(&[]).unwrap(), Config::default());
        assert!(Config::default().idempotency);
    }

    #[test]
    fn every_flag_in_both_spellings() {
        let config = parse(&[
            "--listen",
            "0.0.0.0:8080",
            "--database-url=postgres://localhost/x",
            "--handler-delay-ms",
            "800",
            "--lease-ms=200",
            "--wait-ms",
            "100",
            "--no-idempotency",
        ])
        .unwrap();
        assert_eq!(config.records, Records::Transactional);
        assert_eq!(
            parse(&["--non-transactional"]).unwrap().records,
            Records::NonTransactional
        );
        assert_eq!(
            parse(&["--memory-records"]).unwrap().records,
            Records::Memory
        );
        assert_eq!(config.listen, "0.0.0.0:8080".parse().unwrap());
        assert_eq!(
            config.database_url.as_deref(),
            Some("postgres://localhost/x")
        );
        assert_eq!(config.handler_delay, Duration::from_millis(800));
        assert_eq!(config.lease, Duration::from_millis(200));
        assert_eq!(config.wait, Duration::from_millis(100));
        assert!(!config.idempotency);
    }

    #[test]
    fn mistakes_are_errors() {
        for args in [
            &["--listen"][..],
            &["--listen", "localhost"],
            &["--handler-delay-ms", "-1"],
            &["--lease-ms", "0"],
            &["--wait-ms", "1.5"],
            &["--database-url="],
            &["--no-idempotency=yes"],
            &["--transactional"],
            &["--non-transactional=yes"],
            &["--memory-records", "--non-transactional"],
            &["--non-transactional", "--memory-records"],
            &["--verbose"],
            &["serve"],
        ] {
            assert!(parse(args).is_err(), "{args:?} should be rejected");
        }
    }

    #[test]
    fn help_is_recognised() {
        assert_eq!(parse(&["--help"]).unwrap_err(), USAGE);
        assert!(Config::wants_help(&["--lease-ms".into(), "-h".into()]));
        assert!(!Config::wants_help(&[
            "--listen".into(),
            "127.0.0.1:1".into()
        ]));
    }
}
