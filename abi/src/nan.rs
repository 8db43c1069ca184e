//! Deterministic NaNs at the price of a few instructions, not one per
//! floating-point operation.
//!
//! WebAssembly leaves one thing to the machine: the sign and payload of a NaN
//! that an arithmetic instruction (`f64.add`, `f32.sqrt`, `f64.promote_f32`,
//! `f32x4.mul`, …) produces. x86 and ARM pick different bits, so a guest
//! that stores such a NaN would write different bytes on different peers, and
//! a checkpoint taken on one could not be compared with, or continued on,
//! another. Wasmtime's remedy, `cranelift_nan_canonicalization`, replaces the
//! result of *every* arithmetic instruction by the canonical NaN when it is a
//! NaN: a compare and a blend on every floating-point dependency chain, which
//! made a floating-point inner product five times slower than native code.
//!
//! [`canonicalize_nans`] gets the same determinism by rewriting the module
//! instead, and canonicalizes only where a NaN's bits can be *observed*. A
//! value that an arithmetic instruction produced (an "arithmetic value" below,
//! also after `neg`, `abs`, `copysign` or `select`, which pass a NaN on) has
//! bits that do not matter as long as it only reaches:
//!
//! - another arithmetic instruction (a NaN operand gives a NaN result, which is
//!   again an arithmetic value), a comparison (no comparison looks at a NaN's
//!   bits) or a truncation to an integer (a NaN traps, or gives 0 saturated);
//! - `drop`;
//! - a local that holds nothing but arithmetic values and non-NaN constants
//!   (found by a fixed point per function: a local that ever receives anything
//!   else, or is a parameter, holds exact bits).
//!
//! Every other use observes bits, and there the rewrite canonicalizes:
//! immediately before the use when the value is on top of the stack (`store`,
//! `reinterpret`, the sign operand of `copysign`, `global.set`, `splat`,
//! `replace_lane`, `local.set`/`local.tee` of a local that holds exact bits),
//! and otherwise right after the instruction that produced it (call
//! arguments, `return`, branch and block values, `select` with an exact
//! operand, and anything not listed). SIMD arithmetic is canonicalized right
//! after every instruction, lane by lane, as Wasmtime would. Host functions
//! take no floating-point arguments ([`crate::Ty`]), so nothing escapes there.
//!
//! Values with exact bits, NaN or not (loaded from memory, constants,
//! parameters, call results, `reinterpret` of an integer), are never
//! touched: a NaN-boxing interpreter or R's `NA` keep their payloads, as the
//! WebAssembly specification requires for loads, stores and moves.
//!
//! The canonical NaNs are the specification's positive ones
//! (`0x7fc0_0000`, `0x7ff8_0000_0000_0000`). The sequence inserted for a value
//! of type `t` on top of the stack, with a scratch local `$s` of type `t`
//! added to the function, is
//! `local.set $s  t.const nan  local.get $s  local.get $s  local.get $s  t.ne  select`
//! (for vectors `v128.const`, the lane-wise `ne` and `v128.bitselect`).
//!
//! The peer compiles every guest after this rewrite, with Cranelift's own
//! canonicalization off. [`perturb_nans`] is the test double of an adversarial
//! machine: it replaces every arithmetic NaN with a NaN of seeded, arbitrary
//! bits, so a test can check that a rewritten module's results do not depend
//! on them.

use wasmparser::{
    FuncValidator, FunctionBody, Operator, Parser, Payload, ValType, ValidPayload, Validator,
    ValidatorResources, WasmModuleResources,
};

use crate::{InvalidModule, SectionEdit, features, read_leb_u32, rewrite_sections, write_leb};

/// Section ids in the binary format.
const CUSTOM_SECTION: u8 = 0;
const CODE_SECTION: u8 = 10;

/// WebAssembly's limit on the locals of one function, which the scratch
/// locals must respect.
const MAX_LOCALS: u64 = 50_000;

/// Rounds of the per-function fixed point before every remaining candidate
/// local is treated as holding exact bits (always correct, only slower).
const MAX_ROUNDS: usize = 16;

/// Rewrite a module so that every NaN an arithmetic instruction produces is
/// canonical wherever its bits can be observed (see the module docs). The
/// module must be valid under [`features`]; the result is too.
pub fn canonicalize_nans(bytes: &[u8]) -> Result<Vec<u8>, InvalidModule> {
    rewrite(bytes, plan_canonical)
}

/// For tests: replace the result of every arithmetic instruction that is a
/// NaN (every NaN lane of a SIMD one) with a quiet NaN of arbitrary sign and
/// payload, chosen per instruction from `seed`. Apply it to a module after
/// [`canonicalize_nans`] to play a machine whose NaNs differ from this one's.
#[doc(hidden)]
pub fn perturb_nans(bytes: &[u8], seed: u64) -> Result<Vec<u8>, InvalidModule> {
    let mut rng = SplitMix(seed);
    rewrite(bytes, |ops, _| {
        let mut plan = Plan::new(ops.len());
        for (i, op) in ops.iter().enumerate() {
            let shape = match classify(&op.op) {
                Kind::Arith(shape, _) | Kind::SimdArith(shape) => shape,
                _ => continue,
            };
            plan.after[i] = Some(Insert {
                shape,
                nan: shape.random_nan(&mut rng),
            });
        }
        plan
    })
}

/// The type of a value that may be canonicalized.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Shape {
    F32,
    F64,
    F32x4,
    F64x2,
}

impl Shape {
    fn of_scalar(ty: ValType) -> Option<Shape> {
        match ty {
            ValType::F32 => Some(Shape::F32),
            ValType::F64 => Some(Shape::F64),
            _ => None,
        }
    }

    /// The scratch local's type.
    fn val_type(self) -> ValType {
        match self {
            Shape::F32 => ValType::F32,
            Shape::F64 => ValType::F64,
            Shape::F32x4 | Shape::F64x2 => ValType::V128,
        }
    }

    /// The canonical NaN in every lane, as the little-endian bits of the
    /// constant.
    fn canonical(self) -> u128 {
        match self {
            Shape::F32 => 0x7fc0_0000,
            Shape::F64 => 0x7ff8_0000_0000_0000,
            Shape::F32x4 => 0x7fc0_0000_u128 * 0x0000_0001_0000_0001_0000_0001_0000_0001,
            Shape::F64x2 => 0x7ff8_0000_0000_0000_u128 * 0x0000_0000_0000_0001_0000_0000_0000_0001,
        }
    }

    /// A quiet NaN (every lane) of random sign and payload.
    fn random_nan(self, rng: &mut SplitMix) -> u128 {
        let f32_nan = |r: u64| (r as u32 & 0x803f_ffff) | 0x7fc0_0000;
        let f64_nan = |r: u64| (r & 0x8007_ffff_ffff_ffff) | 0x7ff8_0000_0000_0000;
        match self {
            Shape::F32 => u128::from(f32_nan(rng.next())),
            Shape::F64 => u128::from(f64_nan(rng.next())),
            Shape::F32x4 => (0..4).fold(0, |acc, lane| {
                acc | u128::from(f32_nan(rng.next())) << (32 * lane)
            }),
            Shape::F64x2 => u128::from(f64_nan(rng.next())) | u128::from(f64_nan(rng.next())) << 64,
        }
    }
}

/// SplitMix64: the seeded generator of [`perturb_nans`].
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

/// How an instruction treats the NaNs of its operands and result.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// Scalar arithmetic with this many operands: its result is an arithmetic
    /// value.
    Arith(Shape, u32),
    /// SIMD arithmetic: canonicalized right after.
    SimdArith(Shape),
    /// `neg`, `abs`: the result is of the operand's kind.
    Sign,
    /// `copysign`: the first operand's kind; the second's sign is observed.
    Copysign(Shape),
    /// Comparisons and truncations: NaN bits do not matter.
    Blind,
    /// Observes the bits of the scalar on top of the stack.
    Observes(Shape),
    /// A floating-point constant.
    Const(bool),
    /// Conversion from an integer: never a NaN.
    FromInt,
    LocalGet(u32),
    LocalSet(u32),
    LocalTee(u32),
    GlobalSet(u32),
    Drop,
    Select,
    /// Anything else: its operands' bits may be observed.
    Other,
}

fn classify(op: &Operator<'_>) -> Kind {
    use Operator as O;
    use Shape::*;
    match op {
        O::F32Add | O::F32Sub | O::F32Mul | O::F32Div | O::F32Min | O::F32Max => {
            Kind::Arith(F32, 2)
        }
        O::F64Add | O::F64Sub | O::F64Mul | O::F64Div | O::F64Min | O::F64Max => {
            Kind::Arith(F64, 2)
        }
        O::F32Sqrt | O::F32Ceil | O::F32Floor | O::F32Trunc | O::F32Nearest | O::F32DemoteF64 => {
            Kind::Arith(F32, 1)
        }
        O::F64Sqrt | O::F64Ceil | O::F64Floor | O::F64Trunc | O::F64Nearest | O::F64PromoteF32 => {
            Kind::Arith(F64, 1)
        }
        O::F32x4Add
        | O::F32x4Sub
        | O::F32x4Mul
        | O::F32x4Div
        | O::F32x4Min
        | O::F32x4Max
        | O::F32x4Sqrt
        | O::F32x4Ceil
        | O::F32x4Floor
        | O::F32x4Trunc
        | O::F32x4Nearest
        | O::F32x4DemoteF64x2Zero => Kind::SimdArith(F32x4),
        O::F64x2Add
        | O::F64x2Sub
        | O::F64x2Mul
        | O::F64x2Div
        | O::F64x2Min
        | O::F64x2Max
        | O::F64x2Sqrt
        | O::F64x2Ceil
        | O::F64x2Floor
        | O::F64x2Trunc
        | O::F64x2Nearest
        | O::F64x2PromoteLowF32x4 => Kind::SimdArith(F64x2),
        O::F32Neg | O::F32Abs | O::F64Neg | O::F64Abs => Kind::Sign,
        O::F32Copysign => Kind::Copysign(F32),
        O::F64Copysign => Kind::Copysign(F64),
        O::F32Eq
        | O::F32Ne
        | O::F32Lt
        | O::F32Gt
        | O::F32Le
        | O::F32Ge
        | O::F64Eq
        | O::F64Ne
        | O::F64Lt
        | O::F64Gt
        | O::F64Le
        | O::F64Ge
        | O::I32TruncF32S
        | O::I32TruncF32U
        | O::I32TruncF64S
        | O::I32TruncF64U
        | O::I64TruncF32S
        | O::I64TruncF32U
        | O::I64TruncF64S
        | O::I64TruncF64U
        | O::I32TruncSatF32S
        | O::I32TruncSatF32U
        | O::I32TruncSatF64S
        | O::I32TruncSatF64U
        | O::I64TruncSatF32S
        | O::I64TruncSatF32U
        | O::I64TruncSatF64S
        | O::I64TruncSatF64U => Kind::Blind,
        O::F32Store { .. } | O::I32ReinterpretF32 | O::F32x4Splat | O::F32x4ReplaceLane { .. } => {
            Kind::Observes(F32)
        }
        O::F64Store { .. } | O::I64ReinterpretF64 | O::F64x2Splat | O::F64x2ReplaceLane { .. } => {
            Kind::Observes(F64)
        }
        O::F32Const { value } => Kind::Const(f32::from_bits(value.bits()).is_nan()),
        O::F64Const { value } => Kind::Const(f64::from_bits(value.bits()).is_nan()),
        O::F32ConvertI32S
        | O::F32ConvertI32U
        | O::F32ConvertI64S
        | O::F32ConvertI64U
        | O::F64ConvertI32S
        | O::F64ConvertI32U
        | O::F64ConvertI64S
        | O::F64ConvertI64U => Kind::FromInt,
        O::LocalGet { local_index } => Kind::LocalGet(*local_index),
        O::LocalSet { local_index } => Kind::LocalSet(*local_index),
        O::LocalTee { local_index } => Kind::LocalTee(*local_index),
        O::GlobalSet { global_index } => Kind::GlobalSet(*global_index),
        O::Drop => Kind::Drop,
        O::Select | O::TypedSelect { .. } => Kind::Select,
        _ => Kind::Other,
    }
}

/// One instruction of a function body, with what the validator knew of it.
struct Op<'a> {
    op: Operator<'a>,
    /// Its bytes in the module.
    start: usize,
    end: usize,
    /// Operands it pops and results it pushes.
    pops: u32,
    pushes: u32,
    /// The operand stack's height below which it cannot pop (its frame's).
    floor: usize,
    /// The operand stack's height after it.
    height_after: usize,
    /// For `global.set`: the global's type.
    global: Option<ValType>,
}

/// A function's locals: the parameters' count and every local's type.
struct Locals {
    params: u32,
    types: Vec<ValType>,
}

/// A canonicalization (or, for tests, a perturbation) to insert.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Insert {
    shape: Shape,
    /// The NaN that replaces a NaN (every lane's bits).
    nan: u128,
}

/// What to insert around each instruction of a function.
struct Plan {
    before: Vec<Option<Insert>>,
    after: Vec<Option<Insert>>,
}

impl Plan {
    fn new(n: usize) -> Plan {
        Plan {
            before: vec![None; n],
            after: vec![None; n],
        }
    }

    fn canonical(shape: Shape) -> Option<Insert> {
        Some(Insert {
            shape,
            nan: shape.canonical(),
        })
    }
}

/// An operand on the simulated stack.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Val {
    /// Bits the specification determines (NaN or not): never touched.
    Exact,
    /// Not a NaN: canonicalizing would not change it.
    Clean,
    /// Maybe a NaN of undetermined bits, produced by instruction `at`.
    Arith { at: usize, shape: Shape },
}

/// What a local may hold, as far as NaNs go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Holds {
    /// Only non-NaN constants (and its initial zero).
    Clean,
    /// Also arithmetic values of this shape.
    Arith(Shape),
    /// Exact bits (a parameter, or a local that received some): arithmetic
    /// values are canonicalized before they go in.
    Exact,
}

/// Plan the canonicalizations of one function (module docs).
fn plan_canonical(ops: &[Op<'_>], locals: &Locals) -> Plan {
    // Every f32 and f64 local other than a parameter starts as `Clean`; a
    // round that finds one receiving more moves it up (`Clean` < `Arith` <
    // `Exact`) and starts again, so the last round's plan is consistent.
    let mut holds: Vec<Holds> = locals
        .types
        .iter()
        .enumerate()
        .map(|(i, &t)| match Shape::of_scalar(t) {
            Some(_) if i >= locals.params as usize => Holds::Clean,
            _ => Holds::Exact,
        })
        .collect();
    for round in 0.. {
        if round == MAX_ROUNDS {
            holds.iter_mut().for_each(|h| *h = Holds::Exact);
        }
        if let Some(plan) = simulate(ops, locals, &mut holds) {
            return plan;
        }
    }
    unreachable!("a round in which every local holds exact bits changes none")
}

/// One round of [`plan_canonical`]: the plan, or `None` after moving up a
/// local that receives more than it was assumed to hold.
fn simulate(ops: &[Op<'_>], locals: &Locals, holds: &mut [Holds]) -> Option<Plan> {
    let mut plan = Plan::new(ops.len());
    let mut stack: Vec<Val> = Vec::new();
    let mut changed = false;
    for (i, op) in ops.iter().enumerate() {
        let floor = op.floor.min(stack.len());
        // An operand below the frame is from unreachable code: any will do.
        let pop = |stack: &mut Vec<Val>| {
            if stack.len() > floor {
                stack.pop().unwrap_or(Val::Exact)
            } else {
                Val::Exact
            }
        };
        let eager = |v: Val, plan: &mut Plan| {
            if let Val::Arith { at, shape } = v {
                plan.after[at] = Plan::canonical(shape);
            }
        };
        let exact = |stack: &mut Vec<Val>| stack.extend((0..op.pushes).map(|_| Val::Exact));
        let local_shape = |l: u32| {
            locals
                .types
                .get(l as usize)
                .copied()
                .and_then(Shape::of_scalar)
        };
        match classify(&op.op) {
            Kind::Arith(shape, n) => {
                for _ in 0..n {
                    pop(&mut stack);
                }
                stack.push(Val::Arith { at: i, shape });
            }
            Kind::Sign => {
                let v = pop(&mut stack);
                stack.push(match v {
                    Val::Arith { shape, .. } => Val::Arith { at: i, shape },
                    other => other,
                });
            }
            Kind::Copysign(shape) => {
                if let Val::Arith { .. } = pop(&mut stack) {
                    plan.before[i] = Plan::canonical(shape);
                }
                let magnitude = pop(&mut stack);
                stack.push(match magnitude {
                    Val::Arith { .. } => Val::Arith { at: i, shape },
                    other => other,
                });
            }
            Kind::Observes(shape) => {
                if let Some(Val::Arith { .. }) = stack.last().filter(|_| stack.len() > floor) {
                    plan.before[i] = Plan::canonical(shape);
                }
                for _ in 0..op.pops {
                    pop(&mut stack);
                }
                exact(&mut stack);
            }
            Kind::GlobalSet(_) => {
                let v = pop(&mut stack);
                if let (Val::Arith { .. }, Some(shape)) = (v, op.global.and_then(Shape::of_scalar))
                {
                    plan.before[i] = Plan::canonical(shape);
                }
            }
            Kind::Blind | Kind::Drop => {
                for _ in 0..op.pops {
                    pop(&mut stack);
                }
                exact(&mut stack);
            }
            Kind::Const(nan) => stack.push(if nan { Val::Exact } else { Val::Clean }),
            Kind::FromInt => {
                pop(&mut stack);
                stack.push(Val::Clean);
            }
            Kind::LocalGet(l) => stack.push(match holds.get(l as usize) {
                Some(Holds::Clean) => Val::Clean,
                Some(&Holds::Arith(shape)) => Val::Arith { at: i, shape },
                _ => Val::Exact,
            }),
            kind @ (Kind::LocalSet(l) | Kind::LocalTee(l)) => {
                let v = pop(&mut stack);
                let slot = holds.get_mut(l as usize);
                let held = slot.as_deref().copied().unwrap_or(Holds::Exact);
                let wider = match (held, v) {
                    (Holds::Exact, _) => Holds::Exact,
                    (_, Val::Exact) => Holds::Exact,
                    (Holds::Clean, Val::Arith { shape, .. }) => Holds::Arith(shape),
                    (held, _) => held,
                };
                if wider != held {
                    if let Some(slot) = slot {
                        *slot = wider;
                    }
                    changed = true;
                }
                let result = match (held, v) {
                    (Holds::Exact, Val::Arith { .. }) => {
                        if let Some(shape) = local_shape(l) {
                            plan.before[i] = Plan::canonical(shape);
                        }
                        Val::Exact
                    }
                    (_, Val::Arith { shape, .. }) => Val::Arith { at: i, shape },
                    (_, other) => other,
                };
                if matches!(kind, Kind::LocalTee(_)) {
                    stack.push(result);
                }
            }
            Kind::Select => {
                pop(&mut stack); // the condition
                let b = pop(&mut stack);
                let a = pop(&mut stack);
                let passes = |v: Val| matches!(v, Val::Arith { .. } | Val::Clean);
                stack.push(match (a, b) {
                    (Val::Arith { shape, .. }, b) if passes(b) => Val::Arith { at: i, shape },
                    (a, Val::Arith { shape, .. }) if passes(a) => Val::Arith { at: i, shape },
                    (Val::Clean, Val::Clean) => Val::Clean,
                    (a, b) => {
                        eager(a, &mut plan);
                        eager(b, &mut plan);
                        Val::Exact
                    }
                });
            }
            Kind::SimdArith(shape) => {
                for _ in 0..op.pops {
                    pop(&mut stack);
                }
                plan.after[i] = Plan::canonical(shape);
                exact(&mut stack);
            }
            Kind::Other => {
                for _ in 0..op.pops {
                    let v = pop(&mut stack);
                    eager(v, &mut plan);
                }
                exact(&mut stack);
            }
        }
        // Keep in step with the validator (unreachable code empties a frame).
        stack.truncate(op.height_after);
        while stack.len() < op.height_after {
            stack.push(Val::Exact);
        }
    }
    (!changed).then_some(plan)
}

/// Rewrite every function body of a valid module with the plan `planner`
/// makes for it.
fn rewrite(
    bytes: &[u8],
    mut planner: impl FnMut(&[Op<'_>], &Locals) -> Plan,
) -> Result<Vec<u8>, InvalidModule> {
    let malformed = |e: wasmparser::BinaryReaderError| InvalidModule::Malformed(e.to_string());
    let mut validator = Validator::new_with_features(features());
    let mut code: Option<(u32, Vec<u8>)> = None;
    for payload in Parser::new(0).parse_all(bytes) {
        let payload = payload.map_err(malformed)?;
        let valid = validator.payload(&payload).map_err(malformed)?;
        if let Payload::CodeSectionStart { count, .. } = payload {
            code = Some((count, Vec::new()));
        }
        if let (ValidPayload::Func(func, body), Some((_, out))) = (valid, code.as_mut()) {
            let validator = func.into_validator(Default::default());
            rewrite_body(bytes, &body, validator, &mut planner, out)?;
        }
    }
    let Some((count, bodies)) = code else {
        return Ok(bytes.to_vec());
    };
    let mut section = Vec::with_capacity(bodies.len() + 5);
    write_leb(&mut section, u64::from(count));
    section.extend_from_slice(&bodies);
    splice_code_section(bytes, section)
}

/// Analyse one body, plan, and append the rewritten body (with its size) to
/// `out`.
fn rewrite_body(
    bytes: &[u8],
    body: &FunctionBody<'_>,
    mut validator: FuncValidator<ValidatorResources>,
    planner: &mut impl FnMut(&[Op<'_>], &Locals) -> Plan,
    out: &mut Vec<u8>,
) -> Result<(), InvalidModule> {
    let malformed = |e: wasmparser::BinaryReaderError| InvalidModule::Malformed(e.to_string());
    let params = validator.len_locals();
    let mut reader = body.get_binary_reader();
    validator.read_locals(&mut reader).map_err(malformed)?;
    let types: Vec<ValType> = (0..validator.len_locals())
        .map(|i| validator.get_local_type(i).unwrap_or(ValType::I32))
        .collect();
    let mut locals_reader = body.get_locals_reader().map_err(malformed)?;
    let declarations = locals_reader.get_count();
    let groups_start = locals_reader.original_position();
    for _ in 0..declarations {
        locals_reader.read().map_err(malformed)?;
    }
    let ops_start = locals_reader.original_position();

    let mut ops = Vec::new();
    let mut reader = body.get_operators_reader().map_err(malformed)?;
    while !reader.eof() {
        let (op, start) = reader.read_with_offset().map_err(malformed)?;
        let floor = validator.get_control_frame(0).map_or(0, |f| f.height);
        let (pops, pushes) = op.operator_arity(&validator).ok_or_else(|| {
            InvalidModule::Malformed(format!("cannot tell the operands of {op:?}"))
        })?;
        let global = match op {
            Operator::GlobalSet { global_index } => validator
                .resources()
                .global_at(global_index)
                .map(|g| g.content_type),
            _ => None,
        };
        validator.op(start, &op).map_err(malformed)?;
        ops.push(Op {
            op,
            start,
            end: reader.original_position(),
            pops,
            pushes,
            floor,
            height_after: validator.operand_stack_height() as usize,
            global,
        });
    }
    reader.finish().map_err(malformed)?;
    let body_end = reader.original_position();

    let locals = Locals { params, types };
    let plan = planner(&ops, &locals);
    let mut scratch: Vec<(Shape, u32)> = Vec::new();
    let mut next = u64::from(validator.len_locals());
    for insert in plan.before.iter().chain(&plan.after).flatten() {
        if !scratch
            .iter()
            .any(|(s, _)| s.val_type() == insert.shape.val_type())
        {
            if next >= MAX_LOCALS {
                return Err(InvalidModule::TooManyLocals {
                    function: validator.index(),
                    locals: u64::from(validator.len_locals()),
                });
            }
            scratch.push((insert.shape, next as u32));
            next += 1;
        }
    }

    let mut new = Vec::with_capacity(body_end - body.range().start + 16);
    write_leb(&mut new, u64::from(declarations) + scratch.len() as u64);
    new.extend_from_slice(&bytes[groups_start..ops_start]);
    for (shape, _) in &scratch {
        write_leb(&mut new, 1);
        new.push(val_type_byte(shape.val_type()));
    }
    let local_of = |shape: Shape| {
        scratch
            .iter()
            .find(|(s, _)| s.val_type() == shape.val_type())
            .map_or(0, |(_, l)| *l)
    };
    for (i, op) in ops.iter().enumerate() {
        if let Some(insert) = plan.before[i] {
            emit(&mut new, insert, local_of(insert.shape));
        }
        new.extend_from_slice(&bytes[op.start..op.end]);
        if let Some(insert) = plan.after[i] {
            emit(&mut new, insert, local_of(insert.shape));
        }
    }
    write_leb(out, new.len() as u64);
    out.extend_from_slice(&new);
    Ok(())
}

/// Append the replacement of a NaN on top of the stack (module docs).
fn emit(out: &mut Vec<u8>, insert: Insert, scratch: u32) {
    const LOCAL_GET: u8 = 0x20;
    const LOCAL_SET: u8 = 0x21;
    const SELECT: u8 = 0x1b;
    const SIMD: u8 = 0xfd;
    out.push(LOCAL_SET);
    write_leb(out, u64::from(scratch));
    let nan = insert.nan.to_le_bytes();
    match insert.shape {
        Shape::F32 => {
            out.push(0x43); // f32.const
            out.extend_from_slice(&nan[..4]);
        }
        Shape::F64 => {
            out.push(0x44); // f64.const
            out.extend_from_slice(&nan[..8]);
        }
        Shape::F32x4 | Shape::F64x2 => {
            out.extend_from_slice(&[SIMD, 0x0c]); // v128.const
            out.extend_from_slice(&nan);
        }
    }
    for _ in 0..3 {
        out.push(LOCAL_GET);
        write_leb(out, u64::from(scratch));
    }
    match insert.shape {
        Shape::F32 => out.extend_from_slice(&[0x5c, SELECT]), // f32.ne
        Shape::F64 => out.extend_from_slice(&[0x62, SELECT]), // f64.ne
        // f32x4.ne / f64x2.ne, v128.bitselect
        Shape::F32x4 => out.extend_from_slice(&[SIMD, 0x42, SIMD, 0x52]),
        Shape::F64x2 => out.extend_from_slice(&[SIMD, 0x48, SIMD, 0x52]),
    }
}

fn val_type_byte(ty: ValType) -> u8 {
    match ty {
        ValType::F32 => 0x7d,
        ValType::F64 => 0x7c,
        _ => 0x7b, // v128
    }
}

/// `bytes` with the code section's contents replaced by `section`, and
/// without DWARF, which describes the code's old offsets (backtraces would
/// name the wrong lines).
fn splice_code_section(bytes: &[u8], section: Vec<u8>) -> Result<Vec<u8>, InvalidModule> {
    let mut section = Some(section);
    rewrite_sections(bytes, |id, content| {
        Ok(match id {
            CODE_SECTION => SectionEdit::Replace(section.take().unwrap_or_default()),
            CUSTOM_SECTION if custom_name(content).is_some_and(|n| n.starts_with(b".debug_")) => {
                SectionEdit::Drop
            }
            _ => SectionEdit::Keep,
        })
    })
}

/// A custom section's name.
fn custom_name(content: &[u8]) -> Option<&[u8]> {
    let (len, n) = read_leb_u32(content)?;
    content.get(n..n.checked_add(len as usize)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The instructions of function `index` (imports not counted).
    fn body_ops(bytes: &[u8], index: usize) -> Vec<String> {
        let mut bodies = Vec::new();
        for payload in Parser::new(0).parse_all(bytes) {
            if let Payload::CodeSectionEntry(body) = payload.expect("parses") {
                let mut reader = body.get_operators_reader().expect("operators");
                let mut ops = Vec::new();
                while !reader.eof() {
                    ops.push(format!("{:?}", reader.read().expect("operator")));
                }
                bodies.push(ops);
            }
        }
        bodies.swap_remove(index)
    }

    fn count(ops: &[String], name: &str) -> usize {
        ops.iter().filter(|op| op.as_str() == name).count()
    }

    fn rewrite_wat(text: &str) -> Vec<u8> {
        let bytes = wat::parse_str(text).expect("wat");
        let out = canonicalize_nans(&bytes).expect("rewrites");
        Validator::new_with_features(features())
            .validate_all(&out)
            .expect("the rewritten module is valid");
        out
    }

    /// The loop of an inner product keeps its sum in a local that only
    /// arithmetic writes: nothing is inserted in the loop, one
    /// canonicalization where the sum is stored.
    #[test]
    fn a_loop_carried_sum_is_canonicalized_once_where_it_is_stored() {
        let out = rewrite_wat(
            r#"(module (memory 1)
                 (func (param $n i32) (local $i i32) (local $sum f64)
                   (loop $l
                     (local.set $sum (f64.add (local.get $sum)
                       (f64.mul (f64.load (local.get $i)) (f64.load offset=8 (local.get $i)))))
                     (br_if $l (i32.lt_u (local.tee $i (i32.add (local.get $i) (i32.const 16)))
                                         (local.get $n))))
                   (f64.store (i32.const 0) (local.get $sum))))"#,
        );
        let ops = body_ops(&out, 0);
        assert_eq!(count(&ops, "F64Ne"), 1, "{ops:#?}");
        let store = ops
            .iter()
            .position(|op| op.starts_with("F64Store"))
            .expect("store");
        assert_eq!(
            ops[store - 1],
            "Select",
            "canonicalized right before the store"
        );
    }

    /// A local that also receives loaded bits holds exact bits: the sums that
    /// go into it are canonicalized on the way in, and reading it costs
    /// nothing.
    #[test]
    fn a_local_that_receives_loaded_bits_gets_canonical_values_only() {
        let out = rewrite_wat(
            r#"(module (memory 1)
                 (func (local $x f64)
                   (local.set $x (f64.load (i32.const 0)))
                   (local.set $x (f64.add (local.get $x) (f64.const 1)))
                   (f64.store (i32.const 8) (local.get $x))))"#,
        );
        let ops = body_ops(&out, 0);
        assert_eq!(count(&ops, "F64Ne"), 1, "{ops:#?}");
        let add = ops.iter().position(|op| op == "F64Add").expect("add");
        assert!(ops[add + 1].starts_with("LocalSet"), "{ops:#?}");
        assert_eq!(
            ops[add + 7],
            "Select",
            "canonicalized between the add and the set"
        );
    }

    /// Values that leave a function or a block, or meet exact bits in a
    /// `select`, are canonicalized where they are made.
    #[test]
    fn values_that_leave_are_canonicalized_where_they_are_made() {
        let out = rewrite_wat(
            r#"(module (memory 1)
                 (func $f (param f32) (result f32) (f32.sqrt (local.get 0)))
                 (func (param f64) (result f64)
                   (select (f64.div (local.get 0) (f64.const 0)) (local.get 0) (i32.const 1))))"#,
        );
        let f = body_ops(&out, 0);
        assert_eq!(f[1], "F32Sqrt");
        assert!(f[2].starts_with("LocalSet") && f[7] == "F32Ne", "{f:#?}");
        let g = body_ops(&out, 1);
        assert_eq!(count(&g, "F64Ne"), 1, "{g:#?}");
        let div = g.iter().position(|op| op == "F64Div").expect("div");
        assert_eq!(g[div + 7], "Select", "{g:#?}");
    }

    /// SIMD arithmetic is canonicalized after every instruction, lane by lane;
    /// a scalar splatted into a vector is canonicalized first.
    #[test]
    fn simd_arithmetic_is_canonicalized_lane_by_lane() {
        let out = rewrite_wat(
            r#"(module (memory 1)
                 (func (param f32)
                   (v128.store (i32.const 0)
                     (f32x4.add (f32x4.splat (f32.sqrt (local.get 0))) (v128.load (i32.const 16))))))"#,
        );
        let ops = body_ops(&out, 0);
        assert_eq!(count(&ops, "F32Ne"), 1, "{ops:#?}");
        assert_eq!(count(&ops, "F32x4Ne"), 1, "{ops:#?}");
        assert_eq!(count(&ops, "V128Bitselect"), 1, "{ops:#?}");
        let splat = ops.iter().position(|op| op == "F32x4Splat").expect("splat");
        assert_eq!(ops[splat - 1], "Select");
    }

    /// Code after `unreachable`, with its polymorphic stack, still rewrites
    /// to a valid module; DWARF, which would describe old offsets, goes.
    #[test]
    fn unreachable_code_rewrites_and_dwarf_is_dropped() {
        let mut bytes = wat::parse_str(
            r#"(module (memory 1)
                 (func (result f64)
                   (unreachable) (f64.add) (f64.store) (f64.const 1) (f64.mul) (return)))"#,
        )
        .expect("wat");
        bytes.extend_from_slice(&[0, 12, 11]);
        bytes.extend_from_slice(b".debug_info");
        let out = canonicalize_nans(&bytes).expect("rewrites");
        Validator::new_with_features(features())
            .validate_all(&out)
            .expect("valid");
        assert!(!out.windows(11).any(|w| w == b".debug_info"));
    }

    /// A function already at WebAssembly's limit of locals cannot get a
    /// scratch local: a clear error, which the supernode gives at upload.
    #[test]
    fn a_function_with_the_most_locals_is_refused_clearly() {
        let locals = "f64 ".repeat(50_000);
        let bytes = wat::parse_str(format!(
            "(module (memory 1) (func (local {locals}) (f64.store (i32.const 0) (f64.sqrt (local.get 0)))))"
        ))
        .expect("wat");
        let err = canonicalize_nans(&bytes).expect_err("no room for a scratch local");
        assert!(matches!(
            err,
            InvalidModule::TooManyLocals {
                function: 0,
                locals: 50_000
            }
        ));
        assert!(err.to_string().contains("split the function"), "{err}");
    }

    /// Invalid input is an error, not a panic.
    #[test]
    fn an_invalid_module_is_an_error() {
        assert!(matches!(
            canonicalize_nans(b"\0asm\x01\0\0\0\x0a\x05"),
            Err(InvalidModule::Malformed(_))
        ));
    }
}
