//! Render the Mandelbrot set on a bspweb network and save it as a PNG file:
//! the consumer API (dissertation §2.3.4, Listing 2.2) in a small program.
//!
//! ```text
//! cargo run -p bsp-api --features client --example mandelbrot_png -- \
//!     [--url URL] [--user NAME] [--password PW] [--out FILE.png] \
//!     [--width W] [--height H] [--max-iter N] [-n NPROCS]
//! ```
//!
//! URL, user and password default to `BSPWEB_URL` (else
//! `http://127.0.0.1:7878`), `BSPWEB_USER` and `BSPWEB_PASSWORD`. It runs
//! the built-in `mandelbrot` program, whose processes each write one raw
//! record per image row (the row index as 4 little-endian bytes, then one
//! grey byte per pixel), and writes the rows into an 8-bit greyscale PNG.
//!
//! The PNG encoder is the ~50 lines below (stored deflate blocks, CRC-32,
//! Adler-32): an image of a few hundred kilobytes does not need compression,
//! and the example stays free of dependencies beyond the client.

use std::error::Error;

use bsp_api::client::{Client, ClientError, ConsumerEvent, JobSpec};

/// What the job renders: the arguments of the `mandelbrot` program.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct Picture {
    pub width: u32,
    pub height: u32,
    pub max_iter: u32,
}

/// The longest side of a picture, in pixels (a 16384×16384 picture takes
/// 256 MiB here).
pub const MAX_SIDE: u32 = 16384;

impl Picture {
    /// Why the picture cannot be rendered, if it cannot.
    pub fn check(&self) -> Result<(), String> {
        let Picture {
            width,
            height,
            max_iter,
        } = *self;
        if width == 0 || height == 0 {
            return Err(format!(
                "a {width}x{height} picture has no pixels: --width and --height must be at least 1"
            ));
        }
        if width > MAX_SIDE || height > MAX_SIDE {
            return Err(format!(
                "a {width}x{height} picture is too large: --width and --height must be at most {MAX_SIDE}"
            ));
        }
        if max_iter == 0 {
            return Err("--max-iter must be at least 1".into());
        }
        Ok(())
    }
}

/// Run `mandelbrot` on `nprocs` processes; the grey pixels, row by row.
/// Standard output lines of the job go to `log`. A picture that fails
/// [`Picture::check`] is an error before any job starts.
pub async fn render(
    client: &Client,
    picture: Picture,
    nprocs: u32,
    mut log: impl FnMut(&str),
) -> Result<Vec<u8>, Box<dyn Error>> {
    picture.check()?;
    let (w, h) = (picture.width as usize, picture.height as usize);
    let spec = JobSpec::new("mandelbrot", nprocs)
        .args(&picture)?
        .description(format!("mandelbrot_png {w}x{h}"));
    let job = client.start_job(spec).await?;
    log(&format!("job {} started on {nprocs} processes", job.id));
    let mut image = vec![0u8; w * h];
    let mut seen = vec![false; h];
    let mut events = client.job_events(job.id);
    while let Some(event) = events.next().await? {
        match event {
            ConsumerEvent::RawData { pid, data, .. } => {
                let (index, row) = data
                    .split_at_checked(4)
                    .ok_or("a raw record is too short")?;
                let r = u32::from_le_bytes(index.try_into()?) as usize;
                if r >= h || row.len() != w {
                    return Err(format!(
                        "pid {pid} sent a bad row record ({r}, {} bytes)",
                        row.len()
                    )
                    .into());
                }
                image[r * w..(r + 1) * w].copy_from_slice(row);
                seen[r] = true;
            }
            ConsumerEvent::Stdout { pid, line, .. } => log(&format!("[{pid}] {line}")),
            ConsumerEvent::StatusLine { line, .. } => log(&format!("== {line}")),
            ConsumerEvent::JobExited { .. } => break,
            ConsumerEvent::JobAborted { pid, cause, .. }
            | ConsumerEvent::JobFailed { pid, cause, .. } => {
                return Err(format!("job {} ended at pid {pid:?}: {cause}", job.id).into());
            }
            ConsumerEvent::JobKilled { .. } => {
                return Err(format!("job {} was killed", job.id).into());
            }
            _ => {}
        }
    }
    match seen.iter().position(|s| !s) {
        Some(r) => Err(format!("row {r} never arrived").into()),
        None => Ok(image),
    }
}

/// CRC-32 (ISO-HDLC, as PNG uses it), bit by bit.
pub fn crc32(parts: &[&[u8]]) -> u32 {
    let mut crc = !0u32;
    for &b in parts.iter().flat_map(|p| p.iter()) {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = (crc >> 1) ^ (0xEDB8_8320 & (crc & 1).wrapping_neg());
        }
    }
    !crc
}

/// Adler-32, the checksum of a zlib stream.
pub fn adler32(data: &[u8]) -> u32 {
    let (mut a, mut b) = (1u32, 0u32);
    for chunk in data.chunks(5552) {
        for &x in chunk {
            a += u32::from(x);
            b += a;
        }
        (a, b) = (a % 65521, b % 65521);
    }
    (b << 16) | a
}

/// An 8-bit greyscale PNG of `grey` (`width * height` bytes, row by row).
pub fn png(width: u32, height: u32, grey: &[u8]) -> Vec<u8> {
    assert_eq!(grey.len(), width as usize * height as usize);
    // Each scanline starts with filter type 0 (none).
    let mut raw = Vec::with_capacity(grey.len() + height as usize);
    for row in grey.chunks(width.max(1) as usize) {
        raw.push(0);
        raw.extend_from_slice(row);
    }
    // zlib: header, stored deflate blocks of at most 65535 bytes, Adler-32.
    let mut z = vec![0x78, 0x01];
    let blocks: Vec<&[u8]> = raw.chunks(65535).collect();
    for (i, block) in blocks.iter().enumerate() {
        let len = block.len() as u16;
        z.push(u8::from(i + 1 == blocks.len()));
        z.extend_from_slice(&len.to_le_bytes());
        z.extend_from_slice(&(!len).to_le_bytes());
        z.extend_from_slice(block);
    }
    z.extend_from_slice(&adler32(&raw).to_be_bytes());
    let mut ihdr = Vec::with_capacity(13);
    ihdr.extend_from_slice(&width.to_be_bytes());
    ihdr.extend_from_slice(&height.to_be_bytes());
    ihdr.extend_from_slice(&[8, 0, 0, 0, 0]); // 8 bits, greyscale, deflate, no filter, no interlace
    let mut out = b"\x89PNG\r\n\x1a\n".to_vec();
    for (kind, data) in [(b"IHDR", &ihdr[..]), (b"IDAT", &z[..]), (b"IEND", &[][..])] {
        out.extend_from_slice(&(data.len() as u32).to_be_bytes());
        out.extend_from_slice(kind);
        out.extend_from_slice(data);
        out.extend_from_slice(&crc32(&[kind, data]).to_be_bytes());
    }
    out
}

/// The value of `--flag VALUE`, else of the environment variable, else the default.
fn option(
    args: &[String],
    flag: &str,
    env: Option<&str>,
    default: Option<&str>,
) -> Result<String, String> {
    match args.iter().position(|a| a == flag) {
        Some(i) => args
            .get(i + 1)
            .cloned()
            .ok_or_else(|| format!("{flag} needs a value")),
        None => env
            .and_then(|e| std::env::var(e).ok())
            .or(default.map(str::to_string))
            .ok_or_else(|| format!("give {flag} or set {}", env.unwrap_or("it"))),
    }
}

fn number(args: &[String], flag: &str, default: u32) -> Result<u32, String> {
    let v = option(args, flag, None, Some(&default.to_string()))?;
    v.parse()
        .map_err(|_| format!("{flag} must be a whole number, not {v:?}"))
}

async fn run(args: &[String]) -> Result<String, Box<dyn Error>> {
    let url = option(
        args,
        "--url",
        Some("BSPWEB_URL"),
        Some("http://127.0.0.1:7878"),
    )?;
    let user = option(args, "--user", Some("BSPWEB_USER"), None)?;
    let password = option(args, "--password", Some("BSPWEB_PASSWORD"), None)?;
    let out = option(args, "--out", None, Some("mandelbrot.png"))?;
    let picture = Picture {
        width: number(args, "--width", 512)?,
        height: number(args, "--height", 384)?,
        max_iter: number(args, "--max-iter", 256)?,
    };
    picture.check()?;
    let nprocs = number(args, "-n", 4)?;
    let client = match Client::login(&url, &user, &password).await {
        Err(ClientError::Unauthorized { .. }) => {
            return Err(
                format!("login to {url} as {user} failed: wrong user name or password").into(),
            );
        }
        other => other?,
    };
    let grey = render(&client, picture, nprocs, |line| eprintln!("{line}")).await?;
    std::fs::write(&out, png(picture.width, picture.height, &grey))
        .map_err(|e| format!("cannot write {out}: {e}"))?;
    Ok(out)
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> std::process::ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args).await {
        Ok(out) => {
            eprintln!("wrote {out}");
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
