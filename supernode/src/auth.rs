//! Passwords (Argon2id), tokens (JWT HS256) and the request extractors that
//! check them.
//!
//! Users get a token with audience [`USER_AUDIENCE`], valid for
//! [`USER_TOKEN_TTL`]; peers get a lease token with audience
//! [`PEER_AUDIENCE`] that also names the lease it belongs to. Neither is
//! accepted in place of the other. The algorithm is pinned to HS256 and the
//! issuer to [`ISSUER`].

use std::io::Write;
use std::path::Path;
use std::time::Duration;

use argon2::Argon2;
use argon2::password_hash::{PasswordHasher, PasswordVerifier};
use axum::extract::FromRequestParts;
use axum::http::header::AUTHORIZATION;
use axum::http::request::Parts;
use bsp_api::PeerId;
use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use serde::{Deserialize, Serialize};

use crate::state::Account;
use crate::{Error, Supernode, lease, now_ms};
use bsp_api::rest::Role;

/// The `iss` of every token.
pub const ISSUER: &str = "bspweb";
/// The `aud` of user tokens.
pub const USER_AUDIENCE: &str = "bspweb-user";
/// The `aud` of peer lease tokens.
pub const PEER_AUDIENCE: &str = "bspweb-peer";
/// How long a user token is valid.
pub const USER_TOKEN_TTL: Duration = Duration::from_secs(24 * 3600);
/// How long a peer token outlives its lease. The lease itself, checked on
/// every call, is what really limits a token: it names its lease, which ends
/// when it is not renewed or the peer logs in again. The long grace lets a
/// peer keep using the token of its login across renewals.
const PEER_TOKEN_GRACE: Duration = Duration::from_secs(30 * 24 * 3600);

/// Hashes a password with Argon2id (default parameters). Slow by design: call
/// from a blocking thread.
pub(crate) fn hash_password(password: &str) -> Result<String, Error> {
    Argon2::default()
        .hash_password(password.as_bytes())
        .map(|h| h.to_string())
        .map_err(|e| Error::Internal(format!("cannot hash a password: {e}")))
}

/// Checks a password against a stored hash. Slow by design: call from a
/// blocking thread. A malformed stored hash never matches.
pub(crate) fn verify_password(password: &str, hash: &str) -> bool {
    Argon2::default()
        .verify_password(password.as_bytes(), hash)
        .is_ok()
}

/// The JWT signing keys, and the secret peers' probe keys derive from.
pub(crate) struct Keys {
    encoding: EncodingKey,
    decoding: DecodingKey,
    probe_secret: [u8; 32],
}

impl Keys {
    pub(crate) fn from_secret(secret: &[u8]) -> Keys {
        Keys {
            encoding: EncodingKey::from_secret(secret),
            decoding: DecodingKey::from_secret(secret),
            // Not the JWT secret itself: a probe key reveals nothing of it.
            probe_secret: bsp_api::probe::hmac_sha256(secret, b"bspweb probe keys"),
        }
    }

    /// The key probes to `peer` are checked with ([`bsp_api::probe`]).
    pub(crate) fn probe_key(&self, peer: bsp_api::PeerId) -> [u8; 32] {
        bsp_api::probe::probe_key(&self.probe_secret, peer)
    }

    /// [`Keys::probe_key`] in hex, as the lease carries it.
    pub(crate) fn probe_key_hex(&self, peer: bsp_api::PeerId) -> String {
        bsp_api::probe::hex_encode(&self.probe_key(peer))
    }

    fn validation(audience: &str) -> Validation {
        let mut v = Validation::new(Algorithm::HS256);
        v.set_issuer(&[ISSUER]);
        v.set_audience(&[audience]);
        v.set_required_spec_claims(&["exp", "iss", "aud", "sub"]);
        v.leeway = 5;
        v
    }

    fn sign<T: Serialize>(&self, claims: &T) -> Result<String, Error> {
        jsonwebtoken::encode(&Header::new(Algorithm::HS256), claims, &self.encoding)
            .map_err(|e| Error::Internal(format!("cannot sign a token: {e}")))
    }

    /// A user token; returns it with its expiry in Unix seconds.
    /// `generation`: the account's token generation ([`Account`]).
    pub(crate) fn user_token(
        &self,
        user_id: i64,
        name: &str,
        generation: i64,
    ) -> Result<(String, i64), Error> {
        let now = now_ms() / 1000;
        let exp = now + USER_TOKEN_TTL.as_secs() as i64;
        let claims = Claims {
            iss: ISSUER.into(),
            aud: USER_AUDIENCE.into(),
            sub: user_id.to_string(),
            iat: now,
            exp,
            name: name.into(),
            lid: String::new(),
            generation,
        };
        Ok((self.sign(&claims)?, exp))
    }

    /// A lease token of `peer` for lease `lease_id`, which ends at
    /// `lease_expires_at` (Unix ms).
    pub(crate) fn peer_token(
        &self,
        peer: PeerId,
        lease_id: &str,
        lease_expires_at: i64,
    ) -> Result<String, Error> {
        let now = now_ms() / 1000;
        let claims = Claims {
            iss: ISSUER.into(),
            aud: PEER_AUDIENCE.into(),
            sub: peer.to_string(),
            iat: now,
            exp: lease_expires_at / 1000 + PEER_TOKEN_GRACE.as_secs() as i64,
            name: String::new(),
            lid: lease_id.into(),
            generation: 0,
        };
        self.sign(&claims)
    }

    fn decode(&self, token: &str, audience: &str) -> Result<Claims, Error> {
        match jsonwebtoken::decode::<Claims>(token, &self.decoding, &Self::validation(audience)) {
            Ok(data) => Ok(data.claims),
            Err(e) => Err(match e.kind() {
                ErrorKind::ExpiredSignature => Error::Unauthorized {
                    code: "token_expired",
                    message: if audience == USER_AUDIENCE {
                        "your login has expired; log in again".into()
                    } else {
                        "the lease token has expired; log in again".into()
                    },
                },
                ErrorKind::InvalidAudience if audience == USER_AUDIENCE => Error::unauthorized(
                    "this token is not a user token (it is a peer lease token); log in with a user name and password",
                ),
                ErrorKind::InvalidAudience => Error::unauthorized(
                    "this token is not a peer lease token; peers log in with POST /api/v1/peer/login",
                ),
                _ => Error::unauthorized("the token is not valid here; log in again"),
            }),
        }
    }
}

/// The claims of both kinds of token. `name` is set in user tokens, `lid`
/// (the lease id) in peer tokens; the audience tells them apart.
#[derive(Debug, Default, Serialize, Deserialize)]
struct Claims {
    iss: String,
    aud: String,
    sub: String,
    iat: i64,
    exp: i64,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    name: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    lid: String,
    /// User tokens: the account's token generation when it was issued.
    #[serde(default, rename = "gen")]
    generation: i64,
}

/// Loads the JWT secret from `path`, or creates one (32 random bytes, hex,
/// mode 0600) when the file does not exist.
pub(crate) fn load_or_create_secret(path: &Path) -> anyhow::Result<Vec<u8>> {
    use anyhow::Context;
    match std::fs::read_to_string(path) {
        Ok(text) => {
            let secret = hex::decode(text.trim()).with_context(|| {
                format!(
                    "the JWT secret {} is not hex; delete it to have a new one generated (every login becomes invalid)",
                    path.display()
                )
            })?;
            if secret.len() < 32 {
                anyhow::bail!(
                    "the JWT secret {} is shorter than 32 bytes; delete it to have a new one generated",
                    path.display()
                );
            }
            Ok(secret)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let secret: [u8; 32] = rand::random();
            let mut options = std::fs::OpenOptions::new();
            options.write(true).create_new(true);
            #[cfg(unix)]
            {
                use std::os::unix::fs::OpenOptionsExt;
                options.mode(0o600);
            }
            let mut file = options
                .open(path)
                .with_context(|| format!("cannot create the JWT secret {}", path.display()))?;
            writeln!(file, "{}", hex::encode(secret))
                .and_then(|()| file.sync_all())
                .with_context(|| format!("cannot write the JWT secret {}", path.display()))?;
            Ok(secret.to_vec())
        }
        Err(e) => Err(e).with_context(|| format!("cannot read the JWT secret {}", path.display())),
    }
}

fn bearer(parts: &Parts) -> Result<&str, Error> {
    let Some(value) = parts.headers.get(AUTHORIZATION) else {
        return Err(Error::unauthorized(
            "missing `Authorization: Bearer <token>` header; log in first",
        ));
    };
    let value = value
        .to_str()
        .map_err(|_| Error::unauthorized("the Authorization header is not valid text"))?;
    match value.split_once(' ') {
        Some((scheme, token))
            if scheme.eq_ignore_ascii_case("bearer") && !token.trim().is_empty() =>
        {
            Ok(token.trim())
        }
        _ => Err(Error::unauthorized(
            "the Authorization header must be `Bearer <token>`",
        )),
    }
}

/// A request made by a logged-in user whose account exists, is enabled,
/// and issued the token after its last password change.
#[derive(Debug, Clone)]
pub(crate) struct AuthUser {
    pub id: i64,
    pub name: String,
    pub role: Role,
}

impl AuthUser {
    /// A 403 unless the caller is an administrator.
    pub(crate) fn require_admin(&self, what: &str) -> Result<(), Error> {
        if self.role == Role::Admin {
            Ok(())
        } else {
            Err(Error::Forbidden(format!(
                "only administrators can {what}; you are logged in as `{}`, a {} account",
                self.name, self.role
            )))
        }
    }

    /// A 403 for volunteer accounts, which donate computers and run no jobs.
    pub(crate) fn require_runner(&self, what: &str) -> Result<(), Error> {
        if self.role == Role::Volunteer {
            Err(Error::Forbidden(format!(
                "`{}` is a volunteer account: it donates computers and cannot {what}; ask an administrator for the user role (`bspweb user set {} --role user`)",
                self.name, self.name
            )))
        } else {
            Ok(())
        }
    }
}

impl FromRequestParts<Supernode> for AuthUser {
    type Rejection = Error;

    async fn from_request_parts(parts: &mut Parts, state: &Supernode) -> Result<Self, Error> {
        let token = bearer(parts)?;
        let claims = state.inner.keys.decode(token, USER_AUDIENCE)?;
        let id = claims
            .sub
            .parse()
            .map_err(|_| Error::unauthorized("the token is not valid here; log in again"))?;
        let account = state.inner.accounts().get(&id).copied();
        let role = match check_account(account, claims.generation) {
            Ok(role) => role,
            // Another supernode of the database may have made the account
            // (or issued the token) a moment ago: read it again, once.
            Err(_) if state.refresh_shared().await => {
                let account = state.inner.accounts().get(&id).copied();
                check_account(account, claims.generation)?
            }
            Err(e) => return Err(e),
        };
        Ok(AuthUser {
            id,
            name: claims.name,
            role,
        })
    }
}

/// Whether a user token of token generation `generation` is good for
/// `account`; its role if so.
fn check_account(account: Option<Account>, generation: i64) -> Result<Role, Error> {
    match account {
        None => Err(Error::unauthorized(
            "your user account no longer exists; ask an administrator",
        )),
        Some(a) if a.disabled => Err(Error::Unauthorized {
            code: "account_disabled",
            message: "your account is disabled; ask an administrator to enable it".into(),
        }),
        Some(a) if generation != a.generation => Err(Error::Unauthorized {
            code: "token_expired",
            message: "your password was changed (or your account disabled) since this login; log in again".into(),
        }),
        Some(a) => Ok(a.role),
    }
}

/// A request made by a peer holding a valid lease.
#[derive(Debug, Clone)]
pub(crate) struct AuthPeer {
    pub id: PeerId,
    /// The lease its token names.
    pub lease: String,
}

impl FromRequestParts<Supernode> for AuthPeer {
    type Rejection = Error;

    async fn from_request_parts(parts: &mut Parts, state: &Supernode) -> Result<Self, Error> {
        let token = bearer(parts)?;
        let claims = state.inner.keys.decode(token, PEER_AUDIENCE)?;
        let id: PeerId = claims
            .sub
            .parse()
            .map_err(|_| Error::unauthorized("the lease token is not valid here; log in again"))?;
        let valid = || {
            state.inner.live().peers.get(&id).is_some_and(|p| {
                p.lease_id == claims.lid && lease::is_valid(now_ms(), p.expires_at)
            })
        };
        // A peer may have logged in or renewed at another supernode of the
        // database: read the leases again, once, before refusing it.
        if valid() || (state.refresh_peer(id).await && valid()) {
            Ok(AuthPeer {
                id,
                lease: claims.lid,
            })
        } else {
            Err(Error::Unauthorized {
                code: "lease_expired",
                message: format!("the lease of peer {id} has expired; log in again"),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_verify_only_with_the_right_password() {
        let hash = hash_password("correct horse").unwrap();
        assert!(hash.starts_with("$argon2id$"), "{hash}");
        assert!(verify_password("correct horse", &hash));
        assert!(!verify_password("Correct horse", &hash));
        assert!(!verify_password("correct horse", "not a phc string"));
    }

    #[test]
    fn user_and_peer_tokens_are_not_interchangeable() {
        let keys = Keys::from_secret(&[7u8; 32]);
        let (user, _) = keys.user_token(1, "alice", 0).unwrap();
        let peer = keys.peer_token(3, "lease", now_ms() + 10_000).unwrap();
        assert!(keys.decode(&user, USER_AUDIENCE).is_ok());
        assert!(keys.decode(&peer, PEER_AUDIENCE).is_ok());
        let e = keys.decode(&peer, USER_AUDIENCE).unwrap_err();
        assert!(e.to_string().contains("not a user token"), "{e}");
        let e = keys.decode(&user, PEER_AUDIENCE).unwrap_err();
        assert!(e.to_string().contains("not a peer lease token"), "{e}");
    }

    #[test]
    fn tokens_signed_with_another_key_or_expired_are_refused() {
        let keys = Keys::from_secret(&[7u8; 32]);
        let other = Keys::from_secret(&[8u8; 32]);
        let (token, _) = other.user_token(1, "alice", 0).unwrap();
        assert!(matches!(
            keys.decode(&token, USER_AUDIENCE),
            Err(Error::Unauthorized { .. })
        ));
        let old = Claims {
            iss: ISSUER.into(),
            aud: USER_AUDIENCE.into(),
            sub: "1".into(),
            iat: 0,
            exp: now_ms() / 1000 - 3600,
            name: "alice".into(),
            lid: String::new(),
            generation: 0,
        };
        let token = keys.sign(&old).unwrap();
        match keys.decode(&token, USER_AUDIENCE) {
            Err(Error::Unauthorized { code, .. }) => assert_eq!(code, "token_expired"),
            other => panic!("expected an expired token, got {other:?}"),
        }
        // A token with `alg: none` or another algorithm is refused.
        let unsigned = format!("eyJhbGciOiJub25lIn0.{}.", token.split('.').nth(1).unwrap());
        assert!(keys.decode(&unsigned, USER_AUDIENCE).is_err());
    }

    #[test]
    fn a_token_is_good_only_for_an_enabled_account_of_its_generation() {
        let account = |disabled, generation| {
            Some(Account {
                role: Role::Volunteer,
                disabled,
                generation,
            })
        };
        assert_eq!(
            check_account(account(false, 3), 3).unwrap(),
            Role::Volunteer
        );
        let code = |r: Result<Role, Error>| match r {
            Err(Error::Unauthorized { code, .. }) => code,
            other => panic!("{other:?}"),
        };
        assert_eq!(code(check_account(account(false, 3), 2)), "token_expired");
        assert_eq!(code(check_account(account(true, 3), 3)), "account_disabled");
        assert_eq!(code(check_account(None, 0)), "unauthorized");
    }

    #[test]
    fn the_secret_is_created_once_with_owner_only_permissions() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("jwt-secret");
        let a = load_or_create_secret(&path).unwrap();
        let b = load_or_create_secret(&path).unwrap();
        assert_eq!(a, b);
        assert_eq!(a.len(), 32);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&path).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        std::fs::write(&path, "zz").unwrap();
        assert!(load_or_create_secret(&path).is_err());
    }
}
