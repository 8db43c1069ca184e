//! The SQLite engine's side of [`crate::sql`]: values to and from rusqlite.

use rusqlite::types::{ToSqlOutput, ValueRef as Lite};

use super::{Error, Result, ValueRef};

/// Column `idx` of `row`.
pub(super) fn value<'a>(row: &'a rusqlite::Row<'_>, idx: usize) -> Result<ValueRef<'a>> {
    Ok(match row.get_ref(idx)? {
        Lite::Null => ValueRef::Null,
        Lite::Integer(i) => ValueRef::Integer(i),
        Lite::Real(r) => ValueRef::Real(r),
        Lite::Text(t) => ValueRef::Text(std::str::from_utf8(t).map_err(|_| Error::Conversion {
            column: idx,
            wanted: "text",
            found: "text that is not UTF-8",
        })?),
        Lite::Blob(b) => ValueRef::Blob(b),
    })
}

/// Parameters as rusqlite binds them.
pub(super) fn params<'a>(values: &'a [ValueRef<'a>]) -> impl Iterator<Item = ToSqlOutput<'a>> + 'a {
    values.iter().map(|v| {
        ToSqlOutput::Borrowed(match *v {
            ValueRef::Null => Lite::Null,
            ValueRef::Integer(i) => Lite::Integer(i),
            ValueRef::Real(r) => Lite::Real(r),
            ValueRef::Text(t) => Lite::Text(t.as_bytes()),
            ValueRef::Blob(b) => Lite::Blob(b),
        })
    })
}
