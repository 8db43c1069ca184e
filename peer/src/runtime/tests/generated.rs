//! The validator accepts exactly what a checkpoint captures (issue 20,
//! finding 6), shown on generated modules: every module either is refused,
//! or runs to the same output when it is checkpointed and restored into a
//! fresh instance after any superstep.
//!
//! The generator mixes every kind of state an instance can hold besides
//! linear memory: mutable and immutable globals of each value type
//! (exported or not, named `__stack_pointer` or not), tables written by each
//! table instruction, segments dropped, memory grown, and SIMD arithmetic. A
//! model of the validator says which modules must be refused; the other
//! tests show the property would catch state a checkpoint missed.

use proptest::prelude::*;
use proptest::strategy::Strategy;

use super::*;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum GTy {
    I32,
    I64,
    F32,
    F64,
    V128,
}

#[derive(Debug, Clone)]
struct GGlobal {
    ty: GTy,
    mutable: bool,
    exported: bool,
    stack_pointer_name: bool,
}

/// Something a step does besides updating globals.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Extra {
    TableSet,
    TableGrow,
    TableFill,
    TableCopy,
    TableInit,
    ElemDrop,
    DataDrop,
    GrowMemory,
    Simd,
}

impl Extra {
    /// Whether the validator must refuse a module that does this.
    fn refused(self) -> bool {
        !matches!(self, Extra::GrowMemory | Extra::Simd)
    }
}

#[derive(Debug, Clone)]
struct Spec {
    globals: Vec<GGlobal>,
    extras: Vec<Extra>,
    steps: u32,
}

impl Spec {
    /// The model of the validator: what it must refuse.
    fn refused(&self) -> bool {
        self.globals.iter().any(|g| g.mutable && g.ty == GTy::V128)
            || self.extras.iter().any(|e| e.refused())
    }

    fn wat(&self) -> String {
        let mut globals = String::new();
        let mut update = String::new();
        let mut digest = String::new();
        let mut used_sp = false;
        for (i, g) in self.globals.iter().enumerate() {
            let name = if g.stack_pointer_name && !used_sp {
                used_sp = true;
                "__stack_pointer".to_string()
            } else {
                format!("g{i}")
            };
            let export = if g.exported {
                format!(r#"(export "{name}")"#)
            } else {
                String::new()
            };
            let k = i + 3;
            let (ty, init) = match g.ty {
                GTy::I32 => ("i32", format!("(i32.const {k})")),
                GTy::I64 => ("i64", format!("(i64.const {k})")),
                GTy::F32 => ("f32", format!("(f32.const {k}.25)")),
                GTy::F64 => ("f64", format!("(f64.const {k}.5)")),
                GTy::V128 => ("v128", format!("(v128.const i32x4 {k} 1 2 3)")),
            };
            let ty = if g.mutable {
                format!("(mut {ty})")
            } else {
                ty.to_string()
            };
            globals.push_str(&format!("(global ${name} {export} {ty} {init})\n"));
            if g.mutable {
                update.push_str(&match g.ty {
                    GTy::I32 => format!(
                        "(global.set ${name} (i32.add (i32.mul (global.get ${name}) (i32.const 31)) (i32.add (local.get $s) (i32.const {k}))))\n"
                    ),
                    GTy::I64 => format!(
                        "(global.set ${name} (i64.add (i64.mul (global.get ${name}) (i64.const 1000003)) (i64.extend_i32_u (local.get $s))))\n"
                    ),
                    GTy::F32 => format!(
                        "(global.set ${name} (f32.add (f32.mul (global.get ${name}) (f32.const 1.5)) (f32.convert_i32_u (local.get $s))))\n"
                    ),
                    GTy::F64 => format!(
                        "(global.set ${name} (f64.add (f64.mul (global.get ${name}) (f64.const -2.25)) (f64.convert_i32_u (local.get $s))))\n"
                    ),
                    GTy::V128 => format!(
                        "(global.set ${name} (i32x4.add (global.get ${name}) (i32x4.splat (local.get $s))))\n"
                    ),
                });
            }
            let at = 16 * i;
            digest.push_str(&match g.ty {
                GTy::I32 => format!("(i32.store (i32.const {at}) (global.get ${name}))\n"),
                GTy::I64 => format!("(i64.store (i32.const {at}) (global.get ${name}))\n"),
                GTy::F32 => format!("(f32.store (i32.const {at}) (global.get ${name}))\n"),
                GTy::F64 => format!("(f64.store (i32.const {at}) (global.get ${name}))\n"),
                GTy::V128 => format!("(v128.store (i32.const {at}) (global.get ${name}))\n"),
            });
        }
        let mut extras = String::new();
        for e in &self.extras {
            extras.push_str(match e {
                Extra::TableSet => "(table.set $t (i32.const 0) (table.get $t (i32.const 1)))",
                Extra::TableGrow => "(drop (table.grow $t (ref.null func) (i32.const 1)))",
                Extra::TableFill => {
                    "(table.fill $t (i32.const 0) (table.get $t (i32.const 1)) (i32.const 1))"
                }
                Extra::TableCopy => {
                    "(table.copy $t $t (i32.const 0) (i32.const 1) (i32.const 1))"
                }
                Extra::TableInit => "(table.init $t $e (i32.const 0) (i32.const 1) (i32.const 1))",
                Extra::ElemDrop => "(elem.drop $e)",
                Extra::DataDrop => "(data.drop $d)",
                Extra::GrowMemory => "(drop (memory.grow (i32.const 1)))",
                Extra::Simd => {
                    "(v128.store (i32.const 1024) (f32x4.add (f32x4.div (v128.load (i32.const 1024)) (f32x4.splat (f32.const 0))) (f32x4.splat (f32.convert_i32_u (local.get $s)))))"
                }
            });
            extras.push('\n');
        }
        let n = self.globals.len();
        let tail = 16 * n;
        let len = tail + 20;
        let last = self.steps - 1;
        format!(
            r#"(module
              (import "bspweb_v1" "superstep" (func $superstep (result i32)))
              (import "bspweb_v1" "write_raw" (func $write_raw (param i32 i32) (result i32)))
              (memory (export "memory") 1)
              (table $t 2 funcref)
              (elem (i32.const 0) func $ten $twenty)
              (elem $e func $ten $twenty)
              (data $d "\01\02\03")
              (type $get (func (result i32)))
              (func $ten (result i32) (i32.const 10))
              (func $twenty (result i32) (i32.const 20))
              {globals}
              (func (export "bspweb_resume") (result i32)
                (local $s i32)
                (local.set $s (call $superstep))
                {update}
                ;; Reads that see the instance's other state: a passive
                ;; segment (before a drop), the tables, memory (below).
                (memory.init $d (i32.const 2048) (i32.const 0) (i32.const 3))
                ;; A step changes that state in every odd superstep.
                (if (i32.and (local.get $s) (i32.const 1)) (then {extras}))
                (i32.store (i32.const 2000) (i32.add (i32.load (i32.const 2000)) (i32.const 1)))
                {digest}
                (i32.store (i32.const {tail}) (call_indirect (type $get) (i32.const 0)))
                (i32.store (i32.const {t4}) (table.size $t))
                (i32.store (i32.const {t8}) (memory.size))
                (i32.store (i32.const {t12}) (i32.add (i32.load (i32.const 2048)) (i32.load (i32.const 2000))))
                (i32.store (i32.const {t16}) (i32.load (i32.const 1024)))
                (drop (call $write_raw (i32.const 0) (i32.const {len})))
                (select (i32.const 1) (i32.const 0) (i32.ge_u (local.get $s) (i32.const {last}))))
            )"#,
            t4 = tail + 4,
            t8 = tail + 8,
            t12 = tail + 12,
            t16 = tail + 16,
        )
    }
}

fn spec() -> impl Strategy<Value = Spec> {
    let ty = prop_oneof![
        Just(GTy::I32),
        Just(GTy::I64),
        Just(GTy::F32),
        Just(GTy::F64),
        Just(GTy::V128)
    ];
    let global = (
        ty,
        any::<bool>(),
        any::<bool>(),
        proptest::bool::weighted(0.2),
    )
        .prop_map(|(ty, mutable, exported, stack_pointer_name)| GGlobal {
            ty,
            mutable,
            exported,
            stack_pointer_name,
        });
    let extra = prop_oneof![
        Just(Extra::TableSet),
        Just(Extra::TableGrow),
        Just(Extra::TableFill),
        Just(Extra::TableCopy),
        Just(Extra::TableInit),
        Just(Extra::ElemDrop),
        Just(Extra::DataDrop),
        Just(Extra::GrowMemory),
        Just(Extra::Simd),
    ];
    (
        proptest::collection::vec(global, 0..5),
        // Mostly modules that are accepted: refused extras are rarer.
        proptest::collection::vec(extra, 0..3).prop_map(|mut v| {
            let alone = v.len() == 1;
            v.retain(|e| !e.refused() || alone);
            v
        }),
        3u32..6,
    )
        .prop_map(|(globals, extras, steps)| Spec {
            globals,
            extras,
            steps,
        })
}

/// Run `module` to its end, checkpointing and restoring into a fresh
/// instance after superstep `restore_after`: one line per step's output,
/// and how it ended.
fn run(module: &Module, restore_after: Option<u32>) -> Vec<String> {
    let rt = runtime();
    let job = job_for(1, "{}", 16);
    let mut tracker = PageTracker::new();
    let mut p = rt.instantiate(module, job.clone(), 0).expect("starts");
    let mut out = Vec::new();
    for step in 0..16 {
        if step > 0 {
            p.begin_superstep(step, vec![]);
        }
        let outcome = p.resume();
        for (_, data) in raw_outputs(&job.reporter.drain()) {
            out.push(hex::encode(data));
        }
        match outcome {
            Outcome::Sync => {}
            Outcome::Done => {
                out.push("done".into());
                return out;
            }
            other => {
                out.push(format!("ended: {}", matches!(other, Outcome::Failed(_))));
                return out;
            }
        }
        if restore_after == Some(step) {
            let snap = p.checkpoint(&mut tracker, vec![], false);
            p = rt.restore(module, job.clone(), &snap).expect("restores");
        }
    }
    out.push("did not end".into());
    out
}

/// Whether restoring after some superstep changes the output.
fn diverges(module: &Module, steps: u32) -> bool {
    let plain = run(module, None);
    (0..steps).any(|k| run(module, Some(k)) != plain)
}

/// `wasm` compiled without the validator, exporting its mutable globals for
/// checkpoints only when `export_globals` (what the peer did before).
fn compile_unchecked(wasm: &[u8], export_globals: bool) -> Module {
    let rt = runtime();
    let bytes = if export_globals {
        let mut globals = Vec::new();
        let mut index = 0;
        for payload in wasmparser::Parser::new(0).parse_all(wasm) {
            if let wasmparser::Payload::GlobalSection(r) = payload.unwrap() {
                for g in r {
                    if g.unwrap().ty.mutable {
                        globals.push(index);
                    }
                    index += 1;
                }
            }
        }
        let summary = bspweb_abi::ModuleSummary {
            imports: vec![],
            initial_pages: 1,
            mutable_globals: globals,
        };
        bspweb_abi::checkpointable(wasm, &summary).unwrap()
    } else {
        wasm.to_vec()
    };
    Module::new(&rt.engine, &bytes).expect("compiles")
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn generated_modules_are_refused_or_restore_to_identical_output(spec in spec()) {
        let wasm = wat::parse_str(spec.wat()).expect("generated module parses");
        let rt = runtime();
        match rt.compile(&module_hash(&wasm), &wasm) {
            Err(CompileError::Invalid(e)) => {
                prop_assert!(spec.refused(), "refused, though checkpoints capture it: {e}\n{}", spec.wat());
            }
            Err(e) => panic!("{e}"),
            Ok(module) => {
                prop_assert!(!spec.refused(), "accepted:\n{}", spec.wat());
                let plain = run(&module, None);
                prop_assert_eq!(plain.last().map(String::as_str), Some("done"));
                for k in 0..spec.steps {
                    prop_assert_eq!(&run(&module, Some(k)), &plain, "restored after superstep {}", k);
                }
            }
        }
    }
}

#[test]
fn the_property_catches_state_a_checkpoint_misses() {
    // Finding 6: a lone unexported mutable i64 that is not the stack
    // pointer. Accepted now, and identical after a restore...
    let hidden = Spec {
        globals: vec![GGlobal {
            ty: GTy::I64,
            mutable: true,
            exported: false,
            stack_pointer_name: false,
        }],
        extras: vec![],
        steps: 4,
    };
    let wasm = wat::parse_str(hidden.wat()).unwrap();
    let module = runtime().compile(&module_hash(&wasm), &wasm).unwrap();
    assert!(!diverges(&module, hidden.steps));
    // ... but not without the exports a checkpoint reads (the old peer).
    assert!(diverges(&compile_unchecked(&wasm, false), hidden.steps));

    // What the validator refuses would diverge if it ran.
    for extra in [
        Extra::TableSet,
        Extra::TableGrow,
        Extra::TableFill,
        Extra::TableCopy,
        Extra::TableInit,
        Extra::DataDrop,
    ] {
        let spec = Spec {
            globals: vec![],
            extras: vec![extra],
            steps: 4,
        };
        assert!(spec.refused());
        let wasm = wat::parse_str(spec.wat()).unwrap();
        assert!(
            diverges(&compile_unchecked(&wasm, true), spec.steps),
            "{extra:?}"
        );
    }
}
