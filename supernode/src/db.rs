//! SQLite: opening, migrations, and mapping rows to API types.

use std::path::Path;

use crate::sql::{Connection, OptionalExtension, Row, params};
use bsp_api::rest::{JobEvent, JobEventKind, JobInfo, JobLimits, JobOutcome, JobState};
use bsp_api::{JobId, PeerId, Pid};

use crate::Error;

/// The numbered migrations, applied in order: each file's SQLite form
/// (`migrations/`) and its PostgreSQL form (`migrations/postgres/`).
/// SQLite's `PRAGMA user_version` and PostgreSQL's `bspweb_schema` table hold
/// the number already applied.
const MIGRATIONS: &[(&str, &str, &str)] = &[
    (
        "0001_init.sql",
        include_str!("../../migrations/0001_init.sql"),
        include_str!("../../migrations/postgres/0001_init.sql"),
    ),
    (
        "0002_fault_tolerance.sql",
        include_str!("../../migrations/0002_fault_tolerance.sql"),
        include_str!("../../migrations/postgres/0002_fault_tolerance.sql"),
    ),
    (
        "0003_progress.sql",
        include_str!("../../migrations/0003_progress.sql"),
        include_str!("../../migrations/postgres/0003_progress.sql"),
    ),
    (
        "0004_clusters.sql",
        include_str!("../../migrations/0004_clusters.sql"),
        include_str!("../../migrations/postgres/0004_clusters.sql"),
    ),
    (
        "0005_peer_memory.sql",
        include_str!("../../migrations/0005_peer_memory.sql"),
        include_str!("../../migrations/postgres/0005_peer_memory.sql"),
    ),
    (
        "0006_compact_output.sql",
        include_str!("../../migrations/0006_compact_output.sql"),
        include_str!("../../migrations/postgres/0006_compact_output.sql"),
    ),
    (
        "0007_memory_admission.sql",
        include_str!("../../migrations/0007_memory_admission.sql"),
        include_str!("../../migrations/postgres/0007_memory_admission.sql"),
    ),
    (
        "0008_accounts.sql",
        include_str!("../../migrations/0008_accounts.sql"),
        include_str!("../../migrations/postgres/0008_accounts.sql"),
    ),
    (
        "0009_enrollment.sql",
        include_str!("../../migrations/0009_enrollment.sql"),
        include_str!("../../migrations/postgres/0009_enrollment.sql"),
    ),
    (
        "0010_redundancy.sql",
        include_str!("../../migrations/0010_redundancy.sql"),
        include_str!("../../migrations/postgres/0010_redundancy.sql"),
    ),
];

/// Where the supernode keeps its state.
#[derive(Debug, Clone)]
pub(crate) enum Database {
    /// A SQLite file (the embedded default).
    Sqlite(std::path::PathBuf),
    /// A PostgreSQL database, which several supernodes may share.
    Postgres(Box<crate::sql::PgConfig>),
}

impl std::fmt::Display for Database {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Database::Sqlite(path) => write!(f, "SQLite {}", path.display()),
            Database::Postgres(pg) => write!(f, "PostgreSQL {}", pg.redacted()),
        }
    }
}

/// Opens (creating if needed) the database and brings its schema up to date.
pub(crate) fn open(db: &Database) -> anyhow::Result<Connection> {
    use anyhow::Context;
    match db {
        Database::Sqlite(path) => open_sqlite(path),
        Database::Postgres(pg) => {
            let mut conn = Connection::postgres(pg).with_context(|| {
                format!("cannot connect to {db}; is the server running, and do the URL's user, password and database exist?")
            })?;
            migrate_postgres(&mut conn).with_context(|| format!("cannot migrate {db}"))?;
            Ok(conn)
        }
    }
}

pub(crate) fn open_sqlite(path: &Path) -> anyhow::Result<Connection> {
    use anyhow::Context;
    let mut conn = rusqlite::Connection::open(path)
        .with_context(|| format!("cannot open the database {}", path.display()))?;
    conn.busy_timeout(std::time::Duration::from_secs(10))?;
    let mode: String = conn.query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))?;
    if !mode.eq_ignore_ascii_case("wal") {
        tracing::warn!(mode, "SQLite refused write-ahead logging");
    }
    conn.execute_batch("PRAGMA foreign_keys = ON; PRAGMA synchronous = NORMAL;")?;
    migrate_sqlite(&mut conn)
        .with_context(|| format!("cannot migrate the database {}", path.display()))?;
    Ok(Connection::sqlite(conn))
}

fn too_new(version: i64) -> anyhow::Result<()> {
    let known = MIGRATIONS.len() as i64;
    if version > known {
        anyhow::bail!(
            "the database has schema version {version} but this supernode knows only {known}; \
             it was written by a newer bspweb, so run that version (or start with a fresh database)"
        );
    }
    Ok(())
}

/// Applies the migrations the database has not seen yet, each in its own
/// transaction together with the `user_version` bump.
pub(crate) fn migrate_sqlite(conn: &mut rusqlite::Connection) -> anyhow::Result<()> {
    let version: i64 = conn.query_row("PRAGMA user_version", [], |r| r.get(0))?;
    too_new(version)?;
    for (i, (name, sql, _)) in MIGRATIONS.iter().enumerate().skip(version as usize) {
        let tx = conn.transaction()?;
        tx.execute_batch(sql)
            .map_err(|e| anyhow::anyhow!("migration {name} failed: {e}"))?;
        tx.pragma_update(None, "user_version", (i + 1) as i64)?;
        tx.commit()?;
        tracing::info!(migration = name, "applied database migration");
    }
    Ok(())
}

/// The PostgreSQL form of [`migrate_sqlite`]; it also makes the tables
/// only supernodes sharing a database need (`crate::shared`): the
/// generation of the shared state and the shared secrets. Each migration
/// runs in the
/// transaction that bumps `bspweb_schema`, under the lock every supernode's
/// transactions take, so supernodes starting together migrate once.
fn migrate_postgres(conn: &mut Connection) -> anyhow::Result<()> {
    let tx = conn.transaction()?;
    tx.execute_batch(
        "CREATE TABLE IF NOT EXISTS bspweb_schema (version BIGINT NOT NULL); \
         INSERT INTO bspweb_schema (version) SELECT 0 WHERE NOT EXISTS (SELECT 1 FROM bspweb_schema); \
         CREATE TABLE IF NOT EXISTS bspweb_generation (generation BIGINT NOT NULL); \
         INSERT INTO bspweb_generation (generation) \
             SELECT 0 WHERE NOT EXISTS (SELECT 1 FROM bspweb_generation); \
         CREATE TABLE IF NOT EXISTS bspweb_secrets (name TEXT PRIMARY KEY, value BYTEA NOT NULL)",
    )?;
    tx.commit()?;
    for (i, (name, _, sql)) in MIGRATIONS.iter().enumerate() {
        let tx = conn.transaction()?;
        let version: i64 = tx.query_row("SELECT version FROM bspweb_schema", [], |r| r.get(0))?;
        too_new(version)?;
        if version > i as i64 {
            continue;
        }
        tx.execute_batch(sql)
            .map_err(|e| anyhow::anyhow!("migration {name} failed: {e}"))?;
        tx.execute("UPDATE bspweb_schema SET version = ?1", [(i + 1) as i64])?;
        tx.commit()?;
        tracing::info!(migration = name, "applied database migration");
    }
    let tx = conn.transaction()?;
    let version: i64 = tx.query_row("SELECT version FROM bspweb_schema", [], |r| r.get(0))?;
    too_new(version)?;
    Ok(())
}

/// A u64 stored in an INTEGER column as its two's-complement bits.
pub(crate) fn u64_to_sql(v: u64) -> i64 {
    v as i64
}

/// The inverse of [`u64_to_sql`].
pub(crate) fn u64_from_sql(v: i64) -> u64 {
    v as u64
}

const JOB_COLUMNS: &str = "j.id, u.name, j.program, j.program_hash, j.nprocs, j.args, j.description, \
     j.state, j.outcome, j.error, j.error_pid, j.seed, j.superstep_ms, j.memory_mib, j.output_mib, \
     j.submitted_at, j.started_at, j.finished_at, j.exited, j.checkpoint_every, j.replicas, \
     j.redundancy";

fn job_from_row(row: &Row<'_>) -> crate::sql::Result<JobInfo> {
    let args: String = row.get(5)?;
    let state: String = row.get(7)?;
    let outcome: Option<String> = row.get(8)?;
    Ok(JobInfo {
        id: row.get(0)?,
        owner: row.get(1)?,
        program: row.get(2)?,
        program_hash: row.get(3)?,
        nprocs: row.get(4)?,
        args: serde_json::from_str(&args).unwrap_or(serde_json::Value::Null),
        description: row.get(6)?,
        state: JobState::parse(&state).unwrap_or(JobState::Finished),
        outcome: outcome.as_deref().and_then(JobOutcome::parse),
        error: row.get(9)?,
        error_pid: row.get(10)?,
        seed: u64_from_sql(row.get(11)?),
        limits: JobLimits {
            superstep_ms: u64_from_sql(row.get(12)?),
            memory_mib: row.get(13)?,
            output_mib: row.get(14)?,
            checkpoint_every: row.get(19)?,
            replicas: row.get(20)?,
            redundancy: row.get(21)?,
        },
        submitted_at: row.get(15)?,
        started_at: row.get(16)?,
        finished_at: row.get(17)?,
        placement: Vec::new(),
        copies: Vec::new(),
        exited: row.get(18)?,
        supersteps: Vec::new(),
    })
}

/// Where each pid of `job` runs and how many supersteps it has completed:
/// its first copy's, and with redundancy where its other copies run
/// (`placements` has a row per copy, `c * nprocs + pid`).
fn placement_of(conn: &Connection, job: &mut JobInfo) -> crate::sql::Result<()> {
    let mut stmt = conn.prepare_cached(
        "SELECT pid, peer_id, superstep FROM placements WHERE job = ?1 ORDER BY pid",
    )?;
    let rows = stmt.query_map(params![job.id], |r| {
        Ok((
            r.get::<_, u32>(0)?,
            r.get::<_, PeerId>(1)?,
            r.get::<_, u32>(2)?,
        ))
    })?;
    let n = job.nprocs.max(1);
    job.placement.clear();
    job.supersteps.clear();
    job.copies.clear();
    for row in rows {
        let (slot, peer, superstep) = row?;
        let copy = (slot / n) as usize;
        if copy == 0 {
            job.placement.push(peer);
            job.supersteps.push(superstep);
        } else {
            if job.copies.len() < copy {
                job.copies.resize_with(copy, Vec::new);
            }
            job.copies[copy - 1].push(peer);
        }
    }
    Ok(())
}

/// Job `id` if it belongs to `owner` (any owner when `None`).
pub(crate) fn job_info(
    conn: &Connection,
    id: JobId,
    owner: Option<i64>,
) -> Result<Option<JobInfo>, Error> {
    let sql = format!(
        "SELECT {JOB_COLUMNS} FROM jobs j JOIN users u ON u.id = j.owner \
         WHERE j.id = ?1 AND (CAST(?2 AS BIGINT) IS NULL OR j.owner = ?2)"
    );
    let job = conn
        .query_row(&sql, params![id, owner], job_from_row)
        .optional()?;
    match job {
        Some(mut job) => {
            placement_of(conn, &mut job)?;
            Ok(Some(job))
        }
        None => Ok(None),
    }
}

/// The jobs of `owner`, oldest first, optionally in one state.
pub(crate) fn jobs_of(
    conn: &Connection,
    owner: i64,
    state: Option<JobState>,
) -> Result<Vec<JobInfo>, Error> {
    let sql = format!(
        "SELECT {JOB_COLUMNS} FROM jobs j JOIN users u ON u.id = j.owner \
         WHERE j.owner = ?1 AND (CAST(?2 AS TEXT) IS NULL OR j.state = ?2) ORDER BY j.id"
    );
    let mut stmt = conn.prepare(&sql)?;
    let rows = stmt.query_map(params![owner, state.map(JobState::as_str)], job_from_row)?;
    let mut jobs = rows.collect::<crate::sql::Result<Vec<_>>>()?;
    for job in &mut jobs {
        if job.state != JobState::Waiting {
            placement_of(conn, job)?;
        }
    }
    Ok(jobs)
}

/// Stores one event; returns its id, or `None` when `(job, pid, seq)` was
/// stored before.
pub(crate) fn insert_event(
    conn: &Connection,
    job: JobId,
    pid: Option<Pid>,
    seq: Option<i64>,
    kind: &JobEventKind,
    at: i64,
) -> Result<Option<i64>, Error> {
    // Output is stored as its bytes (see migrations/0006_compact_output.sql).
    let (payload, data) = match output_bytes(kind) {
        Some(bytes) => (String::new(), Some(bytes)),
        None => (
            serde_json::to_string(kind)
                .map_err(|e| Error::Internal(format!("event payload: {e}")))?,
            None,
        ),
    };
    Ok(conn
        .query_row(
            "INSERT INTO events (job, pid, kind, seq, payload, at, data) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7) ON CONFLICT DO NOTHING RETURNING id",
            params![job, pid, kind.name(), seq, payload, at, data],
            |r| r.get(0),
        )
        .optional()?)
}

/// The bytes of an output event (stdout and stderr text, decoded raw
/// data), `None` for other events and for raw data that is not base64.
pub(crate) fn output_bytes(kind: &JobEventKind) -> Option<Vec<u8>> {
    use base64::Engine as _;
    match kind {
        JobEventKind::Stdout { text } | JobEventKind::Stderr { text } => {
            Some(text.as_bytes().to_vec())
        }
        JobEventKind::Raw { data } => base64::engine::general_purpose::STANDARD
            .decode(data.as_bytes())
            .ok(),
        _ => None,
    }
}

/// The output event of kind `name` with these stored bytes.
fn output_event(name: &str, data: Vec<u8>) -> Option<JobEventKind> {
    use base64::Engine as _;
    let text = || {
        String::from_utf8(data.clone())
            .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
    };
    Some(match name {
        "stdout" => JobEventKind::Stdout { text: text() },
        "stderr" => JobEventKind::Stderr { text: text() },
        "raw" => JobEventKind::Raw {
            data: base64::engine::general_purpose::STANDARD.encode(&data),
        },
        _ => return None,
    })
}

/// Up to `limit` events of `job` with an id greater than `after`, in order.
/// The id of `job`'s newest stored event, 0 when it has none.
pub(crate) fn last_event_id(conn: &Connection, job: JobId) -> Result<i64, Error> {
    Ok(conn.query_row(
        "SELECT coalesce(max(id), 0) FROM events WHERE job = ?1",
        params![job],
        |r| r.get(0),
    )?)
}

pub(crate) fn events_after(
    conn: &Connection,
    job: JobId,
    after: i64,
    limit: u32,
) -> Result<Vec<JobEvent>, Error> {
    let mut stmt = conn.prepare_cached(
        "SELECT id, pid, payload, at, kind, data FROM events \
         WHERE job = ?1 AND id > ?2 ORDER BY id LIMIT ?3",
    )?;
    let rows = stmt.query_map(params![job, after, limit], |r| {
        Ok((
            r.get::<_, i64>(0)?,
            r.get::<_, Option<Pid>>(1)?,
            r.get::<_, String>(2)?,
            r.get::<_, i64>(3)?,
            r.get::<_, String>(4)?,
            r.get::<_, Option<Vec<u8>>>(5)?,
        ))
    })?;
    let mut events = Vec::new();
    for row in rows {
        let (id, pid, payload, at, name, data) = row?;
        let kind = match data {
            Some(data) => output_event(&name, data)
                .ok_or_else(|| format!("stored bytes for a `{name}` event")),
            None => serde_json::from_str::<JobEventKind>(&payload).map_err(|e| e.to_string()),
        };
        match kind {
            Ok(kind) => events.push(JobEvent {
                id,
                job,
                pid,
                at,
                kind,
            }),
            Err(e) => {
                tracing::error!(job, event = id, error = %e, "skipping an unreadable stored event")
            }
        }
    }
    Ok(events)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn migrations_apply_once_and_record_the_version() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db.sqlite3");
        let conn = open_sqlite(&path).unwrap();
        let v: i64 = conn
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .unwrap();
        assert_eq!(v, MIGRATIONS.len() as i64);
        drop(conn);
        // Opening again applies nothing (a second CREATE TABLE would fail).
        let conn = open_sqlite(&path).unwrap();
        let fk: i64 = conn
            .query_row("PRAGMA foreign_keys", [], |r| r.get(0))
            .unwrap();
        assert_eq!(fk, 1);
    }

    #[test]
    fn a_newer_schema_is_refused_with_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db.sqlite3");
        {
            let conn = rusqlite::Connection::open(&path).unwrap();
            conn.pragma_update(None, "user_version", 99).unwrap();
        }
        let err = open_sqlite(&path).unwrap_err();
        assert!(format!("{err:#}").contains("newer bspweb"), "{err:#}");
    }

    /// A fresh database with user 1 and its active job 1.
    fn one_job() -> (tempfile::TempDir, Connection) {
        let dir = tempfile::tempdir().unwrap();
        let conn = open_sqlite(&dir.path().join("db.sqlite3")).unwrap();
        conn.execute_batch(
            "INSERT INTO users (id, name, password_hash, created_at) VALUES (1, 'a', 'x', 0);
             INSERT INTO programs (hash, bytes, size, created_at)
                VALUES ('0000000000000000000000000000000000000000000000000000000000000000', x'00', 1, 0);
             INSERT INTO jobs (id, owner, program, program_hash, nprocs, args, seed, superstep_ms,
                memory_mib, output_mib, state, submitted_at)
                VALUES (1, 1, 'p', '0000000000000000000000000000000000000000000000000000000000000000',
                        2, 'null', 0, 1, 1, 1, 'active', 0);",
        )
        .unwrap();
        (dir, conn)
    }

    #[test]
    fn repeated_output_records_are_stored_once() {
        let (_dir, conn) = one_job();
        let line = |t: &str| JobEventKind::Stdout { text: t.into() };
        let a = insert_event(&conn, 1, Some(0), Some(0), &line("a"), 1).unwrap();
        let again = insert_event(&conn, 1, Some(0), Some(0), &line("a"), 2).unwrap();
        let other_pid = insert_event(&conn, 1, Some(1), Some(0), &line("b"), 3).unwrap();
        let status1 = insert_event(
            &conn,
            1,
            None,
            None,
            &JobEventKind::Status { text: "s".into() },
            4,
        )
        .unwrap();
        let status2 = insert_event(
            &conn,
            1,
            None,
            None,
            &JobEventKind::Status { text: "s".into() },
            5,
        )
        .unwrap();
        assert!(a.is_some() && other_pid.is_some() && status1.is_some() && status2.is_some());
        assert_eq!(again, None);
        let events = events_after(&conn, 1, 0, 100).unwrap();
        assert_eq!(events.len(), 4);
        assert!(events.windows(2).all(|w| w[0].id < w[1].id));
        assert_eq!(events_after(&conn, 1, a.unwrap(), 100).unwrap().len(), 3);
    }

    /// Issue 20, finding 4: output is stored as its bytes, not as escaped
    /// JSON or base64, and reads back as it was sent.
    #[test]
    fn output_is_stored_compactly_and_reads_back_unchanged() {
        use base64::Engine as _;
        let (_dir, conn) = one_job();
        let nuls = "\0".repeat(10_000);
        let raw: Vec<u8> = (0..=255u8).cycle().take(30_000).collect();
        let kinds = [
            JobEventKind::Stdout { text: nuls.clone() },
            JobEventKind::Stderr {
                text: "grüße \u{1F600} \"quoted\" \\ back".into(),
            },
            JobEventKind::Raw {
                data: base64::engine::general_purpose::STANDARD.encode(&raw),
            },
            JobEventKind::Status { text: "s".into() },
        ];
        for (i, k) in kinds.iter().enumerate() {
            insert_event(&conn, 1, Some(0), Some(i as i64), k, 1).unwrap();
        }
        let back: Vec<JobEventKind> = events_after(&conn, 1, 0, 100)
            .unwrap()
            .into_iter()
            .map(|e| e.kind)
            .collect();
        assert_eq!(back, kinds);
        let stored: i64 = conn
            .query_row(
                "SELECT sum(length(payload) + coalesce(length(data), 0)) FROM events",
                [],
                |r| r.get(0),
            )
            .unwrap();
        let sent = (nuls.len() + raw.len()) as i64;
        assert!(
            stored < sent + 1_000,
            "{stored} bytes stored for {sent} bytes of output"
        );
    }
}
