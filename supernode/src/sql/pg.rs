//! The PostgreSQL engine's side of [`crate::sql`]: one `postgres::Client`,
//! statements prepared once per text, `?N` parameters turned into `$N`, and
//! values converted to and from whatever type the server chose.
//!
//! Every transaction first takes one transaction-scoped advisory lock
//! ([`WRITE_LOCK`]), so the state transitions of all supernodes sharing the
//! database run one at a time, exactly as one supernode's do behind its
//! mutex.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::error::Error as StdError;
use std::fmt;
use std::str::FromStr;

use bytes::BytesMut;
use postgres::types::{FromSql, IsNull, ToSql, Type, to_sql_checked};
use postgres::{Client, NoTls, Statement};

use super::{Error, Result, ValueRef};

/// The advisory lock every transaction holds until it ends ("bspweb" in
/// ASCII).
pub(crate) const WRITE_LOCK: i64 = 0x6273_7077_6562;

/// Where the database is: a `postgres://` URL (or a libpq key=value
/// string), parsed.
#[derive(Clone)]
pub(crate) struct PgConfig {
    url: String,
    config: postgres::Config,
}

impl PgConfig {
    /// The same settings for `tokio-postgres` (the listener of
    /// notifications).
    pub(crate) fn tokio(&self) -> tokio_postgres::Config {
        tokio_postgres::Config::from_str(&self.url).expect("parsed once already")
    }

    /// Parses `url`; the error says what is wrong with it.
    pub(crate) fn parse(url: &str) -> Result<PgConfig, String> {
        let mut config = postgres::Config::from_str(url)
            .map_err(|e| format!("not a PostgreSQL connection URL ({e}); expected postgres://USER:PASSWORD@HOST:PORT/DATABASE"))?;
        if config.get_hosts().is_empty() {
            return Err("the PostgreSQL URL names no host: expected postgres://USER:PASSWORD@HOST:PORT/DATABASE".into());
        }
        // A server (or a lock holder) gone without closing the connection
        // is noticed in about a minute, not TCP's two hours.
        config
            .keepalives(true)
            .keepalives_idle(std::time::Duration::from_secs(30))
            .options("-c lock_timeout=30s");
        Ok(PgConfig {
            url: url.to_string(),
            config,
        })
    }

    /// The URL with its password hidden, for logs.
    pub(crate) fn redacted(&self) -> String {
        redact(&self.url)
    }
}

/// `url` with the password of its user information (`user:PASSWORD@`) or
/// of a `password=` setting replaced by `***`.
fn redact(url: &str) -> String {
    if let Some(scheme) = url.find("://") {
        let rest = &url[scheme + 3..];
        let authority = rest.find(['/', '?']).map_or(rest, |end| &rest[..end]);
        if let Some(at) = authority.rfind('@')
            && let Some(colon) = authority[..at].find(':')
        {
            let start = scheme + 3 + colon + 1;
            let end = scheme + 3 + at;
            return format!("{}***{}", &url[..start], redact_settings(&url[end..]));
        }
        return format!("{}{}", &url[..scheme + 3], redact_settings(rest));
    }
    redact_settings(url)
}

/// `password=…` settings (key=value form, or URL query) as `password=***`.
fn redact_settings(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find("password=") {
        out.push_str(&rest[..i + "password=".len()]);
        out.push_str("***");
        let tail = &rest[i + "password=".len()..];
        let end = tail.find([' ', '&']).unwrap_or(tail.len());
        rest = &tail[end..];
    }
    out.push_str(rest);
    out
}

impl fmt::Debug for PgConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.redacted())
    }
}

/// A connection; reconnects, between transactions, after the server closed
/// it.
pub(crate) struct Conn {
    config: PgConfig,
    /// `None` only while it is dropped.
    client: RefCell<Option<Client>>,
    /// Prepared statements by text, and whether each writes.
    cache: RefCell<HashMap<String, (Statement, bool)>>,
    in_transaction: Cell<bool>,
    /// Statements that changed rows (and DDL): whether a state transition
    /// wrote anything other supernodes must read again.
    writes: Cell<u64>,
    /// `writes` when the open transaction began.
    writes_at_begin: Cell<u64>,
    /// The shared generation the last committed transaction that wrote
    /// moved the database to ([`Conn::end`]).
    generation: Cell<Option<i64>>,
    /// A state transition holds the session's advisory lock: a lost
    /// connection lost it, so this one must fail rather than reconnect.
    holds_lock: Cell<bool>,
}

impl Conn {
    fn client(&self) -> std::cell::RefMut<'_, Client> {
        std::cell::RefMut::map(self.client.borrow_mut(), |c| {
            c.as_mut()
                .expect("the client is there until the connection is dropped")
        })
    }

    pub(crate) fn connect(config: &PgConfig) -> Result<Conn> {
        let client = config.config.connect(NoTls)?;
        Ok(Conn {
            config: config.clone(),
            client: RefCell::new(Some(client)),
            cache: RefCell::new(HashMap::new()),
            in_transaction: Cell::new(false),
            writes: Cell::new(0),
            writes_at_begin: Cell::new(0),
            generation: Cell::new(None),
            holds_lock: Cell::new(false),
        })
    }

    /// Reconnects if the server closed the connection and neither a
    /// transaction nor a transition's lock was held on it (those are lost,
    /// and their caller told).
    fn ensure_open(&self) -> Result<()> {
        if self.client().is_closed() {
            if self.in_transaction.get() || self.holds_lock.get() {
                return Err(Error::Postgres(closed_error(&mut self.client())));
            }
            tracing::warn!(database = %self.config.redacted(), "the PostgreSQL connection closed; connecting again");
            let client = self.config.config.connect(NoTls)?;
            discard(std::mem::replace(&mut *self.client(), client));
            self.cache.borrow_mut().clear();
        }
        Ok(())
    }

    pub(crate) fn batch(&self, sql: &str) -> Result<()> {
        self.ensure_open()?;
        self.writes.set(self.writes.get() + 1);
        Ok(self.client().batch_execute(sql)?)
    }

    pub(crate) fn begin(&self) -> Result<()> {
        self.ensure_open()?;
        let began = self.client().batch_execute(&format!(
            "BEGIN; SELECT pg_advisory_xact_lock({WRITE_LOCK})"
        ));
        if let Err(e) = began {
            // Not left in an aborted transaction.
            let _ = self.client().batch_execute("ROLLBACK");
            return Err(e.into());
        }
        self.in_transaction.set(true);
        self.writes_at_begin.set(self.writes.get());
        Ok(())
    }

    /// Commits or rolls back. A commit of a transaction that wrote moves
    /// the shared generation on in the same transaction, so no supernode
    /// can miss the change (even if this one dies right after).
    pub(crate) fn end(&self, commit: bool) -> Result<()> {
        if self.client().is_closed() {
            self.in_transaction.set(false);
            return if commit {
                // The commit never reached the server: the caller must not
                // think it did.
                Err(Error::Postgres(closed_error(&mut self.client())))
            } else {
                Ok(())
            };
        }
        if commit && self.writes.get() != self.writes_at_begin.get() {
            let bumped = self.client().query_one(
                "UPDATE bspweb_generation SET generation = generation + 1 RETURNING generation",
                &[],
            );
            match bumped {
                Ok(row) => self.generation.set(Some(row.get(0))),
                Err(e) => {
                    self.in_transaction.set(false);
                    let _ = self.client().batch_execute("ROLLBACK");
                    return Err(e.into());
                }
            }
        }
        self.in_transaction.set(false);
        let sql = if commit { "COMMIT" } else { "ROLLBACK" };
        Ok(self.client().batch_execute(sql)?)
    }

    /// The generation this connection's last committed write moved the
    /// database to.
    pub(crate) fn generation(&self) -> Option<i64> {
        self.generation.get()
    }

    /// A transition took (`true`) or released the session's lock.
    pub(crate) fn set_holds_lock(&self, held: bool) {
        self.holds_lock.set(held);
    }

    /// How many writes this connection made (see [`Conn::writes`]).
    pub(crate) fn writes(&self) -> u64 {
        self.writes.get()
    }

    /// The URL it connects to.
    pub(crate) fn config(&self) -> &PgConfig {
        &self.config
    }

    /// A prepared statement, and whether it writes (anything but a
    /// `SELECT`: `INSERT … RETURNING` is run as a query).
    pub(crate) fn prepare(&self, sql: &str) -> Result<(Statement, bool)> {
        self.ensure_open()?;
        if let Some(s) = self.cache.borrow().get(sql) {
            return Ok(s.clone());
        }
        let stmt = self.client().prepare(&numbered(sql))?;
        let writes = !sql
            .trim_start()
            .get(..6)
            .is_some_and(|w| w.eq_ignore_ascii_case("SELECT"));
        self.cache
            .borrow_mut()
            .insert(sql.to_string(), (stmt.clone(), writes));
        Ok((stmt, writes))
    }

    pub(crate) fn execute(
        &self,
        stmt: &(Statement, bool),
        values: &[ValueRef<'_>],
    ) -> Result<usize> {
        let params = Param::list(values);
        let n = self.client().execute(&stmt.0, &Param::refs(&params))?;
        if n > 0 && stmt.1 {
            self.writes.set(self.writes.get() + 1);
        }
        Ok(n as usize)
    }

    pub(crate) fn query(
        &self,
        stmt: &(Statement, bool),
        values: &[ValueRef<'_>],
    ) -> Result<Vec<postgres::Row>> {
        let params = Param::list(values);
        let rows = self.client().query(&stmt.0, &Param::refs(&params))?;
        if stmt.1 && !rows.is_empty() {
            self.writes.set(self.writes.get() + 1);
        }
        Ok(rows)
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        if let Some(client) = self.client.get_mut().take() {
            discard(client);
        }
    }
}

/// Drops `client` on a thread of its own: its `Drop` says goodbye to the
/// server by blocking on its runtime, which panics on a thread that drives
/// an async runtime (where a supernode may be dropped).
fn discard(client: Client) {
    let _ = std::thread::Builder::new()
        .name("postgres-close".into())
        .spawn(move || drop(client));
}

/// The error a closed connection gives (by asking it for something).
fn closed_error(client: &mut Client) -> postgres::Error {
    match client.simple_query("") {
        Err(e) => e,
        Ok(_) => unreachable!("a closed connection answered"),
    }
}

/// `sql` with `?N` (and bare `?`) parameters as `$N`, leaving quoted text
/// and identifiers alone.
pub(crate) fn numbered(sql: &str) -> String {
    let mut out = String::with_capacity(sql.len() + 8);
    let mut quote: Option<char> = None;
    let mut next = 1;
    let mut chars = sql.chars().peekable();
    while let Some(c) = chars.next() {
        match quote {
            Some(q) => {
                out.push(c);
                if c == q {
                    quote = None;
                }
            }
            None if c == '\'' || c == '"' => {
                quote = Some(c);
                out.push(c);
            }
            None if c == '?' => {
                out.push('$');
                let mut digits = String::new();
                while let Some(d) = chars.peek().copied().filter(char::is_ascii_digit) {
                    digits.push(d);
                    chars.next();
                }
                if digits.is_empty() {
                    out.push_str(&next.to_string());
                    next += 1;
                } else {
                    out.push_str(&digits);
                }
            }
            None => out.push(c),
        }
    }
    out
}

/// A parameter, converted to the type the server inferred for it.
#[derive(Debug)]
struct Param<'a>(ValueRef<'a>);

impl<'a> Param<'a> {
    fn list(values: &[ValueRef<'a>]) -> Vec<Param<'a>> {
        values.iter().map(|v| Param(*v)).collect()
    }

    fn refs<'p>(params: &'p [Param<'a>]) -> Vec<&'p (dyn ToSql + Sync)> {
        params.iter().map(|p| p as &(dyn ToSql + Sync)).collect()
    }
}

type BoxError = Box<dyn StdError + Sync + Send>;

impl ToSql for Param<'_> {
    fn to_sql(&self, ty: &Type, out: &mut BytesMut) -> Result<IsNull, BoxError> {
        match self.0 {
            ValueRef::Null => Ok(IsNull::Yes),
            ValueRef::Integer(i) => match *ty {
                Type::INT8 => i.to_sql(ty, out),
                Type::INT4 => i32::try_from(i)?.to_sql(ty, out),
                Type::INT2 => i16::try_from(i)?.to_sql(ty, out),
                Type::FLOAT8 => (i as f64).to_sql(ty, out),
                Type::FLOAT4 => (i as f32).to_sql(ty, out),
                Type::BOOL => (i != 0).to_sql(ty, out),
                Type::TEXT | Type::VARCHAR | Type::UNKNOWN => i.to_string().to_sql(ty, out),
                _ => Err(format!("an integer cannot be stored as {ty}").into()),
            },
            ValueRef::Real(r) => match *ty {
                Type::FLOAT8 => r.to_sql(ty, out),
                Type::FLOAT4 => (r as f32).to_sql(ty, out),
                Type::TEXT | Type::VARCHAR | Type::UNKNOWN => r.to_string().to_sql(ty, out),
                _ => Err(format!("a real number cannot be stored as {ty}").into()),
            },
            ValueRef::Text(s) => s.to_sql(ty, out),
            ValueRef::Blob(b) => b.to_sql(ty, out),
        }
    }

    fn accepts(_: &Type) -> bool {
        true
    }

    to_sql_checked!();
}

/// Column `idx` of `row` as a `T`, whatever integer, real, boolean, text,
/// bytes or numeric type the server gave it.
pub(super) fn read<T: super::FromSql>(row: &postgres::Row, idx: usize) -> Result<T> {
    let Some(column) = row.columns().get(idx) else {
        return Err(Error::Conversion {
            column: idx,
            wanted: T::NAME,
            found: "no such column",
        });
    };
    let ty = column.type_().clone();
    let v = match ty {
        Type::INT8 => row.try_get::<_, Option<i64>>(idx)?.map(ValueRef::Integer),
        Type::INT4 => row
            .try_get::<_, Option<i32>>(idx)?
            .map(|v| ValueRef::Integer(v.into())),
        Type::INT2 => row
            .try_get::<_, Option<i16>>(idx)?
            .map(|v| ValueRef::Integer(v.into())),
        Type::BOOL => row
            .try_get::<_, Option<bool>>(idx)?
            .map(|v| ValueRef::Integer(v.into())),
        Type::FLOAT8 => row.try_get::<_, Option<f64>>(idx)?.map(ValueRef::Real),
        Type::FLOAT4 => row
            .try_get::<_, Option<f32>>(idx)?
            .map(|v| ValueRef::Real(v.into())),
        Type::NUMERIC => row.try_get::<_, Option<Numeric>>(idx)?.map(|n| n.0),
        Type::BYTEA => row.try_get::<_, Option<&[u8]>>(idx)?.map(ValueRef::Blob),
        _ => match row.try_get::<_, Option<&str>>(idx) {
            Ok(v) => v.map(ValueRef::Text),
            Err(_) => {
                return Err(Error::Conversion {
                    column: idx,
                    wanted: T::NAME,
                    found: "a PostgreSQL type bspweb does not read",
                });
            }
        },
    }
    .unwrap_or(ValueRef::Null);
    T::from_sql(v).ok_or(Error::Conversion {
        column: idx,
        wanted: T::NAME,
        found: v.kind(),
    })
}

/// A `numeric` (what `sum` of a `bigint` gives): an integer when it has no
/// fraction and fits in 64 bits, a real otherwise.
struct Numeric(ValueRef<'static>);

impl<'a> FromSql<'a> for Numeric {
    fn from_sql(_: &Type, raw: &'a [u8]) -> Result<Numeric, BoxError> {
        let word = |i: usize| -> Result<u16, BoxError> {
            raw.get(2 * i..2 * i + 2)
                .map(|b| u16::from_be_bytes([b[0], b[1]]))
                .ok_or_else(|| "a truncated numeric".into())
        };
        let ndigits = usize::from(word(0)?);
        let weight = i32::from(word(1)? as i16);
        let sign = word(2)?;
        let dscale = word(3)?;
        if sign == 0xC000 {
            return Ok(Numeric(ValueRef::Real(f64::NAN)));
        }
        let negative = sign == 0x4000;
        let mut int: Option<i128> = Some(0);
        let mut real = 0f64;
        for i in 0..ndigits {
            let d = word(4 + i)?;
            let power = weight - i as i32;
            real += f64::from(d) * 10_000f64.powi(power);
            int = match (int, power) {
                (Some(acc), p) if p >= 0 => u32::try_from(p)
                    .ok()
                    .and_then(|p| 10_000i128.checked_pow(p))
                    .and_then(|m| acc.checked_add(i128::from(d).checked_mul(m)?)),
                _ if d == 0 => int,
                _ => None,
            };
        }
        let int = int
            .filter(|_| dscale == 0)
            .map(|v| if negative { -v } else { v })
            .and_then(|v| i64::try_from(v).ok());
        Ok(Numeric(match int {
            Some(i) => ValueRef::Integer(i),
            None => ValueRef::Real(if negative { -real } else { real }),
        }))
    }

    fn accepts(ty: &Type) -> bool {
        *ty == Type::NUMERIC
    }
}

/// A PostgreSQL error as a line: the server's message with its SQLSTATE
/// and detail, or the connection's failure.
pub(super) fn describe(e: &postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => {
            let mut s = format!("{} (SQLSTATE {})", db.message(), db.code().code());
            if let Some(detail) = db.detail() {
                s.push_str(": ");
                s.push_str(detail);
            }
            s
        }
        None => format!("PostgreSQL: {e}"),
    }
}

/// Whether `e` means the database cannot be reached or cannot take writes
/// (connection lost, server shutting down, disk full), as opposed to a bad
/// statement.
pub(crate) fn is_unavailable(e: &postgres::Error) -> bool {
    if e.is_closed() {
        return true;
    }
    match e.code() {
        Some(code) => {
            let c = code.code();
            c.starts_with("08")
                || c.starts_with("53")
                || c.starts_with("57P")
                || c == "58030"
                // The lock of the shared database was not had in time.
                || c == "55P03"
        }
        None => e.as_db_error().is_none() && e.is_closed(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_hidden_in_logs() {
        assert_eq!(
            redact("postgres://bspweb:s%40cr3t@db:5432/bspweb"),
            "postgres://bspweb:***@db:5432/bspweb"
        );
        assert_eq!(redact("postgres://bspweb@db/x"), "postgres://bspweb@db/x");
        assert_eq!(
            redact("host=db user=u password=hunter2 dbname=x"),
            "host=db user=u password=*** dbname=x"
        );
        assert_eq!(
            redact("postgres://db/x?user=u&password=hunter2&sslmode=disable"),
            "postgres://db/x?user=u&password=***&sslmode=disable"
        );
    }

    #[test]
    fn parameters_are_numbered_outside_quotes() {
        assert_eq!(
            numbered("SELECT a FROM t WHERE b = ?1 AND c = ?12 AND d = '?1' AND \"e?\" = ?"),
            "SELECT a FROM t WHERE b = $1 AND c = $12 AND d = '?1' AND \"e?\" = $1"
        );
        assert_eq!(numbered("x = ? AND y = ?"), "x = $1 AND y = $2");
        assert_eq!(numbered("it''s ? '?'"), "it''s $1 '?'");
    }
}
