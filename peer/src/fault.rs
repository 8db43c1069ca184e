//! Test-only fault injection (cargo feature `fault-injection`, which only
//! the test command enables): a peer started with `BSPWEB_TEST_FAULT` set
//! computes wrongly once, the way broken hardware would, so the tests can
//! show what redundancy catches (SECURITY.md, "Result validation").
//!
//! `BSPWEB_TEST_FAULT=message:S` flips one bit of the first non-empty
//! message a process of this peer sends in superstep `S`;
//! `BSPWEB_TEST_FAULT=memory:S` flips one bit of a process's linear memory
//! at the end of superstep `S` (before its checkpoint). Either happens once
//! per peer process. A release build without the feature has none of this.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};

use bytes::Bytes;

use crate::runtime::Process;

/// What goes wrong, and after which superstep.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    Message(u32),
    Memory(u32),
}

fn configured() -> Option<Fault> {
    static FAULT: OnceLock<Option<Fault>> = OnceLock::new();
    *FAULT.get_or_init(|| {
        let spec = std::env::var("BSPWEB_TEST_FAULT").ok()?;
        let (kind, at) = spec.split_once(':')?;
        let at: u32 = at.trim().parse().ok()?;
        let fault = match kind.trim() {
            "message" => Fault::Message(at),
            "memory" => Fault::Memory(at),
            _ => return None,
        };
        tracing::warn!("fault injection on: {fault:?} (BSPWEB_TEST_FAULT)");
        Some(fault)
    })
}

static FIRED: AtomicBool = AtomicBool::new(false);

/// Whether `fault` is the configured one and fires now (once).
fn fires(fault: Fault) -> bool {
    configured() == Some(fault) && !FIRED.swap(true, Ordering::SeqCst)
}

/// Called with the messages a process sent in `superstep`.
pub(crate) fn on_messages(superstep: u32, out: &mut [bsp_api::wire::WireMessage]) {
    if !out.iter().any(|m| !m.payload.is_empty()) || !fires(Fault::Message(superstep)) {
        return;
    }
    if let Some(m) = out.iter_mut().find(|m| !m.payload.is_empty()) {
        let mut bytes = m.payload.to_vec();
        bytes[0] ^= 1;
        tracing::warn!(
            src = m.src,
            dst = m.dst,
            superstep,
            seq = m.seq,
            "fault injection: flipped a bit of a message"
        );
        m.payload = Bytes::from(bytes);
    }
}

/// Called when a process reached the sync of `superstep`, before it is
/// captured.
pub(crate) fn on_sync(superstep: u32, process: &mut Process) {
    if fires(Fault::Memory(superstep)) {
        tracing::warn!(
            pid = process.pid(),
            superstep,
            "fault injection: flipped a bit of the process's memory"
        );
        process.corrupt_memory();
    }
}
