//! The supernode's storage, behind one interface with two engines: SQLite
//! (rusqlite, the embedded default: one supernode, no setup) and PostgreSQL
//! (the `postgres` crate: one database shared by several supernodes).
//!
//! The interface is the part of rusqlite's the supernode uses —
//! [`Connection`], [`Transaction`], [`Statement`], [`Row`],
//! [`OptionalExtension`], [`params!`] — so a state transition is written
//! once, in SQL both engines run:
//!
//! - parameters are numbered `?1`, `?2`, … (the PostgreSQL engine turns them
//!   into `$1`, `$2`, …);
//! - integers are 64-bit everywhere (`BIGINT` in the PostgreSQL schema),
//!   flags are integers 0/1, times are Unix milliseconds;
//! - `INSERT … ON CONFLICT … DO NOTHING | DO UPDATE` instead of `INSERT OR`,
//!   `RETURNING id` instead of `last_insert_rowid()`;
//! - values cross as [`ValueRef`]s (null, integer, real, text, bytes), so a
//!   column reads the same whether an engine says `INTEGER`, `int4`, `int8`,
//!   `bool` or `numeric`.
//!
//! Migrations live in `migrations/` (SQLite) and `migrations/postgres/`
//! (the same numbered changes for PostgreSQL); [`crate::db`] applies them.

mod pg;
mod sqlite;

use std::fmt;
use std::ops::Deref;

pub(crate) use pg::{PgConfig, WRITE_LOCK, is_unavailable};

/// What a query failed with.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// SQLite failed.
    #[error("{0}")]
    Sqlite(#[from] rusqlite::Error),
    /// PostgreSQL failed (or the connection to it did).
    #[error("{}", pg::describe(.0))]
    Postgres(#[from] postgres::Error),
    /// `query_row` found no row.
    #[error("the query returned no rows")]
    NoRows,
    /// A column holds a value the code cannot read as the type it asked for.
    #[error("column {column}: cannot read {found} as {wanted}")]
    Conversion {
        column: usize,
        wanted: &'static str,
        found: &'static str,
    },
    /// A parameter cannot be stored (an integer beyond 64 bits, say).
    #[error("parameter {index}: {message}")]
    Parameter { index: usize, message: String },
}

/// A query's result.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Which engine a connection talks to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Engine {
    Sqlite,
    Postgres,
}

/// A value as a query reads or writes it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ValueRef<'a> {
    Null,
    Integer(i64),
    Real(f64),
    Text(&'a str),
    Blob(&'a [u8]),
}

impl ValueRef<'_> {
    fn kind(&self) -> &'static str {
        match self {
            ValueRef::Null => "NULL",
            ValueRef::Integer(_) => "an integer",
            ValueRef::Real(_) => "a real",
            ValueRef::Text(_) => "text",
            ValueRef::Blob(_) => "bytes",
        }
    }
}

/// A Rust value a query takes as a parameter.
pub trait ToSql {
    fn to_sql(&self) -> Result<ValueRef<'_>, String>;
}

/// A Rust value a column can be read as.
pub trait FromSql: Sized {
    /// `None` when `v` is not of this type.
    fn from_sql(v: ValueRef<'_>) -> Option<Self>;
    /// The type's name, for [`Error::Conversion`].
    const NAME: &'static str;
}

macro_rules! integer {
    ($($t:ty),*) => {$(
        impl ToSql for $t {
            fn to_sql(&self) -> Result<ValueRef<'_>, String> {
                i64::try_from(*self)
                    .map(ValueRef::Integer)
                    .map_err(|_| format!("{} does not fit in a 64-bit integer", self))
            }
        }
        impl FromSql for $t {
            fn from_sql(v: ValueRef<'_>) -> Option<Self> {
                match v {
                    ValueRef::Integer(i) => <$t>::try_from(i).ok(),
                    _ => None,
                }
            }
            const NAME: &'static str = stringify!($t);
        }
    )*};
}
integer!(i64, i32, i16, u32, u16, u8, u64, usize);

impl ToSql for bool {
    fn to_sql(&self) -> Result<ValueRef<'_>, String> {
        Ok(ValueRef::Integer(i64::from(*self)))
    }
}
impl FromSql for bool {
    fn from_sql(v: ValueRef<'_>) -> Option<Self> {
        match v {
            ValueRef::Integer(i) => Some(i != 0),
            _ => None,
        }
    }
    const NAME: &'static str = "bool";
}

impl ToSql for f64 {
    fn to_sql(&self) -> Result<ValueRef<'_>, String> {
        Ok(ValueRef::Real(*self))
    }
}
impl FromSql for f64 {
    fn from_sql(v: ValueRef<'_>) -> Option<Self> {
        match v {
            ValueRef::Real(r) => Some(r),
            ValueRef::Integer(i) => Some(i as f64),
            _ => None,
        }
    }
    const NAME: &'static str = "f64";
}

impl ToSql for str {
    fn to_sql(&self) -> Result<ValueRef<'_>, String> {
        Ok(ValueRef::Text(self))
    }
}
impl ToSql for String {
    fn to_sql(&self) -> Result<ValueRef<'_>, String> {
        Ok(ValueRef::Text(self))
    }
}
impl FromSql for String {
    fn from_sql(v: ValueRef<'_>) -> Option<Self> {
        match v {
            ValueRef::Text(s) => Some(s.to_string()),
            _ => None,
        }
    }
    const NAME: &'static str = "text";
}

impl ToSql for [u8] {
    fn to_sql(&self) -> Result<ValueRef<'_>, String> {
        Ok(ValueRef::Blob(self))
    }
}
impl ToSql for Vec<u8> {
    fn to_sql(&self) -> Result<ValueRef<'_>, String> {
        Ok(ValueRef::Blob(self))
    }
}
impl FromSql for Vec<u8> {
    fn from_sql(v: ValueRef<'_>) -> Option<Self> {
        match v {
            ValueRef::Blob(b) => Some(b.to_vec()),
            _ => None,
        }
    }
    const NAME: &'static str = "bytes";
}

impl<T: ToSql> ToSql for Option<T> {
    fn to_sql(&self) -> Result<ValueRef<'_>, String> {
        match self {
            Some(v) => v.to_sql(),
            None => Ok(ValueRef::Null),
        }
    }
}
impl<T: FromSql> FromSql for Option<T> {
    fn from_sql(v: ValueRef<'_>) -> Option<Self> {
        match v {
            ValueRef::Null => Some(None),
            v => T::from_sql(v).map(Some),
        }
    }
    const NAME: &'static str = T::NAME;
}

impl<T: ToSql + ?Sized> ToSql for &T {
    fn to_sql(&self) -> Result<ValueRef<'_>, String> {
        (**self).to_sql()
    }
}

/// The parameters of one query: `params![a, b]`, `[a, b]` or `[]`.
pub trait Params {
    fn values(&self) -> Result<Vec<ValueRef<'_>>>;
}

fn collect<'a>(values: impl Iterator<Item = &'a dyn ToSql>) -> Result<Vec<ValueRef<'a>>> {
    values
        .enumerate()
        .map(|(i, v)| {
            v.to_sql().map_err(|message| Error::Parameter {
                index: i + 1,
                message,
            })
        })
        .collect()
}

impl Params for [&dyn ToSql; 0] {
    fn values(&self) -> Result<Vec<ValueRef<'_>>> {
        Ok(Vec::new())
    }
}

impl Params for &[&dyn ToSql] {
    fn values(&self) -> Result<Vec<ValueRef<'_>>> {
        collect(self.iter().copied())
    }
}

macro_rules! arrays {
    ($($n:literal),*) => {$(
        impl<T: ToSql> Params for [T; $n] {
            fn values(&self) -> Result<Vec<ValueRef<'_>>> {
                collect(self.iter().map(|v| v as &dyn ToSql))
            }
        }
    )*};
}
arrays!(1, 2, 3, 4, 5, 6, 7, 8);

/// `params![a, b, …]`: parameters of different types.
macro_rules! params {
    () => { [] as [&dyn $crate::sql::ToSql; 0] };
    ($($p:expr),+ $(,)?) => {
        &[$(&$p as &dyn $crate::sql::ToSql),+] as &[&dyn $crate::sql::ToSql]
    };
}
pub(crate) use params;

/// `query_row(…).optional()`: no row is `None`, not an error.
pub trait OptionalExtension<T> {
    fn optional(self) -> Result<Option<T>>;
}

impl<T> OptionalExtension<T> for Result<T> {
    fn optional(self) -> Result<Option<T>> {
        match self {
            Ok(v) => Ok(Some(v)),
            Err(Error::NoRows) => Ok(None),
            Err(e) => Err(e),
        }
    }
}

/// A column's position in a row.
pub trait RowIndex {
    fn index(self) -> usize;
}

impl RowIndex for usize {
    fn index(self) -> usize {
        self
    }
}

/// One row of a result.
pub struct Row<'a>(RowInner<'a>);

enum RowInner<'a> {
    Sqlite(&'a rusqlite::Row<'a>),
    Postgres(&'a postgres::Row),
}

impl Row<'_> {
    /// Column `idx` (from 0) as a `T`.
    pub fn get<I: RowIndex, T: FromSql>(&self, idx: I) -> Result<T> {
        let idx = idx.index();
        let v = match &self.0 {
            RowInner::Sqlite(r) => sqlite::value(r, idx)?,
            RowInner::Postgres(r) => return pg::read(r, idx),
        };
        T::from_sql(v).ok_or(Error::Conversion {
            column: idx,
            wanted: T::NAME,
            found: v.kind(),
        })
    }
}

/// A database connection of either engine.
pub struct Connection(Conn);

enum Conn {
    Sqlite(rusqlite::Connection),
    Postgres(Box<pg::Conn>),
}

impl fmt::Debug for Connection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Connection({:?})", self.engine())
    }
}

impl Connection {
    /// A SQLite connection.
    pub(crate) fn sqlite(conn: rusqlite::Connection) -> Connection {
        Connection(Conn::Sqlite(conn))
    }

    /// A PostgreSQL connection.
    pub(crate) fn postgres(config: &PgConfig) -> Result<Connection> {
        Ok(Connection(Conn::Postgres(Box::new(pg::Conn::connect(
            config,
        )?))))
    }

    /// The PostgreSQL connection underneath, if that is the engine.
    pub(crate) fn postgres_conn(&self) -> Option<&pg::Conn> {
        match &self.0 {
            Conn::Sqlite(_) => None,
            Conn::Postgres(c) => Some(c),
        }
    }

    pub(crate) fn engine(&self) -> Engine {
        match &self.0 {
            Conn::Sqlite(_) => Engine::Sqlite,
            Conn::Postgres(_) => Engine::Postgres,
        }
    }

    /// Runs one statement; the number of rows it changed.
    pub fn execute<P: Params>(&self, sql: &str, params: P) -> Result<usize> {
        self.prepare_cached(sql)?.execute(params)
    }

    /// Runs several statements with no parameters.
    pub fn execute_batch(&self, sql: &str) -> Result<()> {
        match &self.0 {
            Conn::Sqlite(c) => Ok(c.execute_batch(sql)?),
            Conn::Postgres(c) => c.batch(sql),
        }
    }

    /// The first row of a query, mapped by `f`; [`Error::NoRows`] without one.
    pub fn query_row<T, P, F>(&self, sql: &str, params: P, f: F) -> Result<T>
    where
        P: Params,
        F: FnOnce(&Row<'_>) -> Result<T>,
    {
        self.prepare_cached(sql)?.query_row(params, f)
    }

    /// A statement to run once.
    pub fn prepare(&self, sql: &str) -> Result<Statement<'_>> {
        Ok(Statement(match &self.0 {
            Conn::Sqlite(c) => Stmt::Sqlite(c.prepare(sql)?),
            Conn::Postgres(c) => Stmt::Postgres(c, c.prepare(sql)?),
        }))
    }

    /// A statement kept prepared for the next call with the same text.
    pub fn prepare_cached(&self, sql: &str) -> Result<Statement<'_>> {
        Ok(Statement(match &self.0 {
            Conn::Sqlite(c) => Stmt::SqliteCached(c.prepare_cached(sql)?),
            Conn::Postgres(c) => Stmt::Postgres(c, c.prepare(sql)?),
        }))
    }

    /// Begins a transaction, rolled back unless committed. On PostgreSQL
    /// it holds the lock that orders the transactions of all supernodes.
    pub fn transaction(&mut self) -> Result<Transaction<'_>> {
        match &self.0 {
            Conn::Sqlite(c) => c.execute_batch("BEGIN")?,
            Conn::Postgres(c) => c.begin()?,
        }
        Ok(Transaction {
            conn: self,
            open: true,
        })
    }

    fn end(&self, commit: bool) -> Result<()> {
        match &self.0 {
            Conn::Sqlite(c) => Ok(c.execute_batch(if commit { "COMMIT" } else { "ROLLBACK" })?),
            Conn::Postgres(c) => c.end(commit),
        }
    }
}

/// An open transaction; derefs to its [`Connection`].
pub struct Transaction<'c> {
    conn: &'c mut Connection,
    open: bool,
}

impl Transaction<'_> {
    pub fn commit(mut self) -> Result<()> {
        self.open = false;
        self.conn.end(true)
    }
}

impl Deref for Transaction<'_> {
    type Target = Connection;
    fn deref(&self) -> &Connection {
        self.conn
    }
}

impl Drop for Transaction<'_> {
    fn drop(&mut self) {
        if self.open
            && let Err(e) = self.conn.end(false)
        {
            tracing::error!(error = %e, "cannot roll a transaction back");
        }
    }
}

/// A prepared statement.
pub struct Statement<'c>(Stmt<'c>);

enum Stmt<'c> {
    Sqlite(rusqlite::Statement<'c>),
    SqliteCached(rusqlite::CachedStatement<'c>),
    Postgres(&'c pg::Conn, (postgres::Statement, bool)),
}

impl<'c> Statement<'c> {
    /// Runs it; the number of rows it changed.
    pub fn execute<P: Params>(&mut self, params: P) -> Result<usize> {
        let values = params.values()?;
        match &mut self.0 {
            Stmt::Sqlite(s) => Ok(s.execute(rusqlite::params_from_iter(sqlite::params(&values)))?),
            Stmt::SqliteCached(s) => {
                Ok(s.execute(rusqlite::params_from_iter(sqlite::params(&values)))?)
            }
            Stmt::Postgres(c, s) => c.execute(s, &values),
        }
    }

    /// Whether it returns a row.
    pub fn exists<P: Params>(&mut self, params: P) -> Result<bool> {
        let mut rows = self.query(params)?;
        Ok(rows.next()?.is_some())
    }

    /// Its first row, mapped by `f`; [`Error::NoRows`] without one.
    pub fn query_row<T, P, F>(&mut self, params: P, f: F) -> Result<T>
    where
        P: Params,
        F: FnOnce(&Row<'_>) -> Result<T>,
    {
        let mut rows = self.query(params)?;
        match rows.next()? {
            Some(r) => f(&r),
            None => Err(Error::NoRows),
        }
    }

    /// Its rows, one at a time.
    pub fn query<P: Params>(&mut self, params: P) -> Result<Rows<'_>> {
        let values = params.values()?;
        Ok(Rows(match &mut self.0 {
            Stmt::Sqlite(s) => {
                RowsInner::Sqlite(s.query(rusqlite::params_from_iter(sqlite::params(&values)))?)
            }
            Stmt::SqliteCached(s) => {
                RowsInner::Sqlite(s.query(rusqlite::params_from_iter(sqlite::params(&values)))?)
            }
            Stmt::Postgres(c, s) => RowsInner::Postgres(c.query(s, &values)?, 0),
        }))
    }

    /// Its rows, each mapped by `f`.
    pub fn query_map<T, P, F>(&mut self, params: P, f: F) -> Result<MappedRows<'_, F>>
    where
        P: Params,
        F: FnMut(&Row<'_>) -> Result<T>,
    {
        Ok(MappedRows {
            rows: self.query(params)?,
            f,
        })
    }
}

/// The rows of a query.
pub struct Rows<'s>(RowsInner<'s>);

enum RowsInner<'s> {
    Sqlite(rusqlite::Rows<'s>),
    Postgres(Vec<postgres::Row>, usize),
}

impl Rows<'_> {
    /// The next row, `None` after the last.
    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> Result<Option<Row<'_>>> {
        match &mut self.0 {
            RowsInner::Sqlite(rows) => Ok(rows.next()?.map(|r| Row(RowInner::Sqlite(r)))),
            RowsInner::Postgres(rows, at) => {
                let row = rows.get(*at);
                *at += 1;
                Ok(row.map(|r| Row(RowInner::Postgres(r))))
            }
        }
    }
}

/// The rows of a query, each mapped by a function.
pub struct MappedRows<'s, F> {
    rows: Rows<'s>,
    f: F,
}

impl<T, F> Iterator for MappedRows<'_, F>
where
    F: FnMut(&Row<'_>) -> Result<T>,
{
    type Item = Result<T>;

    fn next(&mut self) -> Option<Result<T>> {
        match self.rows.next() {
            Ok(Some(row)) => Some((self.f)(&row)),
            Ok(None) => None,
            Err(e) => Some(Err(e)),
        }
    }
}
