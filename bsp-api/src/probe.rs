//! Link measurement between peers (dissertation ch. 5: the graph DiDiC
//! clusters): who may probe whom, proven by a ticket.
//!
//! The supernode gives every peer a *probe key* with its lease
//! ([`crate::control::Lease::probe_key`]), derived from the supernode's
//! secret and the peer's id, and tells a peer which others to measure
//! ([`crate::control::ProbeTarget`]), each with a ticket: HMAC-SHA256 under
//! the *target's* key of the prober's id, the target's id and an expiry.
//! The target checks the ticket with its own key ([`verify`]), so it
//! answers only probes the supernode asked for, without asking it.
//!
//! On the data plane a probe is one connection: [`crate::wire::ProbeFrame`]
//! `Hello` (with the ticket) → `Ready`; a few `Ping` → `Pong` (the round
//! trip); one `Bulk` of bytes → `Received` (the bandwidth).

use sha2::{Digest, Sha256};

use crate::PeerId;

/// HMAC-SHA256 (RFC 2104).
pub fn hmac_sha256(key: &[u8], message: &[u8]) -> [u8; 32] {
    const BLOCK: usize = 64;
    let mut block = [0u8; BLOCK];
    if key.len() > BLOCK {
        block[..32].copy_from_slice(&Sha256::digest(key));
    } else {
        block[..key.len()].copy_from_slice(key);
    }
    let pad = |byte: u8| block.map(|b| b ^ byte);
    let inner = Sha256::new()
        .chain_update(pad(0x36))
        .chain_update(message)
        .finalize();
    Sha256::new()
        .chain_update(pad(0x5c))
        .chain_update(inner)
        .finalize()
        .into()
}

/// A peer's probe key, from the supernode's secret: the same at every
/// login, and unknown to other peers.
pub fn probe_key(secret: &[u8], peer: PeerId) -> [u8; 32] {
    let mut message = b"bspweb probe key\n".to_vec();
    message.extend_from_slice(&peer.to_le_bytes());
    hmac_sha256(secret, &message)
}

fn ticket_message(from: PeerId, to: PeerId, expires_ms: i64) -> Vec<u8> {
    let mut m = b"bspweb probe ticket\n".to_vec();
    m.extend_from_slice(&from.to_le_bytes());
    m.extend_from_slice(&to.to_le_bytes());
    m.extend_from_slice(&expires_ms.to_le_bytes());
    m
}

/// The ticket that lets `from` probe `to` until `expires_ms` (Unix
/// milliseconds), under `to`'s probe key; hex.
pub fn ticket(to_key: &[u8; 32], from: PeerId, to: PeerId, expires_ms: i64) -> String {
    hex_encode(&hmac_sha256(to_key, &ticket_message(from, to, expires_ms)))
}

/// Why a probe's ticket is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TicketError {
    #[error("the probe is addressed to peer {to}, not to this peer ({me})")]
    NotForMe { to: PeerId, me: PeerId },
    #[error("the probe's ticket expired {ago_ms} ms ago")]
    Expired { ago_ms: i64 },
    #[error("the probe's ticket is not the supernode's")]
    Forged,
}

/// Check a ticket as peer `me`, with its probe key, at `now_ms`.
pub fn verify(
    my_key: &[u8; 32],
    me: PeerId,
    from: PeerId,
    to: PeerId,
    expires_ms: i64,
    ticket_hex: &str,
    now_ms: i64,
) -> Result<(), TicketError> {
    if to != me {
        return Err(TicketError::NotForMe { to, me });
    }
    if now_ms > expires_ms {
        return Err(TicketError::Expired {
            ago_ms: now_ms - expires_ms,
        });
    }
    let expected = hmac_sha256(my_key, &ticket_message(from, to, expires_ms));
    let given = hex_decode(ticket_hex).ok_or(TicketError::Forged)?;
    // Constant time: a forger learns nothing from how long a refusal takes.
    let differ = given.len() != expected.len()
        || given
            .iter()
            .zip(expected.iter())
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            != 0;
    if differ {
        return Err(TicketError::Forged);
    }
    Ok(())
}

/// Lower-case hex.
pub fn hex_encode(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Hex to bytes; `None` if it is not hex.
pub fn hex_decode(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 4231, test cases 1 and 6 (a key longer than a block).
    #[test]
    fn hmac_matches_rfc_4231() {
        assert_eq!(
            hex_encode(&hmac_sha256(&[0x0b; 20], b"Hi There")),
            "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7"
        );
        assert_eq!(
            hex_encode(&hmac_sha256(
                &[0xaa; 131],
                b"Test Using Larger Than Block-Size Key - Hash Key First"
            )),
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"
        );
    }

    #[test]
    fn a_ticket_admits_exactly_its_probe() {
        let key = probe_key(b"secret", 7);
        let t = ticket(&key, 3, 7, 1_000);
        assert_eq!(verify(&key, 7, 3, 7, 1_000, &t, 999), Ok(()));
        assert_eq!(verify(&key, 7, 3, 7, 1_000, &t, 1_000), Ok(()));
        assert_eq!(
            verify(&key, 7, 3, 7, 1_000, &t, 1_001),
            Err(TicketError::Expired { ago_ms: 1 })
        );
        // Another prober, a later expiry, another target's key, garbage.
        assert_eq!(
            verify(&key, 7, 4, 7, 1_000, &t, 0),
            Err(TicketError::Forged)
        );
        assert_eq!(
            verify(&key, 7, 3, 7, 2_000, &t, 0),
            Err(TicketError::Forged)
        );
        let other = probe_key(b"secret", 8);
        assert_eq!(
            verify(&other, 7, 3, 7, 1_000, &t, 0),
            Err(TicketError::Forged)
        );
        assert_eq!(
            verify(&key, 7, 3, 7, 1_000, "zz", 0),
            Err(TicketError::Forged)
        );
        assert_eq!(
            verify(&key, 7, 3, 7, 1_000, "", 0),
            Err(TicketError::Forged)
        );
        assert_eq!(
            verify(&key, 8, 3, 7, 1_000, &t, 0),
            Err(TicketError::NotForMe { to: 7, me: 8 })
        );
        assert_ne!(probe_key(b"secret", 7), probe_key(b"other", 7));
    }
}
