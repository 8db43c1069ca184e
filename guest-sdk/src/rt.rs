//! The runtime behind `#[bspweb::main]`: drives the program's future one
//! step per `bspweb_resume` call.
//!
//! # State
//!
//! Everything lives in linear memory: the statics below (a `UnsafeCell` in a
//! `static` is data, not a wasm global) and the heap (the boxed future, which
//! holds the program's locals across awaits, and the leaked [`Bsp`]). No
//! `thread_local!` is used, because with some targets and features those
//! become extra mutable wasm globals, which the validator refuses. Since
//! `bspweb_resume` returns after each poll, no wasm frame is live between
//! calls, and a copy of linear memory is a complete checkpoint.

use core::cell::UnsafeCell;
use core::future::Future;
use core::pin::Pin;
use core::task::{Context, Poll, Waker};

use serde::de::DeserializeOwned;

use crate::host::{self, abi};
use crate::{Bsp, IntoOutcome};

/// A `static` cell for single-threaded wasm32.
struct Global<T>(UnsafeCell<T>);

// SAFETY: bspweb guests run on wasm32 without the `atomics` feature (a
// compile error in `host` enforces it), so there is exactly one thread and no
// concurrent access. On other targets `resume` panics before touching any
// `Global` and no `Bsp` (hence no suspending future) can exist outside this
// crate's tests, which touch `SUSPEND` from a single test function.
unsafe impl<T> Sync for Global<T> {}

impl<T> Global<T> {
    const fn new(value: T) -> Self {
        Global(UnsafeCell::new(value))
    }
}

type Program = Pin<Box<dyn Future<Output = Result<(), String>>>>;

enum State {
    /// `bspweb_resume` has not been called yet.
    Fresh,
    /// `main` is running (suspended between calls).
    Running(Program),
    /// `main` returned normally.
    Finished,
}

static STATE: Global<State> = Global::new(State::Fresh);

/// Why the program last returned `Pending`: a status code, or `NOT_SUSPENDED`.
static SUSPEND: Global<i32> = Global::new(NOT_SUSPENDED);

const NOT_SUSPENDED: i32 = -1;

/// Records why the program is about to return `Pending` (called by the
/// `sync` and `may_migrate` futures).
pub(crate) fn suspend(status: i32) {
    // SAFETY: single-threaded (see `Global`); no reference to the cell's
    // contents outlives this statement.
    unsafe { *SUSPEND.0.get() = status };
}

fn take_suspend() -> i32 {
    // SAFETY: as in `suspend`.
    unsafe { core::mem::replace(&mut *SUSPEND.0.get(), NOT_SUSPENDED) }
}

/// What one poll of the program came to.
#[derive(Debug, PartialEq, Eq)]
enum Step {
    /// Suspended with this status (`STATUS_SYNC` or `STATUS_YIELD`).
    Suspended(i32),
    /// `main` returned `Ok`.
    Done,
    /// `main` returned an error with this message, or awaited a future that
    /// is not the SDK's.
    Failed(String),
}

fn poll_once(program: &mut Program) -> Step {
    take_suspend();
    let mut cx = Context::from_waker(Waker::noop());
    match program.as_mut().poll(&mut cx) {
        Poll::Ready(Ok(())) => Step::Done,
        Poll::Ready(Err(message)) => Step::Failed(message),
        Poll::Pending => match take_suspend() {
            status @ (abi::STATUS_SYNC | abi::STATUS_YIELD) => Step::Suspended(status),
            _ => Step::Failed(
                "main is waiting on a future that is neither `bsp.sync()` nor `bsp.may_migrate()`; \
                 bspweb programs have no executor, timers or I/O, so they can await only those two"
                    .to_string(),
            ),
        },
    }
}

/// The body of the `bspweb_resume` export that `#[bspweb::main]` generates.
///
/// The first call installs the panic hook, decodes the job's arguments as
/// `A`, creates the [`Bsp`] and calls `main`; every call then polls the
/// program once and returns `STATUS_SYNC`, `STATUS_YIELD` or `STATUS_DONE`.
/// An error from `main`, a panic or undecodable arguments end in the host's
/// `abort`, which does not return.
#[doc(hidden)]
pub fn resume<A, F, Fut, R>(main: F) -> i32
where
    A: DeserializeOwned + 'static,
    F: FnOnce(&'static mut Bsp, A) -> Fut + 'static,
    Fut: Future<Output = R> + 'static,
    R: IntoOutcome + 'static,
{
    if !cfg!(target_arch = "wasm32") {
        panic!("bspweb programs run only inside a bspweb peer (wasm32)");
    }
    // SAFETY: single-threaded (see `Global`), and the host calls
    // `bspweb_resume` only while the guest is idle, so this is the only
    // reference to the state; the program's code cannot reach `STATE`.
    let state = unsafe { &mut *STATE.0.get() };
    if let State::Fresh = state {
        install_panic_hook();
        let args = match decode_args::<A>(&host::args()) {
            Ok(args) => args,
            Err(message) => host::abort_with(&message),
        };
        let bsp: &'static mut Bsp = Box::leak(Box::new(Bsp::from_host()));
        let program = main(bsp, args);
        *state = State::Running(Box::pin(async move { program.await.into_outcome() }));
    }
    match state {
        State::Running(program) => match poll_once(program) {
            Step::Suspended(status) => status,
            Step::Done => {
                *state = State::Finished;
                abi::STATUS_DONE
            }
            Step::Failed(message) => host::abort_with(&message),
        },
        // A host that resumes a finished program learns again that it is done.
        State::Finished | State::Fresh => abi::STATUS_DONE,
    }
}

/// Panics end the job with `panicked at FILE:LINE:COL: MESSAGE`.
fn install_panic_hook() {
    std::panic::set_hook(Box::new(|info| {
        let message = info
            .payload_as_str()
            .unwrap_or("(a panic payload that is not a string)");
        let text = match info.location() {
            Some(at) => format!(
                "panicked at {}:{}:{}: {message}",
                at.file(),
                at.line(),
                at.column()
            ),
            None => format!("panicked: {message}"),
        };
        host::abort_with(&text);
    }));
}

/// Decodes the job's arguments (JSON text) as `A`.
///
/// Empty arguments and `null` mean "none" (the CLI, the web UI and the API
/// send `null` when no arguments were given): they decode as `null` (for
/// `()` and `Option`) or, failing that, as `{}` (for structs whose fields all
/// have defaults). Likewise `{}` is accepted for `()`.
pub(crate) fn decode_args<A: DeserializeOwned>(bytes: &[u8]) -> Result<A, String> {
    let type_name = core::any::type_name::<A>();
    let Ok(text) = core::str::from_utf8(bytes) else {
        return Err(format!(
            "invalid job arguments: they are not UTF-8 text; pass a JSON value for `{type_name}`"
        ));
    };
    let text = text.trim();
    if text.is_empty() || text == "null" {
        return serde_json::from_str::<A>("null")
            .or_else(|_| serde_json::from_str::<A>("{}"))
            .map_err(|e| {
                format!(
                    "this program needs arguments: expected a JSON value for `{type_name}`: {e}"
                )
            });
    }
    match serde_json::from_str::<A>(text) {
        Ok(args) => Ok(args),
        Err(e) => {
            let empty_object =
                serde_json::from_str::<serde_json::Map<String, serde_json::Value>>(text)
                    .is_ok_and(|m| m.is_empty());
            if empty_object && let Ok(args) = serde_json::from_str::<A>("null") {
                return Ok(args);
            }
            Err(format!(
                "invalid job arguments: expected a JSON value for `{type_name}`: {e}; the arguments were: {}",
                excerpt(text, 200)
            ))
        }
    }
}

/// At most `max` bytes of `text` (cut at a character boundary), with `…`
/// when cut.
fn excerpt(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bsp::MayMigrate;
    use crate::bsp::tests::{bsp, msg};
    use serde::Deserialize;

    #[derive(Debug, Deserialize, PartialEq)]
    #[serde(default)]
    struct WithDefaults {
        width: u32,
        name: String,
    }

    impl Default for WithDefaults {
        fn default() -> Self {
            WithDefaults {
                width: 256,
                name: "x".into(),
            }
        }
    }

    #[derive(Debug, Deserialize, PartialEq)]
    struct Required {
        mode: String,
    }

    #[test]
    fn empty_arguments_decode_as_null_or_empty_object() {
        decode_args::<()>(b"").unwrap();
        decode_args::<()>(b"  \n").unwrap();
        decode_args::<()>(b"null").unwrap();
        decode_args::<()>(b"{}").unwrap();
        assert_eq!(decode_args::<Option<u32>>(b"null").unwrap(), None);
        assert_eq!(
            decode_args::<WithDefaults>(b" null ").unwrap(),
            WithDefaults::default()
        );
        assert_eq!(decode_args::<Option<u32>>(b"").unwrap(), None);
        assert_eq!(
            decode_args::<WithDefaults>(b"").unwrap(),
            WithDefaults::default()
        );
        assert_eq!(
            decode_args::<WithDefaults>(b"{}").unwrap(),
            WithDefaults::default()
        );
    }

    #[test]
    fn arguments_decode_with_defaults_for_missing_fields() {
        let a: WithDefaults = decode_args(br#"{"width": 3}"#).unwrap();
        assert_eq!(
            a,
            WithDefaults {
                width: 3,
                name: "x".into()
            }
        );
        let r: Required = decode_args(br#" {"mode":"panic"} "#).unwrap();
        assert_eq!(r.mode, "panic");
    }

    #[test]
    fn bad_arguments_name_the_expected_type() {
        let e = decode_args::<WithDefaults>(br#"{"width": "wide"}"#).unwrap_err();
        assert!(
            e.starts_with("invalid job arguments: expected a JSON value for `"),
            "{e}"
        );
        assert!(e.contains("WithDefaults"), "{e}");
        assert!(
            e.contains(r#"the arguments were: {"width": "wide"}"#),
            "{e}"
        );
        let e = decode_args::<Required>(b"").unwrap_err();
        assert!(e.starts_with("this program needs arguments"), "{e}");
        let e = decode_args::<Required>(b"null").unwrap_err();
        assert!(e.starts_with("this program needs arguments"), "{e}");
        assert!(e.contains("missing field `mode`"), "{e}");
        let e = decode_args::<()>(&[0xff, 0xfe]).unwrap_err();
        assert!(e.contains("not UTF-8"), "{e}");
        let long = format!("[{}]", "1,".repeat(500));
        let e = decode_args::<()>(long.as_bytes()).unwrap_err();
        assert!(e.ends_with('…') && e.len() < 400, "{e}");
    }

    #[test]
    fn excerpt_cuts_at_char_boundaries() {
        assert_eq!(excerpt("abc", 5), "abc");
        assert_eq!(excerpt("ééé", 3), "é…");
    }

    /// The only test that touches `SUSPEND` (tests run on several threads).
    #[test]
    fn the_program_future_is_driven_one_suspension_at_a_time() {
        // may_migrate yields twice, then the program finishes.
        let mut p: Program = Box::pin(async {
            MayMigrate::new().await;
            MayMigrate::new().await;
            Ok(())
        });
        assert_eq!(poll_once(&mut p), Step::Suspended(abi::STATUS_YIELD));
        assert_eq!(poll_once(&mut p), Step::Suspended(abi::STATUS_YIELD));
        assert_eq!(poll_once(&mut p), Step::Done);

        // sync suspends once and then drops the cached inbox, so the next
        // superstep reads the host's new messages.
        let b: &'static mut Bsp = Box::leak(Box::new(bsp(0, 2, vec![msg(1, b"old")])));
        let mut p: Program = Box::pin(async move {
            assert_eq!(b.message_count(), 1);
            b.sync().await;
            Err(format!(
                "inbox cached after sync: {}",
                b.inbox.get().is_some()
            ))
        });
        assert_eq!(poll_once(&mut p), Step::Suspended(abi::STATUS_SYNC));
        assert_eq!(
            poll_once(&mut p),
            Step::Failed("inbox cached after sync: false".into())
        );

        // An error from main ends the job with its message.
        let mut p: Program =
            Box::pin(async { Err::<(), _>(crate::Error::msg("bad input")).into_outcome() });
        assert_eq!(poll_once(&mut p), Step::Failed("bad input".into()));

        // Awaiting anything else is refused with an explanation.
        let mut p: Program = Box::pin(async {
            core::future::pending::<()>().await;
            Ok(())
        });
        match poll_once(&mut p) {
            Step::Failed(m) => assert!(
                m.contains("neither `bsp.sync()` nor `bsp.may_migrate()`"),
                "{m}"
            ),
            other => panic!("expected a failure, got {other:?}"),
        }
    }
}
