//! `ring`: the message-passing example of the dissertation (Listing 2.1).
//!
//! Every process sends `1` to its left and `2` to its right neighbour, syncs,
//! and prints what it received, reading the messages in the four ways the API
//! offers. Output of each process (stdout), in this order:
//!
//! ```text
//! got {content} from pid {src} in superstep {ss}     (each message, delivery order)
//! got in total {k} messages
//! received {content} from pid 0 in superstep {ss}    (each message from pid 0)
//! got {k} messages from pid 0
//! ```
//!
//! Arguments: none.

use bspweb::{Bsp, Result};

#[bspweb::main]
async fn main(bsp: &mut Bsp, _args: ()) -> Result<()> {
    // Calculate the neighbours.
    let pid = bsp.pid();
    let n = bsp.nprocs();
    let left = (pid + n - 1) % n;
    let right = (pid + 1) % n;

    bsp.send(left, &1u32)?;
    bsp.send(right, &2u32)?;

    bsp.sync().await;

    // Get all my messages, method 1: by index.
    for i in 0..bsp.message_count() {
        if let Some(msg) = bsp.message(i) {
            bsp.println(format!(
                "got {} from pid {} in superstep {}",
                msg.decode::<u32>()?,
                msg.source(),
                msg.superstep()
            ));
        }
    }

    // Method 2: all at once.
    bsp.println(format!("got in total {} messages", bsp.messages().len()));

    // Messages from one pid, method 1: by index.
    let mut i = 0;
    while let Some(msg) = bsp.find_message(0, i) {
        bsp.println(format!(
            "received {} from pid 0 in superstep {}",
            msg.decode::<u32>()?,
            msg.superstep()
        ));
        i += 1;
    }

    // Method 2: all at once.
    bsp.println(format!(
        "got {} messages from pid 0",
        bsp.find_messages(0).count()
    ));
    Ok(())
}
