//! Seeded random floating-point programs run before and after
//! [`bspweb_abi::canonicalize_nans`], on an engine that does not canonicalize
//! NaNs itself (the peer's), checking the two properties the rewrite exists
//! for:
//!
//! - **Determinism.** Whatever bits the machine gives the NaNs that arithmetic
//!   produces ([`bspweb_abi::perturb_nans`] plays other machines), a
//!   rewritten program writes the same bytes. Without the rewrite it does not.
//! - **Exactness.** Bits the specification fixes are never changed: a program
//!   without arithmetic is left byte for byte as it was, and the NaN payloads
//!   it moves around (loads, stores, locals, parameters, globals, `select`,
//!   blocks, `neg`, `abs`, `copysign`) arrive intact.

use proptest::prelude::*;
use wasmtime::{Config, Engine, Instance, Module, Store};

use bspweb_abi::{canonicalize_nans, perturb_nans};

/// Inputs at address 0: ordinary numbers, zeros, infinities, a subnormal,
/// and NaNs of several signs and payloads (R's `NA` among them).
const INPUTS: [u64; 16] = [
    0x3ff8_0000_0000_0000, // 1.5
    0xc002_0000_0000_0000, // -2.25
    0x0000_0000_0000_0000, // 0
    0x8000_0000_0000_0000, // -0
    0x7ff0_0000_0000_0000, // inf
    0xfff0_0000_0000_0000, // -inf
    0x7fe1_ccf3_85eb_c8a0, // 1e308
    0x0000_0000_0000_0001, // the least subnormal
    0x7ff8_0000_0000_0000, // the canonical NaN
    0xfff8_0000_0000_0000, // x86's default NaN
    0x7ff4_0000_0000_0001, // a signalling NaN
    0x7ff8_0000_0000_07a2, // R's NA
    0xfffc_0000_0000_beef,
    0x4008_0000_0000_0000, // 3
    0x81a0_0000_0000_0000,
    0x4045_0000_0000_0000, // 42
];

/// Where results go, and how many 8-byte slots there are.
const OUT: usize = 1024;
const SLOTS: usize = 48;
const LOCALS: usize = 4;

/// A small generator of random wasm text (SplitMix64).
struct Gen {
    state: u64,
    /// Whether arithmetic may appear.
    arith: bool,
}

impl Gen {
    fn next(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    /// An f64 expression.
    fn expr(&mut self, depth: u32) -> String {
        let leaves = 4;
        let kinds = if depth == 0 { leaves } else { 18 };
        match self.below(kinds) {
            0 => format!("(f64.load (i32.const {}))", 8 * self.below(16)),
            1 => format!(
                "(f64.const {})",
                ["0", "-1.5", "nan", "-nan:0x4", "nan:0x7a2", "inf", "7"][self.below(7) as usize]
            ),
            2 => format!("(local.get {})", self.below(LOCALS as u64)),
            3 => "(global.get $g)".to_string(),
            4 if self.arith => {
                let op = ["add", "sub", "mul", "div", "min", "max"][self.below(6) as usize];
                format!(
                    "(f64.{op} {} {})",
                    self.expr(depth - 1),
                    self.expr(depth - 1)
                )
            }
            5 if self.arith => {
                let op = ["sqrt", "ceil", "floor", "trunc", "nearest"][self.below(5) as usize];
                format!("(f64.{op} {})", self.expr(depth - 1))
            }
            6 if self.arith => format!(
                "(f64.promote_f32 (f32.{} (f32.demote_f64 {}) (f32.demote_f64 {})))",
                ["add", "mul", "div", "min"][self.below(4) as usize],
                self.expr(depth - 1),
                self.expr(depth - 1)
            ),
            7 if self.arith => format!(
                "(f64x2.extract_lane {} (f64x2.{} (f64x2.splat {}) (f64x2.splat {})))",
                self.below(2),
                ["add", "sub", "mul", "div", "max"][self.below(5) as usize],
                self.expr(depth - 1),
                self.expr(depth - 1)
            ),
            8 => {
                let op = ["neg", "abs"][self.below(2) as usize];
                format!("(f64.{op} {})", self.expr(depth - 1))
            }
            9 => format!(
                "(f64.copysign {} {})",
                self.expr(depth - 1),
                self.expr(depth - 1)
            ),
            10 => format!(
                "(select {} {} {})",
                self.expr(depth - 1),
                self.expr(depth - 1),
                self.cond(depth - 1)
            ),
            11 => format!("(call $pass {})", self.expr(depth - 1)),
            12 => format!(
                "(block (result f64) {} {} (br_if 0) (drop) {})",
                self.expr(depth - 1),
                self.cond(depth - 1),
                self.expr(depth - 1)
            ),
            13 => format!(
                "(f64.reinterpret_i64 (i64.reinterpret_f64 {}))",
                self.expr(depth - 1)
            ),
            14 => format!(
                "(local.tee {} {})",
                self.below(LOCALS as u64),
                self.expr(depth - 1)
            ),
            15 => format!(
                "(if (result f64) {} (then {}) (else {}))",
                self.cond(depth - 1),
                self.expr(depth - 1),
                self.expr(depth - 1)
            ),
            16 => format!(
                "(block (result f64) {} (i32.const {}) (br_table 0 0))",
                self.expr(depth - 1),
                self.below(3)
            ),
            17 => format!(
                "(f64.{} (block (result f64 f64) {} {}))",
                if self.arith {
                    ["add", "copysign", "min"][self.below(3) as usize]
                } else {
                    "copysign"
                },
                self.expr(depth - 1),
                self.expr(depth - 1)
            ),
            _ => self.expr(0),
        }
    }

    /// An i32 condition.
    fn cond(&mut self, depth: u32) -> String {
        match self.below(3) {
            0 => format!(
                "(f64.{} {} {})",
                ["lt", "eq", "ne", "ge"][self.below(4) as usize],
                self.expr(depth),
                self.expr(depth)
            ),
            1 => format!("(i32.const {})", self.below(2)),
            _ => format!("(i32.trunc_sat_f64_s {})", self.expr(depth)),
        }
    }

    /// A statement.
    fn stmt(&mut self, depth: u32) -> String {
        let e = self.expr(3);
        match self.below(if depth == 0 { 5 } else { 7 }) {
            0 | 1 => format!(
                "(f64.store (i32.const {}) {e})",
                OUT + 8 * self.below(32) as usize
            ),
            2 => format!("(local.set {} {e})", self.below(LOCALS as u64)),
            3 => format!("(global.set $g {e})"),
            4 if self.arith => format!(
                "(f32.store (i32.const {}) (f32.demote_f64 {e}))",
                OUT + 8 * self.below(32) as usize + 4
            ),
            5 => {
                let body: Vec<String> = (0..1 + self.below(3))
                    .map(|_| self.stmt(depth - 1))
                    .collect();
                format!(
                    "(local.set $i{depth} (i32.const 3)) (loop $l {} (br_if $l (local.tee $i{depth} (i32.sub (local.get $i{depth}) (i32.const 1)))))",
                    body.join(" ")
                )
            }
            6 => {
                let c = self.cond(2);
                let a = self.stmt(depth - 1);
                let b = self.stmt(depth - 1);
                format!("(if {c} (then {a}) (else {b}))")
            }
            _ => format!("(local.set {} {e})", self.below(LOCALS as u64)),
        }
    }

    /// A whole module whose `run` writes its results at [`OUT`].
    fn module(&mut self) -> String {
        let data: String = INPUTS
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .map(|b| format!("\\{b:02x}"))
            .collect();
        let body: Vec<String> = (0..2 + self.below(8)).map(|_| self.stmt(2)).collect();
        let epilogue: String = (0..LOCALS)
            .map(|l| {
                format!(
                    "(f64.store (i32.const {}) (local.get {l}))",
                    OUT + 8 * (32 + l)
                )
            })
            .chain([format!(
                "(f64.store (i32.const {}) (global.get $g))",
                OUT + 8 * 40
            )])
            .collect();
        format!(
            r#"(module
                 (memory (export "memory") 1)
                 (global $g (mut f64) (f64.const 0))
                 (data (i32.const 0) "{data}")
                 (func $pass (param f64) (result f64) (local.get 0))
                 (func (export "run") (local f64 f64 f64 f64) (local $i1 i32) (local $i2 i32)
                   {} {epilogue}))"#,
            body.join("\n")
        )
    }
}

fn engine() -> Engine {
    let mut config = Config::new();
    config.cranelift_nan_canonicalization(false).wasm_simd(true);
    Engine::new(&config).expect("engine")
}

/// Run `bytes` and return its result slots.
fn run(engine: &Engine, bytes: &[u8]) -> Vec<u8> {
    let module = Module::new(engine, bytes).expect("the module compiles");
    let mut store = Store::new(engine, ());
    let instance = Instance::new(&mut store, &module, &[]).expect("instantiate");
    let run = instance
        .get_typed_func::<(), ()>(&mut store, "run")
        .expect("run");
    run.call(&mut store, ()).expect("run returns");
    let memory = instance.get_memory(&mut store, "memory").expect("memory");
    memory.data(&store)[OUT..OUT + 8 * SLOTS].to_vec()
}

fn random_module(seed: u64, arith: bool) -> Vec<u8> {
    let text = Gen { state: seed, arith }.module();
    wat::parse_str(&text).unwrap_or_else(|e| panic!("generated wat: {e}\n{text}"))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn rewritten_programs_write_the_same_bytes_whatever_nans_the_machine_makes(seed in any::<u64>()) {
        let engine = engine();
        let original = random_module(seed, true);
        let rewritten = canonicalize_nans(&original).expect("rewrite");
        let reference = run(&engine, &rewritten);
        for machine in 1..=3u64 {
            let other = perturb_nans(&rewritten, seed ^ machine).expect("perturb");
            prop_assert_eq!(&run(&engine, &other), &reference, "machine {}", machine);
        }
    }

    #[test]
    fn programs_without_arithmetic_are_left_as_they_are(seed in any::<u64>()) {
        let original = random_module(seed, false);
        prop_assert_eq!(canonicalize_nans(&original).expect("rewrite"), original);
    }
}

/// The perturbation is strong enough to matter: without the rewrite, random
/// programs' results depend on the machine's NaNs.
#[test]
fn without_the_rewrite_results_depend_on_the_machines_nans() {
    let engine = engine();
    let differing = (0..64u64)
        .filter(|&seed| {
            let original = random_module(seed, true);
            let a = perturb_nans(&original, 1).expect("perturb");
            let b = perturb_nans(&original, 2).expect("perturb");
            run(&engine, &a) != run(&engine, &b)
        })
        .count();
    assert!(differing >= 16, "only {differing} of 64 programs differ");
}

/// Arithmetic NaNs become the canonical one where they are observed; NaN
/// payloads that arrive by load, parameter, local, global, `select` or block
/// keep every bit, with `neg` and `abs` acting on the sign alone.
#[test]
fn observed_nans_are_canonical_and_moved_nans_are_exact() {
    let text = format!(
        r#"(module
             (memory (export "memory") 1)
             (global $g (mut f64) (f64.const 0))
             (data (i32.const 0) "\a2\07\00\00\00\00\f8\7f")
             (func $pass (param f64) (result f64) (local.get 0))
             (func (export "run") (local $na f64) (local $sum f64)
               (local.set $na (f64.load (i32.const 0)))
               (global.set $g (call $pass (local.get $na)))
               (f64.store (i32.const {o0}) (select (global.get $g) (f64.const 1) (i32.const 1)))
               (f64.store (i32.const {o1}) (f64.neg (block (result f64) (local.get $na))))
               (local.set $sum (f64.div (f64.const 0) (f64.const 0)))
               (f64.store (i32.const {o2}) (f64.neg (local.get $sum)))
               (f64.store (i32.const {o3}) (f64.copysign (f64.const 2) (local.get $sum)))
               (i64.store (i32.const {o4}) (i64.reinterpret_f64 (f64.sqrt (f64.const -1))))
               (f64.store (i32.const {o5}) (call $pass (f64.add (local.get $na) (f64.const 1))))))"#,
        o0 = OUT,
        o1 = OUT + 8,
        o2 = OUT + 16,
        o3 = OUT + 24,
        o4 = OUT + 32,
        o5 = OUT + 40,
    );
    let original = wat::parse_str(&text).expect("wat");
    let rewritten = canonicalize_nans(&original).expect("rewrite");
    let engine = engine();
    for seed in [None, Some(7), Some(8)] {
        let bytes = match seed {
            Some(s) => perturb_nans(&rewritten, s).expect("perturb"),
            None => rewritten.clone(),
        };
        let out = run(&engine, &bytes);
        let slot = |i: usize| u64::from_le_bytes(out[8 * i..8 * i + 8].try_into().unwrap());
        assert_eq!(
            slot(0),
            0x7ff8_0000_0000_07a2,
            "NA through a call, a global and select"
        );
        assert_eq!(slot(1), 0xfff8_0000_0000_07a2, "neg of NA through a block");
        assert_eq!(
            slot(2),
            0x7ff8_0000_0000_0000,
            "0/0 through a local, negated, stored"
        );
        assert_eq!(
            slot(3),
            0x4000_0000_0000_0000,
            "copysign takes a canonical sign"
        );
        assert_eq!(slot(4), 0x7ff8_0000_0000_0000, "sqrt(-1) reinterpreted");
        assert_eq!(slot(5), 0x7ff8_0000_0000_0000, "NA + 1 passed to a call");
    }
}
