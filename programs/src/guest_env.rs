//! Which environment variables of the outer build must not reach the nested
//! `cargo build` of the guest programs (shared by `build.rs` and the tests).
//!
//! Cargo gives a build script the outer build's settings: rustflags meant for
//! the host target, a wrapper such as clippy-driver, the outer target and
//! target directory, and the variables that describe the package being built
//! (`CARGO_MANIFEST_*`, `CARGO_PKG_*`, `OUT_DIR`, ...). Passed on, they would
//! break the wasm32 build or leak into the guest crates. Everything else
//! (`CARGO_HOME`, `RUSTC`, `CARGO_NET_OFFLINE`, the jobserver's
//! `CARGO_MAKEFLAGS`, rustup's variables, ...) is kept.

/// Variables removed by exact name.
const EXACT: &[&str] = &[
    "RUSTFLAGS",
    "CARGO_ENCODED_RUSTFLAGS",
    "CARGO_BUILD_RUSTFLAGS",
    "RUSTDOCFLAGS",
    "CARGO_ENCODED_RUSTDOCFLAGS",
    "CARGO_BUILD_RUSTDOCFLAGS",
    "RUSTC_WRAPPER",
    "RUSTC_WORKSPACE_WRAPPER",
    "CARGO_BUILD_RUSTC_WRAPPER",
    "CARGO_BUILD_RUSTC_WORKSPACE_WRAPPER",
    "CARGO_TARGET_DIR",
    "CARGO_BUILD_TARGET",
    "CARGO_BUILD_TARGET_DIR",
    "CARGO_BUILD_BUILD_DIR",
    "CARGO_PRIMARY_PACKAGE",
    "CARGO_CRATE_NAME",
    "CARGO_BIN_NAME",
    "CARGO_RUSTC_CURRENT_DIR",
    "OUT_DIR",
    "TARGET",
    "HOST",
    "PROFILE",
    "OPT_LEVEL",
    "DEBUG",
    "RUSTC_LINKER",
];

/// Variables removed by prefix.
const PREFIXES: &[&str] = &[
    "CARGO_MANIFEST_",
    "CARGO_PKG_",
    "CARGO_CFG_",
    "CARGO_FEATURE_",
    "DEP_",
    "__CARGO",
];

/// Whether the variable `name` must be removed from the nested build's
/// environment.
pub fn must_remove(name: &str) -> bool {
    EXACT.contains(&name) || PREFIXES.iter().any(|p| name.starts_with(p))
}

#[cfg(test)]
mod tests {
    use super::must_remove;

    #[test]
    fn outer_build_settings_are_removed() {
        for name in [
            "RUSTFLAGS",
            "CARGO_ENCODED_RUSTFLAGS",
            "RUSTC_WORKSPACE_WRAPPER",
            "RUSTC_WRAPPER",
            "CARGO_TARGET_DIR",
            "CARGO_BUILD_TARGET",
            "__CARGO_FIX_PLZ",
            "__CARGO_DEFAULT_LIB_METADATA",
            "CARGO_PRIMARY_PACKAGE",
            "CARGO_MANIFEST_DIR",
            "CARGO_MANIFEST_PATH",
            "CARGO_MANIFEST_LINKS",
            "CARGO_PKG_NAME",
            "CARGO_CFG_TARGET_ARCH",
            "CARGO_FEATURE_STD",
            "OUT_DIR",
            "TARGET",
            "PROFILE",
            "DEP_SQLITE3_INCLUDE",
        ] {
            assert!(must_remove(name), "{name} must not reach the guest build");
        }
    }

    #[test]
    fn the_toolchain_and_the_users_cargo_settings_are_kept() {
        for name in [
            "CARGO",
            "CARGO_HOME",
            "CARGO_MAKEFLAGS",
            "CARGO_NET_OFFLINE",
            "CARGO_TARGET_WASM32_UNKNOWN_UNKNOWN_LINKER",
            "RUSTC",
            "RUSTUP_TOOLCHAIN",
            "RUSTUP_HOME",
            "PATH",
            "HOME",
        ] {
            assert!(!must_remove(name), "{name} should be kept");
        }
    }
}
