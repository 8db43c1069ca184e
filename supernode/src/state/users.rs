//! Users and their programs.

use super::*;

impl Core {
    // ------------------------------------------------------------ users

    pub(crate) fn create_user(
        &mut self,
        name: &str,
        hash: &str,
        admin: bool,
    ) -> Result<UserInfo, Error> {
        let exists: bool = self.conn.query_row(
            "SELECT EXISTS (SELECT 1 FROM users WHERE name = ?1)",
            [name],
            |r| r.get(0),
        )?;
        if exists {
            return Err(Error::Conflict(format!(
                "a user named `{name}` exists already"
            )));
        }
        self.conn.execute(
            "INSERT INTO users (name, password_hash, admin, created_at) VALUES (?1, ?2, ?3, ?4)",
            params![name, hash, admin, now_ms()],
        )?;
        tracing::info!(user = name, admin, "created user");
        Ok(UserInfo {
            id: self.conn.last_insert_rowid(),
            name: name.to_string(),
            admin,
        })
    }

    pub(crate) fn user_with_hash(&self, name: &str) -> Result<Option<(UserInfo, String)>, Error> {
        Ok(self
            .conn
            .query_row(
                "SELECT id, name, admin, password_hash FROM users WHERE name = ?1",
                [name],
                |r| {
                    Ok((
                        UserInfo {
                            id: r.get(0)?,
                            name: r.get(1)?,
                            admin: r.get(2)?,
                        },
                        r.get(3)?,
                    ))
                },
            )
            .optional()?)
    }

    pub(crate) fn user(&self, id: i64) -> Result<Option<UserInfo>, Error> {
        Ok(self
            .conn
            .query_row(
                "SELECT id, name, admin FROM users WHERE id = ?1",
                [id],
                |r| {
                    Ok(UserInfo {
                        id: r.get(0)?,
                        name: r.get(1)?,
                        admin: r.get(2)?,
                    })
                },
            )
            .optional()?)
    }

    // ------------------------------------------------------------ programs

    /// Stores a validated module, records the upload for `owner`
    /// (`None`: a builtin) and registers `name` if given.
    pub(crate) fn store_program(
        &mut self,
        owner: Option<i64>,
        name: Option<&str>,
        description: Option<&str>,
        hash: &str,
        wasm: &[u8],
    ) -> Result<ProgramInfo, Error> {
        let now = now_ms();
        let tx = self.conn.transaction()?;
        tx.execute(
            "INSERT OR IGNORE INTO programs (hash, bytes, size, created_at) VALUES (?1, ?2, ?3, ?4)",
            params![hash, wasm, wasm.len() as i64, now],
        )?;
        if let Some(owner) = owner {
            tx.execute(
                "INSERT OR IGNORE INTO program_uploads (owner, hash, uploaded_at) VALUES (?1, ?2, ?3)",
                params![owner, hash, now],
            )?;
        }
        if let Some(name) = name {
            let updated = tx.execute(
                "UPDATE program_names SET hash = ?3, description = ?4, updated_at = ?5 \
                 WHERE coalesce(owner, 0) = coalesce(?1, 0) AND name = ?2",
                params![owner, name, hash, description, now],
            )?;
            if updated == 0 {
                tx.execute(
                    "INSERT INTO program_names (owner, name, hash, description, updated_at) \
                     VALUES (?1, ?2, ?3, ?4, ?5)",
                    params![owner, name, hash, description, now],
                )?;
            }
        }
        tx.commit()?;
        Ok(ProgramInfo {
            name: name.map(str::to_string),
            hash: hash.to_string(),
            size: wasm.len() as u64,
            builtin: owner.is_none(),
            description: description.map(str::to_string),
        })
    }

    /// What `owner` can run: builtins not shadowed by their own names, their
    /// named programs, and their unnamed uploads.
    pub(crate) fn programs_of(&self, owner: i64) -> Result<Vec<ProgramInfo>, Error> {
        let mut out = Vec::new();
        let mut stmt = self.conn.prepare(
            "SELECT n.name, n.hash, p.size, n.description, n.owner IS NULL FROM program_names n \
             JOIN programs p ON p.hash = n.hash \
             WHERE n.owner = ?1 OR (n.owner IS NULL AND n.name NOT IN \
                 (SELECT name FROM program_names WHERE owner = ?1)) \
             ORDER BY n.owner IS NOT NULL, n.name",
        )?;
        for row in stmt.query_map([owner], |r| {
            Ok(ProgramInfo {
                name: Some(r.get(0)?),
                hash: r.get(1)?,
                size: u64_from_sql(r.get(2)?),
                description: r.get(3)?,
                builtin: r.get(4)?,
            })
        })? {
            out.push(row?);
        }
        let mut stmt = self.conn.prepare(
            "SELECT u.hash, p.size FROM program_uploads u JOIN programs p ON p.hash = u.hash \
             WHERE u.owner = ?1 AND u.hash NOT IN (SELECT hash FROM program_names WHERE owner = ?1) \
             ORDER BY u.uploaded_at, u.hash",
        )?;
        for row in stmt.query_map([owner], |r| {
            Ok(ProgramInfo {
                name: None,
                hash: r.get(0)?,
                size: u64_from_sql(r.get(1)?),
                description: None,
                builtin: false,
            })
        })? {
            out.push(row?);
        }
        Ok(out)
    }

    /// Forgets `owner`'s program `program` (a name of theirs, or the hash of
    /// a module they uploaded, which also drops their names for it). Jobs
    /// keep running; the module's bytes go once nothing refers to them.
    pub(crate) fn delete_program(&mut self, owner: i64, program: &str) -> Result<(), Error> {
        let tx = self.conn.transaction()?;
        let by_name: Option<String> = tx
            .query_row(
                "SELECT hash FROM program_names WHERE owner = ?1 AND name = ?2",
                params![owner, program],
                |r| r.get(0),
            )
            .optional()?;
        let hash = if let Some(hash) = by_name {
            tx.execute(
                "DELETE FROM program_names WHERE owner = ?1 AND name = ?2",
                params![owner, program],
            )?;
            // The upload goes too unless another of the owner's names keeps it.
            tx.execute(
                "DELETE FROM program_uploads WHERE owner = ?1 AND hash = ?2 \
                 AND NOT EXISTS (SELECT 1 FROM program_names WHERE owner = ?1 AND hash = ?2)",
                params![owner, hash],
            )?;
            hash
        } else {
            let hash = program.to_ascii_lowercase();
            let n = if is_hash(program) {
                tx.execute(
                    "DELETE FROM program_uploads WHERE owner = ?1 AND hash = ?2",
                    params![owner, hash],
                )?
            } else {
                0
            };
            if n == 0 {
                let builtin: bool = tx.query_row(
                    "SELECT EXISTS (SELECT 1 FROM program_names WHERE owner IS NULL \
                         AND (name = ?1 OR hash = ?2))",
                    params![program, hash],
                    |r| r.get(0),
                )?;
                if builtin {
                    return Err(Error::Forbidden(format!(
                        "`{program}` is a bundled example; bundled examples cannot be deleted"
                    )));
                }
                return Err(Error::ProgramNotFound(format!(
                    "no program `{program}` among your programs; list them with GET /api/v1/programs \
                     (`bspweb programs`)"
                )));
            }
            tx.execute(
                "DELETE FROM program_names WHERE owner = ?1 AND hash = ?2",
                params![owner, hash],
            )?;
            hash
        };
        tx.execute(
            "DELETE FROM programs WHERE hash = ?1 \
             AND NOT EXISTS (SELECT 1 FROM program_names WHERE hash = ?1) \
             AND NOT EXISTS (SELECT 1 FROM program_uploads WHERE hash = ?1) \
             AND NOT EXISTS (SELECT 1 FROM jobs WHERE program_hash = ?1)",
            [&hash],
        )?;
        tx.commit()?;
        tracing::info!(owner, program, hash, "program deleted");
        Ok(())
    }

    /// The module hash `program` means for `owner`: their own name, a builtin
    /// name, or the hash of a module they uploaded or of a builtin.
    pub(super) fn resolve_program(
        tx: &Connection,
        owner: i64,
        program: &str,
    ) -> Result<String, Error> {
        let by_name: Option<String> = tx
            .query_row(
                "SELECT hash FROM program_names WHERE name = ?2 AND (owner = ?1 OR owner IS NULL) \
                 ORDER BY owner IS NULL LIMIT 1",
                params![owner, program],
                |r| r.get(0),
            )
            .optional()?;
        if let Some(hash) = by_name {
            return Ok(hash);
        }
        if is_hash(program) {
            let hash = program.to_ascii_lowercase();
            let allowed: bool = tx.query_row(
                "SELECT EXISTS (SELECT 1 FROM program_uploads WHERE owner = ?1 AND hash = ?2) \
                     OR EXISTS (SELECT 1 FROM program_names WHERE owner IS NULL AND hash = ?2)",
                params![owner, hash],
                |r| r.get(0),
            )?;
            if allowed {
                return Ok(hash);
            }
        }
        Err(Error::ProgramNotFound(format!(
            "no program `{program}`: it is neither one of your programs, nor a bundled example, \
             nor the hash of a module you uploaded; list what you can run with GET /api/v1/programs \
             (`bspweb programs`) or upload it first"
        )))
    }
}
