//! `mandelbrot`: renders the Mandelbrot set, rows dealt round-robin.
//!
//! Arguments (JSON, all optional):
//! `{"width": 256, "height": 256, "max_iter": 256, "x0": -2.0, "y0": -1.25, "x1": 0.5, "y1": 1.25}`.
//!
//! Process `pid` computes the rows `r` with `r % nprocs == pid`. Pixel
//! `(px, r)` is the point `cx = x0 + (px + 0.5) * (x1 - x0) / width`,
//! `cy = y0 + (r + 0.5) * (y1 - y0) / height`, iterated as
//! `z = z^2 + c` from `z = 0` while `it < max_iter && |z|^2 <= 4`; its byte is
//! `it * 255 / max_iter` (integer arithmetic).
//!
//! Output: one raw record per row, the row index as 4 little-endian bytes
//! followed by `width` pixel bytes; then each process prints
//! `pid {pid} computed {rows} rows`; after a sync pid 0 prints
//! `mandelbrot {width}x{height} done`. Every 16 rows it offers a migration
//! point (`may_migrate`).

use bspweb::{Bsp, Error, Result};
use serde::Deserialize;

#[derive(Deserialize)]
#[serde(default, deny_unknown_fields)]
struct Args {
    width: u32,
    height: u32,
    max_iter: u32,
    x0: f64,
    y0: f64,
    x1: f64,
    y1: f64,
}

impl Default for Args {
    fn default() -> Self {
        Args {
            width: 256,
            height: 256,
            max_iter: 256,
            x0: -2.0,
            y0: -1.25,
            x1: 0.5,
            y1: 1.25,
        }
    }
}

/// The byte of one pixel.
fn pixel(a: &Args, px: u32, row: u32) -> u8 {
    let cx = a.x0 + (f64::from(px) + 0.5) * (a.x1 - a.x0) / f64::from(a.width);
    let cy = a.y0 + (f64::from(row) + 0.5) * (a.y1 - a.y0) / f64::from(a.height);
    let (mut zx, mut zy) = (0.0f64, 0.0f64);
    let mut it = 0u32;
    while it < a.max_iter && zx * zx + zy * zy <= 4.0 {
        let t = zx * zx - zy * zy + cx;
        zy = 2.0 * zx * zy + cy;
        zx = t;
        it += 1;
    }
    (u64::from(it) * 255 / u64::from(a.max_iter)) as u8
}

#[bspweb::main]
async fn main(bsp: &mut Bsp, args: Args) -> Result<()> {
    if args.width == 0 || args.height == 0 || args.max_iter == 0 {
        return Err(Error::msg(
            "width, height and max_iter must all be at least 1",
        ));
    }
    if args.width > 1 << 20 {
        return Err(Error::msg("width must be at most 1048576 pixels"));
    }
    let (pid, n) = (bsp.pid(), bsp.nprocs());
    let mut rows = 0u32;
    let mut record = Vec::with_capacity(4 + args.width as usize);
    for r in (pid..args.height).step_by(n as usize) {
        record.clear();
        record.extend_from_slice(&r.to_le_bytes());
        record.extend((0..args.width).map(|px| pixel(&args, px, r)));
        bsp.write_raw(&record)?;
        rows += 1;
        if rows.is_multiple_of(16) {
            // A long superstep: let the runtime checkpoint or migrate us.
            bsp.may_migrate().await;
        }
    }
    bsp.println(format!("pid {pid} computed {rows} rows"));
    bsp.sync().await;
    if pid == 0 {
        bsp.println(format!("mandelbrot {}x{} done", args.width, args.height));
    }
    Ok(())
}
