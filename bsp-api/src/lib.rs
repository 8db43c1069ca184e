//! Wire and REST types shared by every bspweb component.
//!
//! **Architecture Invariant:** this is the only crate that defines types which
//! cross a process boundary. The supernode, the peer, the CLI and the consumer
//! client all speak through these types; inner types are converted at the edge.
//!
//! - [`rest`]: the user-facing REST API under `/api/v1` (JSON).
//! - [`control`]: the peer ↔ supernode control plane (JSON over HTTP, lease token).
//! - [`wire`]: the peer ↔ peer data plane (postcard frames over TCP).
//! - [`probe`]: tickets for the link measurements between peers.
//! - [`tls`]: the supernode certificate's fingerprint, as printed and pinned.
//! - `client` (feature `client`): an async HTTP client for the REST API.

pub mod control;
pub mod probe;
pub mod rest;
pub mod tls;
pub mod wire;

#[cfg(feature = "client")]
pub mod client;

/// Version of the REST and control-plane protocol; bumped on incompatible changes.
pub const API_VERSION: u32 = 1;

/// Identifier of a job, assigned by the supernode.
pub type JobId = i64;

/// Identifier of a peer, assigned by the supernode at first login.
pub type PeerId = i64;

/// Index of a BSP process within its job: `0..nprocs`.
pub type Pid = u32;

/// The key per-address connection limits count under (the supernode's HTTP
/// listener, the peers' data-plane listener): an IPv4 address as it is, an
/// IPv6 address by its /64 network (one host usually owns a whole /64), an
/// IPv4-mapped IPv6 address as its IPv4 address.
pub fn connection_key(ip: std::net::IpAddr) -> std::net::IpAddr {
    use std::net::{IpAddr, Ipv6Addr};
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let s = v6.segments();
                IpAddr::V6(Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
            }
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connection_keys_group_an_ipv6_network_and_keep_ipv4() {
        let k = |s: &str| connection_key(s.parse().unwrap()).to_string();
        assert_eq!(k("192.0.2.7"), "192.0.2.7");
        assert_eq!(k("::ffff:192.0.2.7"), "192.0.2.7");
        assert_eq!(k("2001:db8:1:2:aaaa::1"), "2001:db8:1:2::");
        assert_eq!(k("2001:db8:1:2:bbbb::9"), k("2001:db8:1:2::5"));
        assert_ne!(k("2001:db8:1:3::1"), k("2001:db8:1:2::1"));
    }
}
