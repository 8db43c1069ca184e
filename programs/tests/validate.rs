//! Every embedded module satisfies the `bspweb_v1` contract.

use bspweb_programs::{PROGRAMS, builtin, get};

#[test]
fn every_module_passes_the_validator() {
    for p in PROGRAMS {
        let summary = bspweb_abi::validate(p.wasm)
            .unwrap_or_else(|e| panic!("{} is refused by the validator: {e}", p.name));
        let rewritten = bspweb_abi::canonicalize_nans(p.wasm)
            .unwrap_or_else(|e| panic!("{}: the NaN rewrite fails: {e}", p.name));
        bspweb_abi::validate(&rewritten)
            .unwrap_or_else(|e| panic!("{}: the NaN rewrite is refused: {e}", p.name));
        // The stack pointer is the one mutable global rustc emits; only
        // bspweb_v1 imports (the validator refuses everything else).
        assert_eq!(
            summary.mutable_globals,
            vec![0],
            "{}: the stack pointer should be the one mutable global",
            p.name
        );
        for import in &summary.imports {
            assert!(
                bspweb_abi::import(import).is_some(),
                "{}: imports {import}",
                p.name
            );
        }
        for needed in ["pid", "nprocs", "seed", "args_len", "args_read", "abort"] {
            assert!(
                summary.imports.iter().any(|i| i == needed),
                "{} does not import {needed}: {:?}",
                p.name,
                summary.imports
            );
        }
    }
}

#[test]
fn modules_are_reasonably_small() {
    for p in PROGRAMS {
        assert!(
            p.wasm.len() < 512 * 1024,
            "{} is {} bytes; was it built with debug info?",
            p.name,
            p.wasm.len()
        );
    }
}

#[test]
fn the_catalogue() {
    let names: Vec<&str> = PROGRAMS.iter().map(|p| p.name).collect();
    assert_eq!(
        names,
        [
            "ring",
            "mandelbrot",
            "inner-product",
            "sample-sort",
            "broadcast",
            "supersteps",
            "pagerank",
            "misbehave"
        ]
    );
    let builtin: Vec<&str> = builtin().map(|p| p.name).collect();
    assert_eq!(builtin.len(), 7);
    assert!(!builtin.contains(&"misbehave"));
    assert!(!get("misbehave").unwrap().builtin);
    assert_eq!(get("sample-sort").unwrap().name, "sample-sort");
    assert!(get("sample_sort").is_none());
    assert!(get("").is_none());
    assert!(PROGRAMS.iter().all(|p| !p.description.is_empty()));
    // Different programs, different modules.
    for (i, a) in PROGRAMS.iter().enumerate() {
        for b in &PROGRAMS[i + 1..] {
            assert_ne!(
                a.wasm, b.wasm,
                "{} and {} are the same module",
                a.name, b.name
            );
        }
    }
}

#[test]
fn the_sdk_agrees_with_the_abi() {
    use bspweb::__rt::abi as sdk;
    assert_eq!(sdk::HOST_MODULE, bspweb_abi::HOST_MODULE);
    assert_eq!(sdk::STATUS_SYNC, bspweb_abi::STATUS_SYNC);
    assert_eq!(sdk::STATUS_DONE, bspweb_abi::STATUS_DONE);
    assert_eq!(sdk::STATUS_YIELD, bspweb_abi::STATUS_YIELD);
    assert_eq!(sdk::STREAM_STDOUT, bspweb_abi::STREAM_STDOUT);
    assert_eq!(sdk::STREAM_STDERR, bspweb_abi::STREAM_STDERR);
    assert_eq!(sdk::ERR_BAD_PID, bspweb_abi::ERR_BAD_PID);
    assert_eq!(sdk::ERR_BAD_RANGE, bspweb_abi::ERR_BAD_RANGE);
    assert_eq!(sdk::ERR_TOO_LARGE, bspweb_abi::ERR_TOO_LARGE);
    assert_eq!(sdk::ERR_NOT_FOUND, bspweb_abi::ERR_NOT_FOUND);
    assert_eq!(sdk::MAX_MESSAGE_BYTES, bspweb_abi::MAX_MESSAGE_BYTES);
}
