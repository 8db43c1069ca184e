//! Peer enrollment (issue 18): tokens an account creates for its peers, the
//! check at every peer login, revoking a token and disabling a peer, both
//! of which fence the peers concerned at once.
//!
//! A token is `bwpeer-<id>-<secret>` with a 256-bit random secret; only the
//! secret's SHA-256 is stored (a secret that long needs no slow hash). A
//! token may enroll any number of peers; each is its account's. Disabling a
//! peer refuses later logins under the same name with the same token: a
//! machine the volunteer no longer controls is shut out by revoking its
//! token.

use bsp_api::control::EnrollmentToken;
use bsp_api::rest::{EnrollmentInfo, NewEnrollment};

use super::peers::mark_gone;
use super::*;

/// Enrollments one account may hold that are not revoked.
pub(crate) const MAX_ENROLLMENTS_PER_ACCOUNT: i64 = 100;

use bsp_api::control::refusal::{self, HOW_TO_ENROLL};

fn refused(code: &'static str, message: String) -> Error {
    Error::Unauthorized { code, message }
}

/// Who asks: an account, and whether it is an administrator (who may act
/// on every account's tokens and peers).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Caller {
    pub id: i64,
    pub admin: bool,
}

/// Why `peers` are fenced by an account's decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FenceCause {
    /// Their enrollment token was revoked.
    Revoked,
    /// The peer was disabled.
    Disabled,
    /// Their volunteer's account was disabled.
    AccountDisabled,
    /// They hold processes but make no progress, say the jobs' other peers.
    Stalled,
    /// With redundancy, peers of other volunteers outvoted its result
    /// (`state::redundancy`).
    Quarantined,
}

impl FenceCause {
    fn loss(self) -> LossCause {
        match self {
            FenceCause::Revoked => LossCause::Revoked,
            FenceCause::Disabled | FenceCause::AccountDisabled => LossCause::Disabled,
            FenceCause::Stalled => LossCause::Stalled,
            FenceCause::Quarantined => LossCause::Quarantined,
        }
    }
}

/// The enrollment a peer login's token names, once it is checked: valid,
/// not revoked, its account enabled, and the peer's name not disabled.
pub(super) fn check_login(
    tx: &Connection,
    token: Option<&EnrollmentToken>,
    name: &str,
) -> Result<i64, Error> {
    let Some(token) = token else {
        return Err(refused(
            refusal::ENROLLMENT_REQUIRED,
            format!("this supernode admits only enrolled peers: {HOW_TO_ENROLL}"),
        ));
    };
    let Some((id, secret)) = token.parse() else {
        return Err(refused(
            refusal::BAD_ENROLLMENT_TOKEN,
            "the enrollment token is malformed: it reads `bwpeer-<id>-<64 hex digits>`; copy it \
             whole from `bspweb token create`"
                .into(),
        ));
    };
    let row: Option<(Vec<u8>, Option<i64>, bool, String)> = tx
        .query_row(
            "SELECT e.secret_hash, e.revoked_at, u.disabled, u.name \
             FROM enrollments e JOIN users u ON u.id = e.owner WHERE e.id = ?1",
            [id],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
        )
        .optional()?;
    let digest = Sha256::digest(secret);
    let Some((_, revoked_at, owner_disabled, owner)) =
        row.filter(|(hash, ..)| hash[..] == digest[..])
    else {
        return Err(refused(
            refusal::BAD_ENROLLMENT_TOKEN,
            format!(
                "enrollment token #{id} is not valid on this supernode (unknown, or its secret is \
                 wrong): {HOW_TO_ENROLL}"
            ),
        ));
    };
    if let Some(at) = revoked_at {
        return Err(refused(
            refusal::ENROLLMENT_REVOKED,
            format!(
                "enrollment token #{id} was revoked (at {at} ms since the epoch); its peers may \
                 not log in: ask its volunteer for a new token"
            ),
        ));
    }
    if owner_disabled {
        return Err(refused(
            refusal::ENROLLMENT_OWNER_DISABLED,
            format!(
                "the account `{owner}` that created enrollment token #{id} is disabled; its \
                 peers may not log in"
            ),
        ));
    }
    let disabled: Option<(PeerId, Option<String>)> = tx
        .query_row(
            "SELECT id, quarantine_reason FROM peers \
             WHERE enrollment = ?1 AND name = ?2 AND disabled = 1 ORDER BY id DESC LIMIT 1",
            params![id, name],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .optional()?;
    if let Some((peer, Some(why))) = &disabled {
        return Err(refused(
            refusal::PEER_DISABLED,
            format!(
                "the peer `{name}` of enrollment token #{id} was quarantined (peer #{peer}): \
                 {why}. Check the machine (memory, overclocking) before an administrator lets \
                 it in again with `bspweb peers enable {peer}`"
            ),
        ));
    }
    if let Some((peer, None)) = disabled {
        return Err(refused(
            refusal::PEER_DISABLED,
            format!(
                "the peer `{name}` of enrollment token #{id} was disabled by its volunteer or an \
                 administrator (peer #{peer}); `bspweb peers enable {peer}` lets it in again"
            ),
        ));
    }
    Ok(id)
}

fn info_row(r: &crate::sql::Row<'_>) -> crate::sql::Result<EnrollmentInfo> {
    Ok(EnrollmentInfo {
        id: r.get(0)?,
        name: r.get(1)?,
        owner: r.get(2)?,
        created_at: r.get(3)?,
        last_used_at: r.get(4)?,
        revoked_at: r.get(5)?,
        peers_online: r.get(6)?,
    })
}

const INFO_SELECT: &str = "SELECT e.id, e.name, u.name, e.created_at, e.last_used_at, \
         e.revoked_at, (SELECT count(*) FROM peers p WHERE p.enrollment = e.id AND p.state = 'online') \
     FROM enrollments e JOIN users u ON u.id = e.owner";

impl Core {
    /// Whether a login with `token` would pass [`check_login`].
    pub(crate) fn admits(&self, token: &EnrollmentToken) -> Result<bool, Error> {
        match check_login(&self.conn, Some(token), "") {
            Ok(_) => Ok(true),
            Err(Error::Unauthorized { .. }) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// A new enrollment token of `owner`'s: its secret is in the answer only.
    pub(crate) fn create_enrollment(
        &mut self,
        owner: i64,
        name: &str,
        now: i64,
    ) -> Result<NewEnrollment, Error> {
        let name = name.trim();
        if name.is_empty() || name.chars().count() > 64 || name.chars().any(char::is_control) {
            return Err(Error::Unprocessable {
                code: "invalid_body",
                message: "an enrollment token's `name` must be 1 to 64 printable characters".into(),
            });
        }
        let secret: [u8; 32] = rand::random();
        let tx = self.conn.transaction()?;
        let held: i64 = tx.query_row(
            "SELECT count(*) FROM enrollments WHERE owner = ?1 AND revoked_at IS NULL",
            [owner],
            |r| r.get(0),
        )?;
        if held >= MAX_ENROLLMENTS_PER_ACCOUNT {
            return Err(Error::QuotaExceeded(format!(
                "an account may hold at most {MAX_ENROLLMENTS_PER_ACCOUNT} enrollment tokens; \
                 revoke one it no longer needs (`bspweb token list`, `bspweb token revoke ID`)"
            )));
        }
        let id: i64 = tx.query_row(
            "INSERT INTO enrollments (owner, name, secret_hash, created_at) VALUES (?1, ?2, ?3, ?4) RETURNING id",
            params![owner, name, &Sha256::digest(secret)[..], now],
            |r| r.get(0),
        )?;
        let enrollment = tx.query_row(&format!("{INFO_SELECT} WHERE e.id = ?1"), [id], info_row)?;
        tx.commit()?;
        tracing::info!(enrollment = id, owner = %enrollment.owner, "enrollment token created");
        Ok(NewEnrollment {
            enrollment,
            token: EnrollmentToken::new(id, &secret),
        })
    }

    /// The enrollment tokens `caller` may see: its own, or all for an
    /// administrator; newest first.
    pub(crate) fn enrollments(&self, caller: Caller) -> Result<Vec<EnrollmentInfo>, Error> {
        let Caller { id: caller, admin } = caller;
        let mut stmt = self.conn.prepare(&format!(
            "{INFO_SELECT} WHERE ?1 = 1 OR e.owner = ?2 ORDER BY e.id DESC"
        ))?;
        let rows = stmt.query_map(params![admin, caller], info_row)?;
        Ok(rows.collect::<crate::sql::Result<_>>()?)
    }

    /// Revokes enrollment token `id` (its owner's or an administrator's
    /// call) and fences every peer online with it. Revoking a revoked token
    /// changes nothing.
    pub(crate) fn revoke_enrollment(
        &mut self,
        inner: &Inner,
        fx: &mut Effects,
        caller: Caller,
        id: i64,
        now: i64,
    ) -> Result<(), Error> {
        let Caller { id: caller, admin } = caller;
        let tx = self.conn.transaction()?;
        let owner: Option<(i64, Option<i64>)> = tx
            .query_row(
                "SELECT owner, revoked_at FROM enrollments WHERE id = ?1",
                [id],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .optional()?;
        // Another account's token and no token read alike: whether an id
        // exists is nobody else's business.
        match owner {
            Some((o, revoked)) if admin || o == caller => {
                if revoked.is_some() {
                    return Ok(());
                }
            }
            _ => {
                let whose = if admin { "" } else { " of yours" };
                return Err(Error::NotFound(format!("no enrollment token #{id}{whose}")));
            }
        }
        tx.execute(
            "UPDATE enrollments SET revoked_at = ?2 WHERE id = ?1",
            params![id, now],
        )?;
        let online = online_peers(&tx, "enrollment = ?1", id)?;
        let fenced = fence(
            &tx,
            &mut self.place,
            inner,
            fx,
            &online,
            FenceCause::Revoked,
            now,
        )?;
        tx.commit()?;
        inner.live().forget(&fenced);
        tracing::warn!(enrollment = id, peers = ?fenced, "enrollment token revoked; its peers are fenced");
        Ok(())
    }

    /// Disables (fences, and refuses its later logins under its name with
    /// its token) or enables `peer`: its volunteer's or an administrator's
    /// call. A peer that logged in without a token (older versions) only an
    /// administrator may change.
    pub(crate) fn set_peer_disabled(
        &mut self,
        inner: &Inner,
        fx: &mut Effects,
        caller: Caller,
        peer: PeerId,
        disabled: bool,
        now: i64,
    ) -> Result<PeerInfo, Error> {
        let Caller { id: caller, admin } = caller;
        let tx = self.conn.transaction()?;
        #[allow(clippy::type_complexity)]
        let row: Option<(Option<i64>, Option<i64>, String, Option<String>)> = tx
            .query_row(
                "SELECT p.enrollment, e.owner, p.name, p.quarantine_reason FROM peers p \
                 LEFT JOIN enrollments e ON e.id = p.enrollment WHERE p.id = ?1",
                [peer],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
            )
            .optional()?;
        let Some((enrollment, _, name, quarantine)) =
            row.filter(|(_, owner, ..)| admin || *owner == Some(caller))
        else {
            let whose = if admin { "" } else { " of yours" };
            return Err(Error::NotFound(format!("no peer #{peer}{whose}")));
        };
        // A quarantined peer computed wrongly: its volunteer may not simply
        // let it back in (issue 18, result validation).
        if let Some(why) = quarantine.filter(|_| !disabled && !admin) {
            return Err(Error::Forbidden(format!(
                "peer #{peer} was quarantined because {why}; only an administrator may enable it"
            )));
        }
        // Every row of the same machine (name and token) changes together,
        // so the login check sees one answer.
        // Enabling also lifts a quarantine (an administrator's call).
        match enrollment {
            Some(e) => tx.execute(
                "UPDATE peers SET disabled = ?3, \
                     quarantined_at = CASE WHEN CAST(?3 AS BIGINT) = 1 THEN quarantined_at END, \
                     quarantine_reason = CASE WHEN CAST(?3 AS BIGINT) = 1 THEN quarantine_reason END \
                 WHERE enrollment = ?1 AND name = ?2",
                params![e, name, disabled],
            )?,
            None => tx.execute(
                "UPDATE peers SET disabled = ?2, \
                     quarantined_at = CASE WHEN CAST(?2 AS BIGINT) = 1 THEN quarantined_at END, \
                     quarantine_reason = CASE WHEN CAST(?2 AS BIGINT) = 1 THEN quarantine_reason END \
                 WHERE id = ?1",
                params![peer, disabled],
            )?,
        };
        let mut fenced = Vec::new();
        if disabled {
            let online = match enrollment {
                Some(e) => {
                    let mut stmt = tx.prepare(
                        "SELECT id FROM peers WHERE enrollment = ?1 AND name = ?2 AND state = 'online'",
                    )?;
                    stmt.query_map(params![e, name], |r| r.get(0))?
                        .collect::<crate::sql::Result<Vec<PeerId>>>()?
                }
                None => online_peers(&tx, "id = ?1", peer)?,
            };
            fenced = fence(
                &tx,
                &mut self.place,
                inner,
                fx,
                &online,
                FenceCause::Disabled,
                now,
            )?;
        }
        tx.commit()?;
        inner.live().forget(&fenced);
        if disabled {
            tracing::warn!(peer, fenced = ?fenced, "peer disabled");
        } else {
            tracing::info!(peer, "peer enabled");
        }
        self.peers()?
            .into_iter()
            .find(|p| p.id == peer)
            .ok_or_else(|| Error::Internal(format!("peer #{peer} vanished")))
    }
}

/// Fences every online peer enrolled by `account`'s tokens (the account is
/// being disabled), in the caller's transaction; their leases end with its
/// commit (through [`Effects::forget_peers`]).
pub(super) fn fence_account_peers(
    tx: &Transaction<'_>,
    place: &mut Place,
    inner: &Inner,
    fx: &mut Effects,
    account: i64,
    now: i64,
) -> Result<Vec<PeerId>, Error> {
    let online = online_peers(
        tx,
        "enrollment IN (SELECT id FROM enrollments WHERE owner = ?1)",
        account,
    )?;
    let fenced = fence(
        tx,
        place,
        inner,
        fx,
        &online,
        FenceCause::AccountDisabled,
        now,
    )?;
    fx.forget_peers.extend(fenced.iter().copied());
    Ok(fenced)
}

/// The online peers matching `filter` (an SQL condition on `peers` with
/// one parameter, `?1`).
fn online_peers(tx: &Connection, filter: &str, arg: i64) -> Result<Vec<PeerId>, Error> {
    let mut stmt = tx.prepare(&format!(
        "SELECT id FROM peers WHERE state = 'online' AND {filter}"
    ))?;
    let rows = stmt.query_map([arg], |r| r.get(0))?;
    Ok(rows.collect::<crate::sql::Result<_>>()?)
}

/// Marks `peers` gone now and restores their processes elsewhere, as an
/// expired lease would; their lease tokens stop working once the caller
/// removes them from [`Live`] after the commit. Returns them.
pub(super) fn fence(
    tx: &Transaction<'_>,
    place: &mut Place,
    inner: &Inner,
    fx: &mut Effects,
    peers: &[PeerId],
    cause: FenceCause,
    now: i64,
) -> Result<Vec<PeerId>, Error> {
    let mut lost = BTreeMap::new();
    for &peer in peers {
        let name = mark_gone(tx, place, peer)?;
        fx.counts.add(Counter::PeersLost, 1);
        tracing::warn!(peer, name = %name, ?cause, "peer fenced");
        lost.insert(peer, name);
    }
    if !lost.is_empty() {
        epoch::restore_lost(tx, place, inner, fx, &lost, cause.loss(), now)?;
        fx.wake_scheduler = true;
    }
    Ok(peers.to_vec())
}
