//! `misbehave`: a test program for the runtime's error handling (not for
//! users).
//!
//! Arguments: `{"mode": "ok", "pid": null}`. Every process syncs once; then
//! the chosen pid (every pid if `pid` is null) misbehaves in superstep 1
//! according to `mode`; then every process that is still alive syncs again
//! and returns `Ok`.
//!
//! | mode | what the chosen process does in superstep 1 |
//! |---|---|
//! | `panic` | `panic!("deliberate panic")` |
//! | `trap` | executes `unreachable` (a trap without a panic) |
//! | `loop` | loops forever |
//! | `grow` | allocates and fills 1 MiB blocks forever |
//! | `bad-pid` | `bsp.send(nprocs + 5, &1u32)?`: returns the SDK's error |
//! | `abort` | `bsp.abort("deliberate abort")` |
//! | `error` | returns `Err(Error::msg("deliberate error"))` |
//! | `flood` | prints lines forever |
//! | `resource` | prints the job resource `input.txt` as one line (trailing newline removed), then carries on |
//! | `ok` | nothing |

use bspweb::{Bsp, Error, Result};
use serde::Deserialize;

#[derive(Deserialize)]
#[serde(default, deny_unknown_fields)]
struct Args {
    mode: String,
    pid: Option<u32>,
}

impl Default for Args {
    fn default() -> Self {
        Args {
            mode: "ok".to_string(),
            pid: None,
        }
    }
}

const MODES: &str = "panic, trap, loop, grow, bad-pid, abort, error, flood, resource, ok";

fn trap() -> ! {
    #[cfg(target_arch = "wasm32")]
    {
        core::arch::wasm32::unreachable()
    }
    #[cfg(not(target_arch = "wasm32"))]
    {
        std::process::abort()
    }
}

#[bspweb::main]
async fn main(bsp: &mut Bsp, args: Args) -> Result<()> {
    if !MODES.split(", ").any(|m| m == args.mode) {
        return Err(Error::msg(format!(
            "unknown mode `{}`; expected one of {MODES}",
            args.mode
        )));
    }
    let chosen = args.pid.is_none_or(|p| p == bsp.pid());
    bsp.sync().await;
    if chosen {
        match args.mode.as_str() {
            "panic" => panic!("deliberate panic"),
            "trap" => trap(),
            "loop" => {
                let mut x = 0u64;
                loop {
                    x = core::hint::black_box(x.wrapping_add(1));
                }
            }
            "grow" => {
                let mut hog: Vec<Vec<u8>> = Vec::new();
                loop {
                    let fill = (hog.len() % 251 + 1) as u8;
                    hog.push(vec![fill; 1 << 20]);
                    core::hint::black_box(&hog);
                }
            }
            "bad-pid" => bsp.send(bsp.nprocs() + 5, &1u32)?,
            "abort" => bsp.abort("deliberate abort"),
            "error" => return Err(Error::msg("deliberate error")),
            "flood" => {
                let mut i = 0u64;
                loop {
                    bsp.println(format!("flood line {i}"));
                    i += 1;
                }
            }
            "resource" => {
                let data = bsp.resource("input.txt")?;
                let text = String::from_utf8_lossy(&data);
                bsp.println(text.trim_end_matches(['\n', '\r']));
            }
            _ => {} // "ok"
        }
    }
    bsp.sync().await;
    Ok(())
}
