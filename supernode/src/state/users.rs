//! Users and their programs.

use super::enroll;
use super::*;

/// What a token check needs to know of an account, cached in memory
/// ([`Inner::accounts`]) so a request costs no SQL.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Account {
    pub(crate) role: Role,
    pub(crate) disabled: bool,
    /// Only tokens of this generation are accepted.
    pub(crate) generation: i64,
}

impl Account {
    fn of(user: &UserInfo, generation: i64) -> Account {
        Account {
            role: user.role,
            disabled: user.disabled,
            generation,
        }
    }
}

/// The columns [`user_row`] reads, in its order.
const USER_COLUMNS: &str =
    "id, name, role, disabled, created_at, max_processes, max_programs, max_output_mib";
const USER_COLUMN_COUNT: usize = 8;

/// A stored role; the schema's CHECK admits only the three.
fn role_of(s: &str) -> Role {
    Role::parse(s).unwrap_or(Role::User)
}

/// An account from a row of [`USER_COLUMNS`], its quotas resolved against
/// the supernode's defaults.
fn user_row(r: &crate::sql::Row<'_>, config: &crate::Config) -> crate::sql::Result<UserInfo> {
    let role = role_of(&r.get::<_, String>(2)?);
    let max_processes: Option<u32> = r.get(5)?;
    let max_programs: Option<u32> = r.get(6)?;
    let max_output_mib: Option<i64> = r.get(7)?;
    Ok(UserInfo {
        id: r.get(0)?,
        name: r.get(1)?,
        admin: role == Role::Admin,
        role,
        disabled: r.get(3)?,
        created_at: r.get(4)?,
        quotas: Quotas {
            max_processes: max_processes.unwrap_or(config.user_max_processes),
            max_programs: max_programs.unwrap_or(config.user_max_programs),
            max_output_mib: max_output_mib.map_or(config.user_storage_mib, u64_from_sql),
        },
        usage: None,
    })
}

/// What account `id` uses now.
pub(super) fn usage_of(conn: &Connection, id: i64) -> Result<Usage, Error> {
    Ok(conn.query_row(
        "SELECT \
             (SELECT coalesce(sum((nprocs - exited) * redundancy), 0) FROM jobs \
              WHERE owner = ?1 AND state = 'active'), \
             (SELECT count(*) FROM program_uploads WHERE owner = ?1), \
             (SELECT coalesce(sum(output_bytes), 0) FROM jobs WHERE owner = ?1)",
        [id],
        |r| {
            Ok(Usage {
                processes: r.get::<_, i64>(0)?.clamp(0, i64::from(u32::MAX)) as u32,
                programs: r.get::<_, i64>(1)?.clamp(0, i64::from(u32::MAX)) as u32,
                output_bytes: r.get::<_, i64>(2)?.max(0) as u64,
            })
        },
    )?)
}

/// The quotas in force for account `id`.
pub(super) fn quotas_of(
    conn: &Connection,
    config: &crate::Config,
    id: i64,
) -> Result<Quotas, Error> {
    Ok(conn
        .query_row(
            &format!("SELECT {USER_COLUMNS} FROM users WHERE id = ?1"),
            [id],
            |r| user_row(r, config),
        )
        .optional()?
        .map(|u| u.quotas)
        .unwrap_or_default())
}

impl Core {
    // ------------------------------------------------------------ users

    pub(crate) fn create_user(
        &mut self,
        inner: &Inner,
        name: &str,
        hash: &str,
        role: Role,
        quotas: &QuotaChange,
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
        let id: i64 = self.conn.query_row(
            "INSERT INTO users (name, password_hash, role, created_at, max_processes, max_programs, \
                 max_output_mib) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7) RETURNING id",
            params![
                name,
                hash,
                role.as_str(),
                now_ms(),
                quotas.max_processes,
                quotas.max_programs,
                quotas.max_output_mib.map(u64_to_sql)
            ],
            |r| r.get(0),
        )?;
        tracing::info!(user = name, %role, "created user");
        let user = self.account(inner, id)?;
        inner.accounts().insert(id, Account::of(&user, 0));
        Ok(user)
    }

    /// The account `id` as stored, with its quotas in force (no usage).
    fn account(&self, inner: &Inner, id: i64) -> Result<UserInfo, Error> {
        self.conn
            .query_row(
                &format!("SELECT {USER_COLUMNS} FROM users WHERE id = ?1"),
                [id],
                |r| user_row(r, &inner.config),
            )
            .optional()?
            .ok_or_else(|| Error::NotFound(format!("no user #{id}")))
    }

    /// The account named `name`, its password hash and token generation.
    pub(crate) fn user_with_hash(
        &self,
        inner: &Inner,
        name: &str,
    ) -> Result<Option<(UserInfo, String, i64)>, Error> {
        Ok(self
            .conn
            .query_row(
                &format!(
                    "SELECT {USER_COLUMNS}, password_hash, token_generation FROM users WHERE name = ?1"
                ),
                [name],
                |r| {
                    Ok((
                        user_row(r, &inner.config)?,
                        r.get(USER_COLUMN_COUNT)?,
                        r.get(USER_COLUMN_COUNT + 1)?,
                    ))
                },
            )
            .optional()?)
    }

    /// The account `id` with what it uses now, if it exists.
    pub(crate) fn user(&self, inner: &Inner, id: i64) -> Result<Option<UserInfo>, Error> {
        let Some(mut user) = self
            .conn
            .query_row(
                &format!("SELECT {USER_COLUMNS} FROM users WHERE id = ?1"),
                [id],
                |r| user_row(r, &inner.config),
            )
            .optional()?
        else {
            return Ok(None);
        };
        user.usage = Some(usage_of(&self.conn, id)?);
        Ok(Some(user))
    }

    /// Every account, by name, with what it uses now.
    pub(crate) fn users(&self, inner: &Inner) -> Result<Vec<UserInfo>, Error> {
        let mut stmt = self
            .conn
            .prepare(&format!("SELECT {USER_COLUMNS} FROM users ORDER BY name"))?;
        let mut users: Vec<UserInfo> = stmt
            .query_map([], |r| user_row(r, &inner.config))?
            .collect::<crate::sql::Result<_>>()?;
        for u in &mut users {
            u.usage = Some(usage_of(&self.conn, u.id)?);
        }
        Ok(users)
    }

    /// The id of the account named `name`, or a 404 saying how to list them.
    pub(crate) fn user_id(&self, name: &str) -> Result<i64, Error> {
        self.conn
            .query_row("SELECT id FROM users WHERE name = ?1", [name], |r| r.get(0))
            .optional()?
            .ok_or_else(|| {
                Error::NotFound(format!(
                    "no user named `{name}`; list them with GET /api/v1/users (`bspweb user list`)"
                ))
            })
    }

    /// An administrator (`actor`) changes the account `name`. Nobody changes
    /// their own role or disables themselves, so an administrator always
    /// remains.
    pub(crate) fn update_user(
        &mut self,
        inner: &Inner,
        fx: &mut Effects,
        actor: i64,
        name: &str,
        change: &UpdateUserRequest,
    ) -> Result<UserInfo, Error> {
        let id = self.user_id(name)?;
        let before = self.account(inner, id)?;
        // The caller's standing as stored now, not as its token said: two
        // administrators cannot demote or disable each other at once.
        let actor_ok: bool = self
            .conn
            .query_row(
                "SELECT role = 'admin' AND disabled = 0 FROM users WHERE id = ?1",
                [actor],
                |r| r.get(0),
            )
            .optional()?
            .unwrap_or(false);
        if !actor_ok {
            return Err(Error::Forbidden(
                "only administrators can change accounts".into(),
            ));
        }
        if id == actor {
            if change.role.is_some_and(|r| r != before.role) {
                return Err(Error::Conflict(
                    "you cannot change your own role; another administrator can".into(),
                ));
            }
            if change.disabled == Some(true) {
                return Err(Error::Conflict(
                    "you cannot disable your own account; another administrator can".into(),
                ));
            }
        }
        let tx = self.conn.transaction()?;
        // Absent fields stay; disabling ends every login (a new token
        // generation).
        let q = &change.quotas;
        let ends_logins = change.disabled == Some(true) && !before.disabled;
        tx.execute(
            "UPDATE users SET role = coalesce(?2, role), disabled = coalesce(?3, disabled), \
                 token_generation = token_generation + ?4, \
                 max_processes = coalesce(?5, max_processes), \
                 max_programs = coalesce(?6, max_programs), \
                 max_output_mib = coalesce(?7, max_output_mib) \
             WHERE id = ?1",
            params![
                id,
                change.role.map(Role::as_str),
                change.disabled,
                i64::from(ends_logins),
                q.max_processes,
                q.max_programs,
                q.max_output_mib.map(u64_to_sql)
            ],
        )?;
        let admins: i64 = tx.query_row(
            "SELECT count(*) FROM users WHERE role = 'admin' AND disabled = 0",
            [],
            |r| r.get(0),
        )?;
        if admins == 0 {
            return Err(Error::Conflict(
                "that would leave no enabled administrator".into(),
            ));
        }
        let (role, disabled, generation): (String, bool, i64) = tx.query_row(
            "SELECT role, disabled, token_generation FROM users WHERE id = ?1",
            [id],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )?;
        // A disabled volunteer's peers stop with their account, in the same
        // transaction.
        if ends_logins {
            let fenced =
                enroll::fence_account_peers(&tx, &mut self.place, inner, fx, id, now_ms())?;
            if !fenced.is_empty() {
                tracing::warn!(user = name, peers = ?fenced, "account disabled: its peers are fenced");
            }
        }
        tx.commit()?;
        // The token checks follow at once, from what was committed.
        inner.accounts().insert(
            id,
            Account {
                role: role_of(&role),
                disabled,
                generation,
            },
        );
        let mut user = self.account(inner, id)?;
        user.usage = Some(usage_of(&self.conn, id)?);
        tracing::info!(user = name, by = actor, ?change, "account changed");
        // A raised quota or an enabled account may let waiting jobs start.
        fx.wake_scheduler = true;
        Ok(user)
    }

    /// Sets the password hash of `name`; its earlier tokens stop working.
    /// Returns the account and its new token generation.
    pub(crate) fn set_password(
        &mut self,
        inner: &Inner,
        name: &str,
        hash: &str,
    ) -> Result<(UserInfo, i64), Error> {
        let id = self.user_id(name)?;
        let (role, disabled, generation): (String, bool, i64) = self.conn.query_row(
            "UPDATE users SET password_hash = ?2, token_generation = token_generation + 1 \
             WHERE id = ?1 RETURNING role, disabled, token_generation",
            params![id, hash],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )?;
        // The token checks follow at once, from what was written.
        inner.accounts().insert(
            id,
            Account {
                role: role_of(&role),
                disabled,
                generation,
            },
        );
        tracing::info!(user = name, "password changed");
        Ok((self.account(inner, id)?, generation))
    }

    /// What the token checks need of every account.
    pub(crate) fn accounts(&self) -> Result<HashMap<i64, Account>, Error> {
        let mut stmt = self
            .conn
            .prepare("SELECT id, role, disabled, token_generation FROM users")?;
        let rows = stmt.query_map([], |r| {
            Ok((
                r.get::<_, i64>(0)?,
                Account {
                    role: role_of(&r.get::<_, String>(1)?),
                    disabled: r.get(2)?,
                    generation: r.get(3)?,
                },
            ))
        })?;
        Ok(rows.collect::<crate::sql::Result<_>>()?)
    }

    // ------------------------------------------------------------ programs

    /// Stores a validated module, records the upload for `owner`
    /// (`None`: a builtin) and registers `name` if given.
    pub(crate) fn store_program(
        &mut self,
        config: &crate::Config,
        owner: Option<i64>,
        name: Option<&str>,
        description: Option<&str>,
        hash: &str,
        wasm: &[u8],
    ) -> Result<ProgramInfo, Error> {
        let now = now_ms();
        let tx = self.conn.transaction()?;
        tx.execute(
            "INSERT INTO programs (hash, bytes, size, created_at) VALUES (?1, ?2, ?3, ?4) ON CONFLICT DO NOTHING",
            params![hash, wasm, wasm.len() as i64, now],
        )?;
        if let Some(owner) = owner {
            let (stored, again): (u32, bool) = tx.query_row(
                "SELECT count(*), count(*) FILTER (WHERE hash = ?2) > 0 FROM program_uploads WHERE owner = ?1",
                params![owner, hash],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )?;
            let quota = quotas_of(&tx, config, owner)?.max_programs;
            if !again && quota > 0 && stored >= quota {
                return Err(Error::QuotaExceeded(format!(
                    "you store {stored} programs, your quota; delete programs you no longer need (`bspweb programs`, then DELETE /api/v1/programs/{{program}} or the web UI) or ask an administrator for a larger quota"
                )));
            }
            tx.execute(
                "INSERT INTO program_uploads (owner, hash, uploaded_at) VALUES (?1, ?2, ?3) ON CONFLICT DO NOTHING",
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
