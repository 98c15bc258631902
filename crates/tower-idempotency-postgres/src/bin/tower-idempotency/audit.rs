//! `tower-idempotency audit …`: the journal's verbs. `keygen`, `verify FILE`,
//! `verify-proof` and `show FILE` work on files and never touch a database; `export`,
//! `verify` and `show` without a file, `prove`, `seal` and `status` read (or, for `seal`,
//! extend) the journal in the database named by `DATABASE_URL` or `--database-url-file`.

use std::fs::File;
use std::io::{BufReader, Write};
use std::path::{Path, PathBuf};

use clap::Subcommand;
use tower_idempotency_audit::{
    AuditEventKind, CheckpointSource, Correlation, EventProof, JournalLine, JournalReader,
    ModifiedEvidence, NoteSigningKey, NoteVerifyingKey, SealedEvent, VerifiedJournal, Verifier,
    VerifyError, Violation,
};
use tower_idempotency_core::OperationId;

use tower_idempotency_postgres::{
    AuditError, PostgresJournal, PostgresJournalConfig, PostgresStore,
};

use super::Failure;

/// Shown under every audit command's help.
pub(crate) const AUDIT_EXIT_CODES: &str = "\
EXIT CODES:
    0 ok (the journal or proof verifies), 1 not found (no event of the operation),
    2 usage error (including a key that does not parse), 3 database unreachable,
    5 other database failure,
    6 violation (the journal or a proof does not verify; the verdict names the first problem;
      for verify --strict: also a journal that verifies but fails the strict check;
      for seal: the journal in the database is not the one its sealer left),
    7 a file cannot be read or written

KEY is the public verifier key text (`name+id+base64`, as `audit keygen` prints it) or
`@FILE`, a file whose first line is that text.";

/// The audit journal's offline verbs.
#[derive(Debug, Subcommand)]
pub(crate) enum AuditCommand {
    /// Make an Ed25519 signing key for the journal's checkpoints.
    ///
    /// With --out FILE the private key goes to FILE (created with mode 0600; an existing file
    /// is never overwritten) and the public verifier key to FILE.pub and stdout. Without
    /// --out both are printed: the private key first, then the public key.
    #[command(after_help = AUDIT_EXIT_CODES)]
    Keygen {
        /// The key's name: the checkpoints' origin line (for example `example.com/orders`)
        #[arg(long, value_name = "NAME")]
        name: String,
        /// Where the private key is written
        #[arg(long, value_name = "FILE")]
        out: Option<PathBuf>,
    },
    /// Verify an export (JSON lines of events and checkpoints): every hash, chain link,
    /// Merkle root, signature and consistency between checkpoints.
    ///
    /// Prints `ok: …` or `violation: KIND: …` naming the first violation (modified, deleted,
    /// inserted, reordered, truncated, forged, rolled back, malformed) and where it is.
    /// Without FILE, the journal in the database is exported (one snapshot) and verified.
    ///
    /// By default a journal that verifies is `ok` even when nothing vouches for its end:
    /// events after the newest checkpoint are reported as unsigned, an empty journal is ok,
    /// and without --anchor a truncation back to an earlier checkpoint is not visible. With
    /// --strict (use it for audits) those fail too, with exit 6 and a `strict: …` line
    /// naming why: an empty journal, no anchored checkpoint, an unsigned tail after the
    /// newest checkpoint, or an anchor whose newest checkpoint is older than the journal's.
    #[command(after_help = AUDIT_EXIT_CODES)]
    Verify {
        /// The export file; without it, the database's journal
        file: Option<PathBuf>,
        /// The public verifier key: the text, or @FILE
        #[arg(long, value_name = "KEY", value_parser = public_key)]
        public_key: NoteVerifyingKey,
        /// A directory of anchored checkpoint files (every regular file, in name order)
        #[arg(long, value_name = "DIR")]
        anchor: Option<PathBuf>,
        /// Also fail on an empty journal, a missing or empty anchor, an unsigned tail, or an
        /// anchor behind the journal's newest checkpoint (recommended for audits)
        #[arg(long)]
        strict: bool,
    },
    /// Check event proofs (JSON lines of `{"kind":"proof",…}`) against their signed
    /// checkpoints with only the public key
    #[command(after_help = AUDIT_EXIT_CODES)]
    VerifyProof {
        /// The proof file
        file: PathBuf,
        /// The public verifier key: the text, or @FILE
        #[arg(long, value_name = "KEY", value_parser = public_key)]
        public_key: NoteVerifyingKey,
    },
    /// Print one operation's events from an export, in journal order, one line each.
    ///
    /// This reads the export without verifying it: run `audit verify` first. Without
    /// FILE, the operation's sealed events are read from the database.
    #[command(after_help = AUDIT_EXIT_CODES)]
    Show {
        /// The export file; without it, the database's journal
        file: Option<PathBuf>,
        /// The operation id (a UUID)
        #[arg(long, value_name = "ID", value_parser = super::operation_id)]
        operation: OperationId,
    },
    /// Write the database's journal as JSON lines (events and checkpoints), the format
    /// `audit verify` reads, from one snapshot.
    ///
    /// With --since N only what follows the first N events is written (the checkpoints
    /// larger than N with it): appended to an export of those N events it makes a whole
    /// one, for shipping the journal off the machine a piece at a time.
    #[command(after_help = AUDIT_EXIT_CODES)]
    Export {
        /// The first event written
        #[arg(long, value_name = "SEQ", default_value = "0")]
        since: u64,
        /// Where the export is written (created, or truncated)
        #[arg(long, value_name = "FILE")]
        to: PathBuf,
    },
    /// Print an operation's events in the database's journal with their inclusion proofs
    /// against its newest checkpoint, one `{"kind":"proof",…}` line each, for
    /// `audit verify-proof` (which needs only the public key). Events sealed after the
    /// newest checkpoint are not proved yet.
    #[command(after_help = AUDIT_EXIT_CODES)]
    Prove {
        /// The operation id (a UUID)
        #[arg(long, value_name = "ID", value_parser = super::operation_id)]
        operation: OperationId,
        /// Write the proofs to FILE instead of stdout
        #[arg(long, value_name = "FILE")]
        to: Option<PathBuf>,
    },
    /// Seal the database's pending events into the journal and sign the checkpoints that
    /// are due, as an app's sealer would (for a database no app instance seals, or from
    /// cron). Refuses to extend a journal whose newest checkpoint another key signed.
    #[command(after_help = AUDIT_EXIT_CODES)]
    Seal {
        /// The private key file (`audit keygen --out`)
        #[arg(long, value_name = "FILE")]
        key: PathBuf,
        /// A directory where every checkpoint is also appended
        #[arg(long, value_name = "DIR")]
        anchor: Option<PathBuf>,
        /// A checkpoint at every multiple of this many events
        #[arg(long, value_name = "N", default_value = "1000", value_parser = super::positive)]
        checkpoint_every: std::num::NonZeroUsize,
    },
    /// Print how many events the database's journal holds, how many its newest
    /// checkpoint covers, and how many wait to be sealed
    #[command(after_help = AUDIT_EXIT_CODES)]
    Status,
}

/// Parses `KEY`: the verifier key text, or `@FILE` holding it on its first line.
fn public_key(text: &str) -> Result<NoteVerifyingKey, String> {
    let key_text = match text.strip_prefix('@') {
        Some(path) => {
            let content = std::fs::read_to_string(path)
                .map_err(|err| format!("cannot read the key file {path}: {err}"))?;
            content.lines().next().unwrap_or_default().trim().to_owned()
        }
        None => text.trim().to_owned(),
    };
    NoteVerifyingKey::from_text(&key_text)
        .map_err(|err| format!("not a public verifier key: {err}"))
}

/// Runs one audit verb; the database is connected to only by the verbs that need it.
pub(crate) async fn run(command: AuditCommand, target: super::Target) -> Result<(), Failure> {
    match command {
        AuditCommand::Keygen { name, out } => keygen(&name, out.as_deref()),
        AuditCommand::Verify {
            file: Some(file),
            public_key,
            anchor,
            strict,
        } => verify(&file, public_key, anchor.as_deref(), strict),
        AuditCommand::Verify {
            file: None,
            public_key,
            anchor,
            strict,
        } => verify_database(&database(target)?, public_key, anchor.as_deref(), strict).await,
        AuditCommand::VerifyProof { file, public_key } => verify_proof(&file, &public_key),
        AuditCommand::Show {
            file: Some(file),
            operation,
        } => show(&file, operation),
        AuditCommand::Show {
            file: None,
            operation,
        } => show_database(&database(target)?, operation).await,
        AuditCommand::Export { since, to } => export(&database(target)?, since, &to).await,
        AuditCommand::Prove { operation, to } => {
            prove(&database(target)?, operation, to.as_deref()).await
        }
        AuditCommand::Seal {
            key,
            anchor,
            checkpoint_every,
        } => {
            let key = signing_key(&key)?;
            let every = checkpoint_every.get() as u64;
            seal(&database(target)?, key, anchor, every).await
        }
        AuditCommand::Status => status(&database(target)?).await,
    }
}

/// The store for a verb that reads the database's journal; without a database, the usage
/// error says that a FILE would do for the verbs that take one.
fn database(target: super::Target) -> Result<PostgresStore, Failure> {
    super::connect(target)
}

fn audit_failure(error: AuditError) -> Failure {
    match error {
        AuditError::Store(error) => Failure::from(error),
        AuditError::Io(error) => Failure::File(error.to_string()),
        AuditError::Inconsistent(_) => {
            println!("violation: {error}");
            Failure::Violation("the database's journal is not intact".to_owned())
        }
        other => Failure::Database(other.to_string()),
    }
}

fn file_error(what: &str, path: &Path, err: &std::io::Error) -> Failure {
    Failure::File(format!("cannot {what} {}: {err}", path.display()))
}

fn keygen(name: &str, out: Option<&Path>) -> Result<(), Failure> {
    let key = NoteSigningKey::generate(name).map_err(|err| match err {
        tower_idempotency_audit::NoteKeyError::InvalidName => {
            Failure::Usage(format!("--name `{name}`: {err}"))
        }
        other => Failure::File(other.to_string()),
    })?;
    let public = key.verifying_key().to_text();
    let Some(path) = out else {
        println!("{}", key.to_text().as_str());
        println!("{public}");
        return Ok(());
    };
    write_private(path, key.to_text().as_str())?;
    let mut public_path = path.as_os_str().to_owned();
    public_path.push(".pub");
    let public_path = PathBuf::from(public_path);
    std::fs::write(&public_path, format!("{public}\n"))
        .map_err(|err| file_error("write", &public_path, &err))?;
    println!("{public}");
    eprintln!(
        "private key written to {} (mode 0600), public key to {}",
        path.display(),
        public_path.display()
    );
    Ok(())
}

/// Writes the private key to a new file readable only by its owner.
fn write_private(path: &Path, text: &str) -> Result<(), Failure> {
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let mut file = options
        .open(path)
        .map_err(|err| file_error("create", path, &err))?;
    file.write_all(text.as_bytes())
        .and_then(|()| file.write_all(b"\n"))
        .and_then(|()| file.sync_all())
        .map_err(|err| file_error("write", path, &err))
}

fn verifier(key: NoteVerifyingKey, anchor: Option<&Path>) -> Result<Verifier, Failure> {
    let mut verifier = Verifier::new(key);
    if let Some(dir) = anchor {
        verifier = verifier
            .with_anchor(dir)
            .map_err(|err| file_error("read the anchor", dir, &err))?;
    }
    Ok(verifier)
}

fn verify(
    file: &Path,
    key: NoteVerifyingKey,
    anchor: Option<&Path>,
    strict: bool,
) -> Result<(), Failure> {
    let verifier = verifier(key, anchor)?;
    if let Err(err) = File::open(file) {
        return Err(file_error("open", file, &err));
    }
    report(
        verifier.verify_path(file),
        &file.display().to_string(),
        strict,
    )
}

/// Prints the verdict of a verification of `what` and maps it onto the exit code. With
/// `strict`, a journal that verifies but fails [`VerifiedJournal::check_strict`] prints
/// `strict: WHY; …` (the rest of the `ok` line after it) and exits as a violation.
fn report(
    verified: Result<VerifiedJournal, VerifyError>,
    what: &str,
    strict: bool,
) -> Result<(), Failure> {
    match verified {
        Ok(verified) => {
            let line = verdict(&verified);
            let strict_failure = if strict {
                verified.check_strict().err()
            } else {
                None
            };
            if let Some(why) = strict_failure {
                let rest = line.strip_prefix("ok: ").unwrap_or(&line);
                println!("strict: {why}; {rest}");
                return Err(Failure::Violation(format!(
                    "{what} verifies but fails --strict: {why}"
                )));
            }
            println!("{line}");
            Ok(())
        }
        Err(VerifyError::Violation(violation)) => {
            println!("violation: {}", describe(&violation));
            Err(Failure::Violation(format!("{what} does not verify")))
        }
        Err(err) => Err(Failure::File(format!("{what}: {err}"))),
    }
}

async fn verify_database(
    store: &PostgresStore,
    key: NoteVerifyingKey,
    anchor: Option<&Path>,
    strict: bool,
) -> Result<(), Failure> {
    let verifier = verifier(key, anchor)?;
    let verified = store
        .verify_journal(&verifier)
        .await
        .map_err(audit_failure)?;
    report(verified, "the database's journal", strict)
}

async fn export(store: &PostgresStore, since: u64, to: &Path) -> Result<(), Failure> {
    let file = File::create(to).map_err(|err| file_error("create", to, &err))?;
    let mut out = std::io::BufWriter::new(file);
    let summary = store
        .export_journal(since, &mut out)
        .await
        .map_err(audit_failure)?;
    let file = out
        .into_inner()
        .map_err(|err| file_error("write", to, err.error()))?;
    file.sync_all()
        .map_err(|err| file_error("write", to, &err))?;
    println!(
        "exported {} event(s) and {} checkpoint(s) to {}",
        summary.events,
        summary.checkpoints,
        to.display()
    );
    Ok(())
}

async fn prove(
    store: &PostgresStore,
    operation: OperationId,
    to: Option<&Path>,
) -> Result<(), Failure> {
    let proofs = store
        .prove_journal(operation)
        .await
        .map_err(audit_failure)?;
    if proofs.is_empty() {
        return Err(Failure::NotFound(format!(
            "no event of operation {operation} is covered by a checkpoint yet"
        )));
    }
    let mut text = String::new();
    for proof in &proofs {
        text.push_str(&proof.to_line());
        text.push('\n');
    }
    match to {
        Some(path) => {
            std::fs::write(path, text).map_err(|err| file_error("write", path, &err))?;
            eprintln!("{} proof(s) written to {}", proofs.len(), path.display());
        }
        None => print!("{text}"),
    }
    Ok(())
}

/// Reads the private key written by `audit keygen --out`.
fn signing_key(path: &Path) -> Result<NoteSigningKey, Failure> {
    let text = zeroize::Zeroizing::new(
        std::fs::read_to_string(path).map_err(|err| file_error("read", path, &err))?,
    );
    NoteSigningKey::from_text(text.trim()).map_err(|err| {
        Failure::Usage(format!(
            "--key {}: not a signing key: {err}",
            path.display()
        ))
    })
}

async fn seal(
    store: &PostgresStore,
    key: NoteSigningKey,
    anchor: Option<PathBuf>,
    checkpoint_every: u64,
) -> Result<(), Failure> {
    let config = PostgresJournalConfig {
        checkpoint_every,
        anchor_dir: anchor,
        ..PostgresJournalConfig::default()
    };
    let journal = PostgresJournal::new(store, key, config).map_err(audit_failure)?;
    let report = journal.seal().await.map_err(audit_failure)?;
    if report.busy {
        println!(
            "sealed {} event(s); another sealer holds the journal, it seals the rest",
            report.sealed
        );
    } else {
        println!(
            "sealed {} event(s), signed {} checkpoint(s); the journal holds {} event(s)",
            report.sealed, report.checkpoints, report.size
        );
    }
    Ok(())
}

async fn status(store: &PostgresStore) -> Result<(), Failure> {
    let status = store.journal_status().await.map_err(audit_failure)?;
    println!(
        "{} event(s) sealed, {} covered by the newest checkpoint, {} waiting to be sealed",
        status.sealed, status.signed, status.pending
    );
    Ok(())
}

async fn show_database(store: &PostgresStore, operation: OperationId) -> Result<(), Failure> {
    let events = store
        .journal_events(operation)
        .await
        .map_err(audit_failure)?;
    if events.is_empty() {
        return Err(Failure::NotFound(format!(
            "no sealed event of operation {operation} in the database's journal"
        )));
    }
    let mut out = std::io::stdout().lock();
    for event in &events {
        let _ = writeln!(out, "{}", event_summary(event));
    }
    Ok(())
}

fn verdict(verified: &VerifiedJournal) -> String {
    let mut line = format!(
        "ok: {} events, {} checkpoints",
        verified.events, verified.checkpoints
    );
    match &verified.latest {
        Some(latest) => line.push_str(&format!(
            ", tree size {}, root {}",
            latest.size,
            latest.root.to_base64()
        )),
        None => line.push_str(", no checkpoint"),
    }
    if verified.unsigned_tail > 0 {
        line.push_str(&format!(
            ", {} unsigned event(s) after the last checkpoint",
            verified.unsigned_tail
        ));
    }
    if verified.torn_tail {
        line.push_str(", a torn last line skipped");
    }
    line
}

fn source(at: &CheckpointSource) -> String {
    match at {
        CheckpointSource::Export { line } => format!("export line {line}"),
        CheckpointSource::Anchor { file, line } => {
            format!("anchor {} line {line}", file.display())
        }
    }
}

/// `KIND: details`, one line, for a violation.
fn describe(violation: &Violation) -> String {
    match violation {
        Violation::Malformed { line, reason } => format!("malformed: line {line}: {reason}"),
        Violation::Modified {
            seq,
            line,
            evidence,
        } => {
            let evidence = match evidence {
                ModifiedEvidence::StoredHash => "its stored hash differs".to_owned(),
                ModifiedEvidence::NextLink => "the next event's prev differs".to_owned(),
                ModifiedEvidence::CheckpointRoot { checkpoint_size } => {
                    format!("the events disagree with the checkpoint of {checkpoint_size}")
                }
                other => format!("{other:?}"),
            };
            format!("modified: event {seq} (line {line}): {evidence}")
        }
        Violation::Deleted { seq, count, line } => {
            format!("deleted: {count} event(s) from event {seq} (line {line})")
        }
        Violation::Inserted { seq, line } => format!("inserted: event {seq} (line {line})"),
        Violation::Reordered {
            expected,
            found,
            line,
        } => format!("reordered: line {line} holds event {found}, event {expected} belongs there"),
        Violation::Truncated {
            checkpoint_size,
            events,
            at,
        } => format!(
            "truncated: {events} events, but the checkpoint at {} covers {checkpoint_size}",
            source(at)
        ),
        Violation::Forged { at, reason } => {
            format!("forged: the checkpoint at {}: {reason}", source(at))
        }
        Violation::RolledBack {
            older_size,
            older,
            newer_size,
            newer,
        } => format!(
            "rolled back: the checkpoint of {newer_size} at {} does not extend the one of \
             {older_size} at {}",
            source(newer),
            source(older)
        ),
        other => format!("other: {other}"),
    }
}

fn verify_proof(file: &Path, key: &NoteVerifyingKey) -> Result<(), Failure> {
    let text = std::fs::read_to_string(file).map_err(|err| file_error("read", file, &err))?;
    let mut proved = Vec::new();
    for (index, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let outcome = EventProof::parse(line).and_then(|proof| proof.verify(key));
        match outcome {
            Ok((event, checkpoint)) => proved.push((event, checkpoint)),
            Err(err) => {
                println!("refused: line {}: {err}", index + 1);
                return Err(Failure::Violation(format!(
                    "{} does not verify",
                    file.display()
                )));
            }
        }
    }
    let Some((_, checkpoint)) = proved.last() else {
        return Err(Failure::Usage(format!("{} holds no proof", file.display())));
    };
    let seqs: Vec<String> = proved.iter().map(|(e, _)| e.seq.to_string()).collect();
    println!(
        "ok: {} event(s) proved ({}), tree size {}, root {}",
        proved.len(),
        seqs.join(", "),
        checkpoint.size,
        checkpoint.root.to_base64()
    );
    Ok(())
}

fn show(file: &Path, operation: OperationId) -> Result<(), Failure> {
    let handle = File::open(file).map_err(|err| file_error("open", file, &err))?;
    let mut reader = JournalReader::new(BufReader::new(handle));
    let mut events = Vec::new();
    while let Some(next) = reader.next_line() {
        let (line, parsed) = next.map_err(|err| file_error("read", file, &err))?;
        match parsed {
            Ok(JournalLine::Event { event, .. }) if event.event.operation_id == Some(operation) => {
                events.push(*event);
            }
            Ok(_) => {}
            Err(err) => {
                println!("violation: malformed: line {line}: {err}");
                return Err(Failure::Violation(format!(
                    "{} is not a journal",
                    file.display()
                )));
            }
        }
    }
    if events.is_empty() {
        return Err(Failure::NotFound(format!(
            "no event of operation {operation} in {}",
            file.display()
        )));
    }
    events.sort_by_key(|event| event.seq);
    let mut out = std::io::stdout().lock();
    for event in &events {
        let _ = writeln!(out, "{}", event_summary(event));
    }
    Ok(())
}

/// `SEQ TIME TYPE` and the event's members, one line.
fn event_summary(sealed: &SealedEvent) -> String {
    let event = &sealed.event;
    let time = humantime::format_rfc3339_micros(event.time);
    let mut line = format!(
        "{} {time} {} scope={}",
        sealed.seq,
        event.kind.name(),
        event.scope
    );
    if let Some(key) = &event.key {
        line.push_str(&format!(" key={key}"));
    }
    if let Some(fingerprint) = &event.fingerprint {
        line.push_str(&format!(" fingerprint={fingerprint}"));
    }
    if let Some(principal) = &event.principal {
        line.push_str(&format!(" principal={principal}"));
    }
    let details = kind_details(&event.kind);
    if !details.is_empty() {
        line.push(' ');
        line.push_str(&details);
    }
    line
}

fn kind_details(kind: &AuditEventKind) -> String {
    if let Some(correlation) = kind.correlation() {
        return match correlation {
            Correlation::Http { method, route } => format!("http {method} {route}"),
            Correlation::Mcp {
                tool,
                jsonrpc_id,
                session,
            } => {
                let session = session.as_deref().map(|s| format!(" session={s}"));
                format!(
                    "mcp tool={tool} jsonrpc_id={jsonrpc_id}{}",
                    session.unwrap_or_default()
                )
            }
            other => format!("{other:?}"),
        };
    }
    match kind {
        AuditEventKind::ApprovalRequested {
            approver: Some(approver),
        }
        | AuditEventKind::ApprovalApproved { approver }
        | AuditEventKind::ApprovalDenied { approver } => format!("approver={approver}"),
        AuditEventKind::Completed { status } => format!("status={status}"),
        AuditEventKind::Resolved {
            operator,
            reason,
            resolution,
        } => match resolution {
            Some(resolution) => {
                format!("operator={operator} reason={reason:?} resolution={resolution}")
            }
            None => format!("operator={operator} reason={reason:?}"),
        },
        AuditEventKind::QuotaRefused { quota } => format!("quota={quota}"),
        _ => String::new(),
    }
}
