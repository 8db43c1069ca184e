//! The supernode certificate's fingerprint, as the supernode prints it and
//! clients pin it (`--supernode-fingerprint`): the SHA-256 of the leaf
//! certificate's DER encoding, written `sha256:` and 64 lower-case hex
//! digits. One type on both sides, so they cannot disagree on the format.
//!
//! The TLS client configuration itself is in `client::tls` (feature
//! `client`).

use std::fmt;
use std::str::FromStr;

use sha2::{Digest, Sha256};

/// The SHA-256 of a certificate's DER encoding.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fingerprint([u8; 32]);

/// The prefix of a written fingerprint.
pub const FINGERPRINT_PREFIX: &str = "sha256:";

impl Fingerprint {
    /// The fingerprint of the certificate whose DER encoding is `der`.
    pub fn of_der(der: &[u8]) -> Fingerprint {
        Fingerprint(Sha256::digest(der).into())
    }

    /// The 32 bytes of the digest.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }
}

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(FINGERPRINT_PREFIX)?;
        for b in self.0 {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// Why a text is not a fingerprint.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "`{text}` is not a certificate fingerprint: {reason}; write it as the supernode printed it, `sha256:` and 64 hex digits"
)]
pub struct FingerprintError {
    text: String,
    reason: &'static str,
}

impl FromStr for Fingerprint {
    type Err = FingerprintError;

    /// `sha256:` and 64 hex digits, either case. The prefix may be left out
    /// (any case, also `SHA256:`), and the digits may be separated by `:` in
    /// pairs, as `openssl x509 -fingerprint -sha256` prints them.
    fn from_str(s: &str) -> Result<Fingerprint, FingerprintError> {
        let err = |reason| FingerprintError {
            text: s.chars().take(120).collect(),
            reason,
        };
        let t = s.trim();
        let digits = match t.split_once(':') {
            Some((algo, rest)) if algo.eq_ignore_ascii_case("sha256") => rest,
            Some((algo, _)) if algo.len() > 2 => return Err(err("only sha256 is supported")),
            _ => t,
        };
        let hex: Vec<u8> = if digits.contains(':') {
            let pairs: Vec<&str> = digits.split(':').collect();
            if pairs.iter().any(|p| p.len() != 2) {
                return Err(err("separated digits must come in pairs"));
            }
            pairs.concat().into_bytes()
        } else {
            digits.as_bytes().to_vec()
        };
        if hex.len() != 64 {
            return Err(err("a SHA-256 fingerprint has 64 hex digits"));
        }
        let mut out = [0u8; 32];
        for (i, pair) in hex.chunks_exact(2).enumerate() {
            let (Some(hi), Some(lo)) = (hex_value(pair[0]), hex_value(pair[1])) else {
                return Err(err("it has a character that is not a hex digit"));
            };
            out[i] = hi << 4 | lo;
        }
        Ok(Fingerprint(out))
    }
}

fn hex_value(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    }
}

impl serde::Serialize for Fingerprint {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for Fingerprint {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Fingerprint, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fingerprint_is_the_sha256_of_the_der_written_with_its_prefix() {
        // SHA-256 of the empty string.
        let fp = Fingerprint::of_der(b"");
        let text = "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
        assert_eq!(fp.to_string(), text);
        assert_eq!(format!("{fp:?}"), text);
        assert_eq!(text.parse::<Fingerprint>(), Ok(fp));
        assert_eq!(fp.as_bytes()[0], 0xe3);
    }

    #[test]
    fn parsing_accepts_the_usual_spellings_and_round_trips() {
        let fp = Fingerprint::of_der(b"certificate");
        let plain = fp.to_string()[FINGERPRINT_PREFIX.len()..].to_string();
        let colons = plain
            .as_bytes()
            .chunks(2)
            .map(|c| std::str::from_utf8(c).unwrap().to_ascii_uppercase())
            .collect::<Vec<_>>()
            .join(":");
        for text in [
            fp.to_string(),
            fp.to_string().to_ascii_uppercase(),
            plain.clone(),
            format!("  sha256:{plain}\n"),
            format!("SHA256:{colons}"),
            colons.clone(),
        ] {
            assert_eq!(text.parse::<Fingerprint>(), Ok(fp), "{text:?}");
        }
        let json = serde_json::to_string(&fp).unwrap();
        assert_eq!(json, format!("\"{fp}\""));
        assert_eq!(serde_json::from_str::<Fingerprint>(&json).unwrap(), fp);
    }

    #[test]
    fn parsing_refuses_everything_else_saying_why() {
        let fp = Fingerprint::of_der(b"x").to_string();
        for (text, why) in [
            ("", "64 hex digits"),
            ("sha256:", "64 hex digits"),
            (&fp[..fp.len() - 1], "64 hex digits"),
            (&format!("{fp}0"), "64 hex digits"),
            (&format!("sha1:{}", &fp[7..]), "only sha256"),
            (&format!("sha256:{}g", &fp[8..]), "not a hex digit"),
            (&format!("sha256:{}é", &fp[9..]), "not a hex digit"),
            ("ab:c:de", "in pairs"),
        ] {
            let e = text.parse::<Fingerprint>().unwrap_err().to_string();
            assert!(e.contains(why), "{text:?}: {e}");
            assert!(e.contains("`sha256:` and 64 hex digits"), "{e}");
        }
        assert!(serde_json::from_str::<Fingerprint>("\"sha256:00\"").is_err());
    }
}
