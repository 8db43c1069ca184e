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
//! | `tags` | (all pids) sends its right neighbour messages tagged 2, untagged and tagged 1 in that order, everyone its pid tagged 3 and 300 KB tagged 4 (a broadcast that may be relayed); after the sync checks that each tag selects exactly its messages and prints `pid {p} tags ok` |
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

const MODES: &str = "panic, trap, loop, grow, bad-pid, abort, error, flood, resource, tags, ok";

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
            "tags" => tags(bsp).await?,
            _ => {} // "ok"
        }
    }
    bsp.sync().await;
    Ok(())
}

/// Mode `tags`: messages of different kinds, told apart by tag alone.
async fn tags(bsp: &mut Bsp) -> Result<()> {
    let (pid, n) = (bsp.pid(), bsp.nprocs());
    let right = (pid + 1) % n;
    let big: Vec<u8> = (0..300_000u32).map(|i| (i as u8) ^ (pid as u8)).collect();
    bsp.send_tagged(right, 2, &format!("edge from {pid}"))?;
    bsp.send(right, &format!("plain from {pid}"))?;
    bsp.send_tagged(right, 1, &format!("rank from {pid}"))?;
    bsp.with_tag(3, |b| b.send_range(.., &pid))?;
    bsp.with_tag(4, |b| b.send_range_bytes(.., &big))?;
    bsp.sync().await;
    let left = (pid + n - 1) % n;
    let strings = |tag| -> Result<Vec<String>> {
        bsp.messages_tagged(tag)
            .map(|m| m.decode::<String>())
            .collect()
    };
    let want = |what: &str| vec![format!("{what} from {left}")];
    if strings(1)? != want("rank") || strings(2)? != want("edge") || strings(0)? != want("plain") {
        return Err(Error::msg(format!(
            "pid {pid}: tags 1, 2 and 0 selected {:?}, {:?} and {:?}",
            strings(1)?,
            strings(2)?,
            strings(0)?
        )));
    }
    let pids: Vec<u32> = bsp
        .messages_tagged(3)
        .map(|m| m.decode())
        .collect::<Result<_>>()?;
    if pids != (0..n).collect::<Vec<_>>() {
        return Err(Error::msg(format!("pid {pid}: tag 3 selected {pids:?}")));
    }
    for (q, m) in bsp.messages_tagged(4).enumerate() {
        let ok = m.source() == q as u32
            && m.len() == 300_000
            && m.bytes()
                .iter()
                .enumerate()
                .all(|(i, &b)| b == (i as u8) ^ (q as u8));
        if !ok {
            return Err(Error::msg(format!(
                "pid {pid}: the tag-4 message from pid {} is wrong",
                m.source()
            )));
        }
    }
    if bsp.messages_tagged(4).count() != n as usize {
        return Err(Error::msg(format!(
            "pid {pid}: not every tag-4 message arrived"
        )));
    }
    bsp.println(format!("pid {pid} tags ok"));
    Ok(())
}
