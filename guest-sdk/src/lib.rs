//! The bspweb guest SDK: write bulk-synchronous parallel (BSP) programs as
//! async Rust, compile them to WebAssembly, and run them on bspweb peers.
//!
//! # Writing a program
//!
//! A program is one `async fn` marked [`#[bspweb::main]`](main). Every
//! process of the job runs it with its own [`Bsp`] handle and the job's
//! arguments, decoded from JSON into any `serde` type (`()` for none):
//!
//! ```rust,no_run
//! use bspweb::{Bsp, Result};
//! use serde::Deserialize;
//!
//! #[derive(Deserialize, Default)]
//! #[serde(default)]
//! struct Args {
//!     rounds: u32,
//! }
//!
//! #[bspweb::main]
//! async fn run(bsp: &mut Bsp, args: Args) -> Result<()> {
//!     let (pid, n) = (bsp.pid(), bsp.nprocs());
//!     for _ in 0..args.rounds {
//!         bsp.send((pid + 1) % n, &pid)?;     // delivered after the next sync
//!         bsp.sync().await;                  // superstep boundary
//!         for m in bsp.messages() {
//!             bsp.println(format!("got {} from {}", m.decode::<u32>()?, m.source()));
//!         }
//!     }
//!     Ok(())
//! }
//! # fn main() {}
//! ```
//!
//! The function may have any name; the examples call it `main`.
//!
//! A superstep is the code between two `bsp.sync().await`s. Messages sent in
//! superstep *s* are delivered at the start of *s + 1*, ordered by source pid
//! and then in sending order. Values are sent with [`Bsp::send`]
//! (serialized with postcard, read back with [`Message::decode`]) or as raw
//! bytes with [`Bsp::send_bytes`], and slices of numbers straight from
//! memory with [`Bsp::send_numbers`]. Output goes to the user who started the
//! job: [`Bsp::println`], [`Bsp::eprintln`] and [`Bsp::write_raw`].
//!
//! Messages of different kinds sent in one superstep are told apart by a
//! tag ([`Bsp::send_tagged`], [`Bsp::with_tag`], [`Bsp::messages_tagged`])
//! rather than by their order.
//!
//! Collective operations take one superstep each and combine values in pid
//! order, so every process gets the same result: [`Bsp::all_gather`],
//! [`Bsp::all_reduce`] and [`Bsp::reduce`]. [`dist`] splits index ranges
//! into blocks ([`dist::block`]) and finds the owner of an index
//! ([`dist::owner`]).
//!
//! # Cheap checkpoints
//!
//! At every sync the host checkpoints the process's linear memory: the
//! 64 KiB pages that changed since the last checkpoint travel to two other
//! peers. A superstep's messages are freed (zeroed) before the sync, so they
//! cost nothing. What the program writes costs what it writes: prefer
//! [`Bsp::send_numbers`] to filling a send buffer, reuse buffers rather
//! than allocate new ones each superstep, and zero (or shrink) a large
//! buffer that is dead at the sync if it is rewritten anyway.
//!
//! Returning `Err` from `main`, calling [`Bsp::abort`] or panicking ends the
//! whole job, and the user sees the message (a panic as
//! `panicked at FILE:LINE:COL: MESSAGE`).
//!
//! # Building
//!
//! A program is a `cdylib` crate (or a `cdylib` example) that depends on
//! `bspweb` and `serde`:
//!
//! ```toml
//! [lib]
//! crate-type = ["cdylib"]
//! ```
//!
//! ```text
//! rustup target add wasm32-unknown-unknown
//! cargo build --release --target wasm32-unknown-unknown
//! ```
//!
//! and upload `target/wasm32-unknown-unknown/release/NAME.wasm`. The module
//! imports only the host functions of `bspweb_v1` and exports `memory` and
//! `bspweb_resume`.
//!
//! # How it runs: every sync returns to the host
//!
//! `bsp.sync().await` suspends the program's future, and the exported
//! `bspweb_resume` returns to the host with no WebAssembly frame live. The
//! program's whole state (its locals across the await, its heap) then lies
//! in linear memory, which the peer copies as a checkpoint and can restore on
//! another peer. [`Bsp::may_migrate`] adds such points inside long
//! supersteps. A program can therefore await only `sync()` and
//! `may_migrate()`: there is no executor, no timer and no I/O.
//!
//! # Determinism rules
//!
//! A process that is restored from a checkpoint re-executes its superstep,
//! and the runtime relies on it producing the same messages and output.
//! Programs must therefore be deterministic functions of their arguments,
//! seed and messages:
//!
//! - **No clock.** `std::time::Instant::now()` and `SystemTime::now()` panic
//!   on `wasm32-unknown-unknown`; the host offers no time.
//! - **No entropy.** Use [`Bsp::rng`] (seeded from the job's
//!   [`seed`](Bsp::seed) and the pid) for all randomness.
//! - **No threads.** State lives in linear memory and in mutable wasm
//!   globals of numeric type (such as `__stack_pointer`); checkpoints record
//!   both. Plain `static`s with interior mutability are fine. Modules that
//!   change their tables or drop segments are refused, since a checkpoint
//!   would not record that.
//! - Prefer `BTreeMap` (or a fixed hasher) where iteration order reaches
//!   messages or output.
//!
//! Floating point is deterministic (the peer canonicalizes the NaNs that
//! arithmetic produces wherever their bits could be seen, SIMD ones too,
//! and disables relaxed SIMD); NaNs you load, store or pass on keep their
//! payloads. Fixed-width SIMD is allowed: build with
//! `RUSTFLAGS="-C target-feature=+simd128"` to use `core::arch::wasm32`.
//!
//! # Native builds
//!
//! The crate also builds for the host so that its pure parts, [`Rng`] and
//! [`dist`], can be used by tests and tools; every method that needs the host
//! panics there with "bspweb programs run only inside a bspweb peer (wasm32)".

mod bsp;
mod collective;
pub mod dist;
mod error;
mod host;
mod rng;
mod rt;

pub use bsp::{Bsp, MayMigrate, Message, Number, SyncPoint};
pub use error::{Error, IntoOutcome, Result};
pub use rng::Rng;

/// Marks a BSP program's main function and exports it to the host as
/// `bspweb_resume`.
///
/// The function must be an `async fn` taking `&mut Bsp` and the job's
/// arguments (any `serde::de::DeserializeOwned + 'static` type, `()` for
/// none) and returning `()` or `Result<(), E>` with `E: Display`. The job's
/// arguments are JSON; empty arguments decode as `null` or `{}`, so `()` and
/// structs with `#[serde(default)]` need none. Arguments that do not decode
/// end the job with a message naming the expected type.
///
/// Applying it to anything else is a compile error:
///
/// ```rust,compile_fail
/// #[bspweb::main]
/// fn run(bsp: &mut bspweb::Bsp, args: ()) {} // error: must be an `async fn`
/// # fn main() {}
/// ```
pub use bspweb_macros::main;

/// The runtime behind `#[bspweb::main]`; not a public API.
#[doc(hidden)]
pub mod __rt {
    pub use crate::host::abi;
    pub use crate::rt::resume;
}
