//! `inner-product`: the inner product of two vectors, block-distributed.
//!
//! Arguments (JSON, optional): `{"n": 1000000}`.
//!
//! The vectors are `x_i = (i % 1000) - 500` and `y_i = ((7 i + 3) % 1001) - 500`
//! for `i` in `0..n`. Process `p` of `P` owns `[p n / P, (p + 1) n / P)`
//! ([`bspweb::dist::block`]) and sums its products in `i128`. Output:
//!
//! ```text
//! pid {p} partial sum over [{lo}, {hi}) = {partial}     (every process)
//! inner product of two {n}-vectors = {sum}             (pid 0, after a sync)
//! ```
//!
//! Every process sends its partial sum to all (a total exchange,
//! [`Bsp::all_reduce`]) and adds the partials in pid order.

use bspweb::{Bsp, Result, dist};
use serde::Deserialize;

#[derive(Deserialize)]
#[serde(default, deny_unknown_fields)]
struct Args {
    n: u64,
}

impl Default for Args {
    fn default() -> Self {
        Args { n: 1_000_000 }
    }
}

fn x(i: u64) -> i64 {
    (i % 1000) as i64 - 500
}

fn y(i: u64) -> i64 {
    ((7 * (i % 1001) + 3) % 1001) as i64 - 500
}

#[bspweb::main]
async fn main(bsp: &mut Bsp, args: Args) -> Result<()> {
    let (pid, nprocs) = (bsp.pid(), bsp.nprocs());
    let range = dist::block(args.n, nprocs, pid);
    let partial: i128 = range
        .clone()
        .map(|i| i128::from(x(i)) * i128::from(y(i)))
        .sum();
    bsp.println(format!(
        "pid {pid} partial sum over [{}, {}) = {partial}",
        range.start, range.end
    ));
    // A total exchange; the partials are added in pid order.
    let sum = bsp.all_reduce(partial, |a, b| a + b).await?;
    if pid == 0 {
        bsp.println(format!("inner product of two {}-vectors = {sum}", args.n));
    }
    Ok(())
}
