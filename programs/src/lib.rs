//! The example BSP programs, compiled to WebAssembly and embedded.
//!
//! `build.rs` builds the examples of the guest SDK (`guest-sdk/examples`) for
//! `wasm32-unknown-unknown` as part of the normal `cargo build` and embeds
//! the modules here, so the CLI, the supernode and the tests can run them
//! without a separate build step.
//!
//! ```rust,no_run
//! let ring = bspweb_programs::get("ring").expect("ring is built in");
//! assert!(ring.wasm.starts_with(b"\0asm"));
//! for p in bspweb_programs::builtin() {
//!     println!("{:14} {}", p.name, p.description);
//! }
//! ```

use std::fmt;

/// One embedded program.
pub struct Program {
    /// Its name, as users type it (`ring`, `sample-sort`, ...).
    pub name: &'static str,
    /// One line saying what it does and which arguments it takes.
    pub description: &'static str,
    /// The WebAssembly module.
    pub wasm: &'static [u8],
    /// Whether it is offered to users; `false` for the test program
    /// `misbehave`.
    pub builtin: bool,
}

impl fmt::Debug for Program {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Program")
            .field("name", &self.name)
            .field("description", &self.description)
            .field("wasm_bytes", &self.wasm.len())
            .field("builtin", &self.builtin)
            .finish()
    }
}

include!(concat!(env!("OUT_DIR"), "/programs.rs"));

/// The program called `name`, including the test program `misbehave`.
pub fn get(name: &str) -> Option<&'static Program> {
    PROGRAMS.iter().find(|p| p.name == name)
}

/// The programs offered to users (all but `misbehave`).
pub fn builtin() -> impl Iterator<Item = &'static Program> {
    PROGRAMS.iter().filter(|p| p.builtin)
}

#[cfg(test)]
mod guest_env;
