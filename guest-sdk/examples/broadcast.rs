//! `broadcast`: the two broadcast forms of the API.
//!
//! Pid 0 sends `"range hello"` to every pid with `send_range(0..n)` and
//! `"list hello"` to the even pids with `send_list`; every pid sends
//! `"from {pid}"` to the list `[0, n - 1]` (twice to pid 0 when `n == 1`).
//! After the sync each process prints, for each message in delivery order,
//! `pid {me} got {text} from {src}`, then `pid {me} got {k} messages`.
//!
//! Arguments: none.

use bspweb::{Bsp, Result};

#[bspweb::main]
async fn main(bsp: &mut Bsp, _args: ()) -> Result<()> {
    let (pid, n) = (bsp.pid(), bsp.nprocs());
    if pid == 0 {
        bsp.send_range(0..n, "range hello")?;
        let evens: Vec<u32> = (0..n).step_by(2).collect();
        bsp.send_list(&evens, "list hello")?;
    }
    bsp.send_list(&[0, n - 1], &format!("from {pid}"))?;
    bsp.sync().await;

    for m in bsp.messages() {
        let text: String = m.decode()?;
        bsp.println(format!("pid {pid} got {text} from {}", m.source()));
    }
    bsp.println(format!("pid {pid} got {} messages", bsp.message_count()));
    Ok(())
}
