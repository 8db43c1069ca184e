//! The process's handle to the BSP runtime.

use core::cell::OnceCell;
use core::fmt;
use core::future::Future;
use core::ops::{Bound, RangeBounds};
use core::pin::Pin;
use core::task::{Context, Poll};

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::host::{self, abi};
use crate::{Error, Result, Rng, rt};

/// A process's handle to the BSP runtime: the PUB-Web `BSP` interface
/// (dissertation §2.3.3) as Rust methods.
///
/// A `#[bspweb::main]` function receives it as `&mut Bsp`. There is one per
/// process; it cannot be created any other way.
///
/// | PUB-Web | `Bsp` |
/// |---|---|
/// | `getProcessId()`, `getNumberOfProcessors()` | [`pid`](Bsp::pid), [`nprocs`](Bsp::nprocs) |
/// | `sync()`, `syncMig()` | [`sync().await`](Bsp::sync) (every sync is a migration point) |
/// | `send(to, msg)` / `send(lo, hi, msg)` / `send(pids[], msg)` | [`send`](Bsp::send) / [`send_range`](Bsp::send_range) / [`send_list`](Bsp::send_list) (+ `_bytes` forms) |
/// | `getNumberOfMessages()`, `getMessage(i)`, `getAllMessages()` | [`message_count`](Bsp::message_count), [`message`](Bsp::message), [`messages`](Bsp::messages) |
/// | `findMessage(src, i)`, `findAllMessages(src)` | [`find_message`](Bsp::find_message), [`find_messages`](Bsp::find_messages) |
/// | `printStdOut`, `printStdErr` | [`println`](Bsp::println), [`eprintln`](Bsp::eprintln) |
/// | `writeRawData`, `flush` | [`write_raw`](Bsp::write_raw), [`flush`](Bsp::flush) |
/// | `abort(cause)` | [`abort`](Bsp::abort), or return `Err` from `main` |
/// | `getResourceAsStream(name)` | [`resource`](Bsp::resource) |
/// | `mayMigrate()` | [`may_migrate().await`](Bsp::may_migrate) |
pub struct Bsp {
    pid: u32,
    nprocs: u32,
    seed: u64,
    /// The messages of the current superstep, read from the host on first use
    /// and dropped by `sync`.
    pub(crate) inbox: OnceCell<Vec<Message>>,
    rng: Option<Rng>,
    /// The tag of the messages sent now ([`Bsp::with_tag`]); 0 at every
    /// superstep's start, as on the host.
    pub(crate) tag: core::cell::Cell<u32>,
}

/// A message delivered at the start of a superstep.
///
/// Messages are ordered by source pid, then in the order the source sent them.
#[derive(Clone, PartialEq, Eq)]
pub struct Message {
    source: u32,
    superstep: u32,
    tag: u32,
    data: Vec<u8>,
}

impl Message {
    /// The pid that sent the message.
    pub fn source(&self) -> u32 {
        self.source
    }

    /// The superstep in which it was sent (the one before the current one).
    pub fn superstep(&self) -> u32 {
        self.superstep
    }

    /// The tag it was sent with ([`Bsp::send_tagged`], [`Bsp::with_tag`]);
    /// 0 for an untagged message.
    pub fn tag(&self) -> u32 {
        self.tag
    }

    /// The payload as sent: postcard bytes for [`Bsp::send`], the bytes
    /// themselves for [`Bsp::send_bytes`].
    pub fn bytes(&self) -> &[u8] {
        &self.data
    }

    /// The payload's length in bytes.
    pub fn len(&self) -> usize {
        self.data.len()
    }

    /// Whether the payload is empty.
    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    /// Decodes a value sent with [`Bsp::send`] (postcard encoding).
    ///
    /// Fails, naming the type and the sender, if the payload is not exactly
    /// one `T`.
    ///
    /// ```rust,no_run
    /// # async fn f(bsp: &mut bspweb::Bsp) -> bspweb::Result<()> {
    /// for m in bsp.messages() {
    ///     let (step, total): (u32, u64) = m.decode()?;
    ///     bsp.println(format!("pid {} was at step {step} with {total}", m.source()));
    /// }
    /// # Ok(()) }
    /// ```
    pub fn decode<T: DeserializeOwned>(&self) -> Result<T> {
        let what = || {
            format!(
                "cannot decode the {}-byte message from pid {} (sent in superstep {}) as `{}`",
                self.data.len(),
                self.source,
                self.superstep,
                core::any::type_name::<T>()
            )
        };
        match postcard::take_from_bytes::<T>(&self.data) {
            Ok((value, [])) => Ok(value),
            Ok((_, rest)) => Err(Error::msg(format!(
                "{}: {} bytes are left over; was it sent as a different type, or with send_bytes?",
                what(),
                rest.len()
            ))),
            Err(e) => Err(Error::msg(format!("{}: {e}", what()))),
        }
    }
}

impl fmt::Debug for Message {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Message")
            .field("source", &self.source)
            .field("superstep", &self.superstep)
            .field("len", &self.data.len())
            .finish()
    }
}

/// "this job has 8 processes (pids 0..=7)"
fn job_size(n: u32) -> String {
    match n {
        0 => "this job has no processes".to_string(),
        1 => "this job has 1 process (pid 0)".to_string(),
        n => format!("this job has {n} processes (pids 0..={})", n - 1),
    }
}

/// The primitive numbers [`Bsp::send_numbers`] sends as they lie in
/// memory: `u8`…`u64`, `i8`…`i64` and `f32`, `f64`. Sealed.
pub trait Number: sealed::Number {}

mod sealed {
    pub trait Number: Copy {
        /// Appends the little-endian bytes.
        fn put_le(&self, out: &mut Vec<u8>);
    }
}

macro_rules! numbers {
    ($($t:ty),*) => {$(
        impl sealed::Number for $t {
            fn put_le(&self, out: &mut Vec<u8>) {
                out.extend_from_slice(&self.to_le_bytes());
            }
        }
        impl Number for $t {}
    )*};
}
numbers!(u8, u16, u32, u64, i8, i16, i32, i64, f32, f64);

fn too_large(len: usize) -> Error {
    Error::msg(format!(
        "cannot send a message of {len} bytes: the limit is {} bytes (8 MiB); split it into several messages",
        abi::MAX_MESSAGE_BYTES
    ))
}

fn encode<T: Serialize + ?Sized>(msg: &T) -> Result<Vec<u8>> {
    postcard::to_allocvec(msg).map_err(|e| {
        Error::msg(format!(
            "cannot serialize a `{}` as a message: {e}",
            core::any::type_name::<T>()
        ))
    })
}

/// Converts any pid range to a half-open `lo..hi` (as `u64`, so `..=u32::MAX`
/// does not overflow).
fn half_open(range: &impl RangeBounds<u32>, nprocs: u32) -> (u64, u64) {
    let lo = match range.start_bound() {
        Bound::Included(&a) => u64::from(a),
        Bound::Excluded(&a) => u64::from(a) + 1,
        Bound::Unbounded => 0,
    };
    let hi = match range.end_bound() {
        Bound::Included(&b) => u64::from(b) + 1,
        Bound::Excluded(&b) => u64::from(b),
        Bound::Unbounded => u64::from(nprocs),
    };
    (lo, hi)
}

/// Checks a pid range against the job size: `Ok(None)` if it is empty,
/// `Ok(Some((lo, hi)))` if every pid in it exists.
fn check_range(lo: u64, hi: u64, nprocs: u32) -> Result<Option<(u32, u32)>> {
    if lo > hi {
        return Err(Error::msg(format!(
            "cannot send to the pid range {lo}..{hi}: it starts after it ends"
        )));
    }
    if hi > u64::from(nprocs) {
        return Err(Error::msg(format!(
            "cannot send to the pid range {lo}..{hi}: {}",
            job_size(nprocs)
        )));
    }
    if lo == hi {
        return Ok(None);
    }
    // Both are at most `nprocs`, a `u32`.
    Ok(Some((lo as u32, hi as u32)))
}

impl Bsp {
    /// Reads the process's constants from the host.
    pub(crate) fn from_host() -> Bsp {
        Bsp {
            pid: host::get_pid() as u32,
            nprocs: host::get_nprocs() as u32,
            seed: host::get_seed() as u64,
            inbox: OnceCell::new(),
            rng: None,
            tag: core::cell::Cell::new(0),
        }
    }

    /// This process's id, in `0..nprocs()`.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// The number of processes of the job.
    pub fn nprocs(&self) -> u32 {
        self.nprocs
    }

    /// The current superstep, counted from 0; every [`sync`](Bsp::sync) adds
    /// one.
    pub fn superstep(&self) -> u32 {
        host::get_superstep() as u32
    }

    /// The job's seed, the same for every process. Use it (or
    /// [`rng`](Bsp::rng)) for all randomness: there is no other entropy.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// This process's random number generator,
    /// [`Rng::for_process`]`(seed(), pid())`, created on first use. Its
    /// state is part of the process's memory, so it survives checkpoints and
    /// migration.
    pub fn rng(&mut self) -> &mut Rng {
        let (seed, pid) = (self.seed, self.pid);
        self.rng.get_or_insert_with(|| Rng::for_process(seed, pid))
    }

    /// Ends the superstep: waits until every process has reached the barrier
    /// and all messages sent in this superstep are delivered.
    ///
    /// Afterwards [`messages`](Bsp::messages) holds what was sent to this
    /// process in the superstep that just ended. Because `sync` borrows the
    /// `Bsp` mutably, no [`Message`] of the old superstep can be held across
    /// it. Every sync is a point where the runtime may checkpoint or migrate
    /// the process.
    ///
    /// ```rust,no_run
    /// # async fn f(bsp: &mut bspweb::Bsp) -> bspweb::Result<()> {
    /// bsp.send_range(.., &bsp.pid())?; // tell everyone who we are
    /// bsp.sync().await;
    /// assert_eq!(bsp.message_count(), bsp.nprocs() as usize);
    /// # Ok(()) }
    /// ```
    pub fn sync(&mut self) -> SyncPoint<'_> {
        SyncPoint {
            bsp: self,
            suspended: false,
        }
    }

    /// A point inside a long superstep where the runtime may checkpoint or
    /// migrate the process (PUB-Web's `mayMigrate()`). It changes nothing the
    /// program can observe.
    ///
    /// ```rust,no_run
    /// # async fn f(bsp: &mut bspweb::Bsp) {
    /// for block in 0..1000 {
    ///     // ... a long computation on `block` ...
    ///     if block % 100 == 0 {
    ///         bsp.may_migrate().await;
    ///     }
    /// }
    /// # }
    /// ```
    pub fn may_migrate(&self) -> MayMigrate {
        MayMigrate { suspended: false }
    }

    /// Sends `msg`, serialized with postcard, to process `to`. It is
    /// delivered after the next [`sync`](Bsp::sync).
    ///
    /// Fails if `to` is not a pid of this job or the message is larger than
    /// 8 MiB.
    ///
    /// ```rust,no_run
    /// # fn f(bsp: &mut bspweb::Bsp) -> bspweb::Result<()> {
    /// let right = (bsp.pid() + 1) % bsp.nprocs();
    /// bsp.send(right, &vec![1u64, 2, 3])?;
    /// bsp.send(right, "hello")?;
    /// # Ok(()) }
    /// ```
    pub fn send<T: Serialize + ?Sized>(&self, to: u32, msg: &T) -> Result<()> {
        self.check_pid(to)?;
        self.send_bytes(to, &encode(msg)?)
    }

    /// Sends `msg` to process `to` with `tag` (any `u32`; 0 means untagged),
    /// which the receiver reads with [`Message::tag`] or selects with
    /// [`Bsp::messages_tagged`]. Like [`send`](Bsp::send) otherwise.
    pub fn send_tagged<T: Serialize + ?Sized>(&self, to: u32, tag: u32, msg: &T) -> Result<()> {
        self.with_tag(tag, |bsp| bsp.send(to, msg))
    }

    /// Runs `f`; every message it sends (by any `send` method) carries
    /// `tag`. The previous tag is in force again afterwards.
    ///
    /// ```rust,no_run
    /// # fn f(bsp: &mut bspweb::Bsp, ranks: &[f64]) -> bspweb::Result<()> {
    /// bsp.with_tag(7, |bsp| bsp.send_numbers(0, ranks))?;
    /// # Ok(()) }
    /// ```
    pub fn with_tag<R>(&self, tag: u32, f: impl FnOnce(&Self) -> R) -> R {
        let before = self.tag.replace(tag);
        if before != tag {
            host::send_tag(tag);
        }
        let r = f(self);
        if before != tag {
            self.tag.set(before);
            host::send_tag(before);
        }
        r
    }

    /// Sends raw bytes to process `to`; the receiver reads them with
    /// [`Message::bytes`].
    pub fn send_bytes(&self, to: u32, bytes: &[u8]) -> Result<()> {
        self.check_pid(to)?;
        if bytes.len() > abi::MAX_MESSAGE_BYTES {
            return Err(too_large(bytes.len()));
        }
        let rc = host::send_to(to, bytes);
        self.check_send(rc, bytes.len(), || format!("cannot send to pid {to}"))
    }

    /// Sends a slice of numbers to process `to` as their little-endian
    /// bytes, straight from the slice: no encoding, no copy in the program
    /// (the host copies the bytes once). The receiver reads them with
    /// [`Message::bytes`] (`u64::from_le_bytes` on each 8 bytes, for
    /// example). Prefer it to filling a buffer for [`send_bytes`]: besides
    /// the copy, a buffer that holds the sent data at the sync is part of
    /// the process's checkpoint.
    ///
    /// Fails like [`send_bytes`](Bsp::send_bytes) (at most 8 MiB).
    ///
    /// ```rust,no_run
    /// # fn f(bsp: &mut bspweb::Bsp) -> bspweb::Result<()> {
    /// let sums = vec![0u64; 1000];
    /// bsp.send_numbers(0, &sums[100..200])?;
    /// # Ok(()) }
    /// ```
    pub fn send_numbers<N: Number>(&self, to: u32, numbers: &[N]) -> Result<()> {
        if cfg!(target_endian = "little") {
            // SAFETY: `N` is a primitive number (sealed trait): no padding,
            // every byte initialized, any alignment is valid for `u8`; the
            // byte slice covers exactly the memory of `numbers` and borrows
            // it for no longer.
            let bytes = unsafe {
                core::slice::from_raw_parts(
                    numbers.as_ptr().cast::<u8>(),
                    core::mem::size_of_val(numbers),
                )
            };
            self.send_bytes(to, bytes)
        } else {
            let mut bytes = Vec::with_capacity(core::mem::size_of_val(numbers));
            for n in numbers {
                n.put_le(&mut bytes);
            }
            self.send_bytes(to, &bytes)
        }
    }

    /// Sends `msg` to every pid in `range` (the PUB-Web broadcast to an
    /// interval). Any range form works: `..` is everyone, `1..` everyone but
    /// pid 0, `2..=5` pids 2 to 5. An empty range sends nothing.
    ///
    /// ```rust,no_run
    /// # fn f(bsp: &mut bspweb::Bsp) -> bspweb::Result<()> {
    /// bsp.send_range(.., "to everyone, me included")?;
    /// bsp.send_range(bsp.pid() + 1.., "to the higher pids")?;
    /// # Ok(()) }
    /// ```
    pub fn send_range<T: Serialize + ?Sized>(
        &self,
        range: impl RangeBounds<u32>,
        msg: &T,
    ) -> Result<()> {
        let (lo, hi) = half_open(&range, self.nprocs);
        check_range(lo, hi, self.nprocs)?;
        self.send_range_bytes(range, &encode(msg)?)
    }

    /// Sends raw bytes to every pid in `range`.
    pub fn send_range_bytes(&self, range: impl RangeBounds<u32>, bytes: &[u8]) -> Result<()> {
        let (lo, hi) = half_open(&range, self.nprocs);
        let Some((lo, hi)) = check_range(lo, hi, self.nprocs)? else {
            return Ok(());
        };
        if bytes.len() > abi::MAX_MESSAGE_BYTES {
            return Err(too_large(bytes.len()));
        }
        let rc = host::send_to_range(lo, hi, bytes);
        self.check_send(rc, bytes.len(), || {
            format!("cannot send to the pid range {lo}..{hi}")
        })
    }

    /// Sends `msg` to each pid of `pids` (the PUB-Web broadcast to a subset).
    /// A pid listed twice receives the message twice.
    ///
    /// ```rust,no_run
    /// # fn f(bsp: &mut bspweb::Bsp) -> bspweb::Result<()> {
    /// let evens: Vec<u32> = (0..bsp.nprocs()).step_by(2).collect();
    /// bsp.send_list(&evens, &42u32)?;
    /// # Ok(()) }
    /// ```
    pub fn send_list<T: Serialize + ?Sized>(&self, pids: &[u32], msg: &T) -> Result<()> {
        self.check_pids(pids)?;
        self.send_list_bytes(pids, &encode(msg)?)
    }

    /// Sends raw bytes to each pid of `pids`.
    pub fn send_list_bytes(&self, pids: &[u32], bytes: &[u8]) -> Result<()> {
        self.check_pids(pids)?;
        if pids.is_empty() {
            return Ok(());
        }
        if bytes.len() > abi::MAX_MESSAGE_BYTES {
            return Err(too_large(bytes.len()));
        }
        let rc = host::send_to_list(pids, bytes);
        self.check_send(rc, bytes.len(), || {
            format!("cannot send to the pid list {pids:?}")
        })
    }

    fn check_pid(&self, to: u32) -> Result<()> {
        if to >= self.nprocs {
            return Err(Error::msg(format!(
                "cannot send to pid {to}: {}",
                job_size(self.nprocs)
            )));
        }
        Ok(())
    }

    fn check_pids(&self, pids: &[u32]) -> Result<()> {
        match pids.iter().find(|&&p| p >= self.nprocs) {
            Some(bad) => Err(Error::msg(format!(
                "cannot send to pid {bad} (in the pid list): {}",
                job_size(self.nprocs)
            ))),
            None => Ok(()),
        }
    }

    fn check_send(&self, rc: i32, len: usize, what: impl FnOnce() -> String) -> Result<()> {
        match rc {
            0.. => Ok(()),
            abi::ERR_BAD_PID | abi::ERR_BAD_RANGE => {
                Err(Error::msg(format!("{}: {}", what(), job_size(self.nprocs))))
            }
            abi::ERR_TOO_LARGE => Err(too_large(len)),
            code => Err(Error::msg(format!(
                "{}: the host refused with error code {code}",
                what()
            ))),
        }
    }

    fn inbox(&self) -> &[Message] {
        self.inbox.get_or_init(read_inbox)
    }

    /// The number of messages delivered in this superstep.
    pub fn message_count(&self) -> usize {
        match self.inbox.get() {
            Some(inbox) => inbox.len(),
            None => usize::try_from(host::message_count()).unwrap_or(0),
        }
    }

    /// Message `index` of this superstep, in delivery order (by source pid,
    /// then in sending order); `None` past the end.
    pub fn message(&self, index: usize) -> Option<&Message> {
        self.inbox().get(index)
    }

    /// All messages of this superstep, in delivery order.
    ///
    /// ```rust,no_run
    /// # fn f(bsp: &mut bspweb::Bsp) -> bspweb::Result<()> {
    /// let total: u64 = bsp.messages().iter().map(|m| m.decode::<u64>()).sum::<bspweb::Result<u64>>()?;
    /// # Ok(()) }
    /// ```
    pub fn messages(&self) -> &[Message] {
        self.inbox()
    }

    /// The `index`-th message (from 0) that pid `source` sent to this
    /// process in the previous superstep; `None` if it sent fewer.
    pub fn find_message(&self, source: u32, index: usize) -> Option<&Message> {
        self.find_messages(source).nth(index)
    }

    /// The messages sent with `tag` ([`Bsp::send_tagged`],
    /// [`Bsp::with_tag`]), in delivery order: messages of different kinds
    /// told apart whatever order they were sent in.
    ///
    /// ```rust,no_run
    /// # async fn f(bsp: &mut bspweb::Bsp) -> bspweb::Result<()> {
    /// const RANK: u32 = 1;
    /// const EDGE: u32 = 2;
    /// bsp.send_tagged(0, EDGE, &(3u32, 4u32))?;
    /// bsp.send_tagged(0, RANK, &0.25f64)?;
    /// bsp.sync().await;
    /// for m in bsp.messages_tagged(RANK) {
    ///     let rank: f64 = m.decode()?;
    /// }
    /// # Ok(()) }
    /// ```
    pub fn messages_tagged(&self, tag: u32) -> impl Iterator<Item = &Message> + '_ {
        self.inbox().iter().filter(move |m| m.tag == tag)
    }

    /// All messages from pid `source`, in the order it sent them.
    pub fn find_messages(&self, source: u32) -> impl Iterator<Item = &Message> + '_ {
        self.inbox().iter().filter(move |m| m.source == source)
    }

    /// Prints to the user's standard output. Each line of `text` becomes one
    /// output line (so `"a\nb"` prints two).
    pub fn println(&self, text: impl AsRef<str>) {
        print_lines(abi::STREAM_STDOUT, text.as_ref());
    }

    /// Prints to the user's standard error, like [`println`](Bsp::println).
    pub fn eprintln(&self, text: impl AsRef<str>) {
        print_lines(abi::STREAM_STDERR, text.as_ref());
    }

    /// Writes one record of raw bytes to the user (PUB-Web's
    /// `writeRawData`), for results that are not text.
    ///
    /// Limits: one record is at most 1 MiB (a larger one is an error, and
    /// nothing of it is written); all of a process's output (stdout, stderr
    /// and raw records together) is at most the job's output limit, 64 MiB
    /// by default (`bspweb submit --output-mib`, or `limits.output_mib` in the
    /// REST API, sets it from 1 to 1024 MiB),
    /// and going over it ends the job. Records keep their boundaries in the
    /// event stream (one `raw` event each); `bspweb submit --raw-dir DIR`
    /// concatenates a process's records into `DIR/pid-N.bin`, or prefixes
    /// each with its length (`--raw-framing length`) when they differ in size.
    pub fn write_raw(&self, bytes: &[u8]) -> Result<()> {
        match host::raw(bytes) {
            0.. => Ok(()),
            abi::ERR_TOO_LARGE => Err(Error::msg(format!(
                "cannot write a raw record of {} bytes: it is larger than the peer accepts; write smaller records",
                bytes.len()
            ))),
            code => Err(Error::msg(format!(
                "cannot write a raw record of {} bytes: the host refused with error code {code}",
                bytes.len()
            ))),
        }
    }

    /// Waits until the output written so far has reached the supernode.
    pub fn flush(&self) -> Result<()> {
        match host::flush_output() {
            0.. => Ok(()),
            code => Err(Error::msg(format!(
                "cannot flush the output: the host refused with error code {code}"
            ))),
        }
    }

    /// Ends the whole job (every process) with `reason`, which the user sees.
    pub fn abort(&self, reason: impl fmt::Display) -> ! {
        host::abort_with(&reason.to_string())
    }

    /// The contents of the job resource `name`, a file the user attached
    /// when submitting the job.
    ///
    /// Limits: a job's resources add up to at most 64 MiB (the supernode
    /// refuses a larger submission); a name is 1 to 256 printable
    /// characters. Each process reads the whole resource into its own
    /// memory, so it counts against the job's memory cap per process.
    ///
    /// ```rust,no_run
    /// # fn f(bsp: &mut bspweb::Bsp) -> bspweb::Result<()> {
    /// let text = String::from_utf8(bsp.resource("input.txt")?)?;
    /// # Ok(()) }
    /// ```
    pub fn resource(&self, name: &str) -> Result<Vec<u8>> {
        let size = host::resource_size(name);
        if size < 0 {
            return Err(Error::msg(format!(
                "this job has no resource named `{name}`; attach the file when submitting the job"
            )));
        }
        let mut buf = Vec::new();
        let len = match usize::try_from(size) {
            Ok(len) if buf.try_reserve_exact(len).is_ok() => len,
            _ => {
                return Err(Error::msg(format!(
                    "the resource `{name}` ({size} bytes) does not fit in this process's memory"
                )));
            }
        };
        buf.resize(len, 0);
        match host::resource_copy(name, &mut buf) {
            0.. => Ok(buf),
            abi::ERR_NOT_FOUND => Err(Error::msg(format!(
                "this job has no resource named `{name}`; attach the file when submitting the job"
            ))),
            code => Err(Error::msg(format!(
                "cannot read the resource `{name}`: the host refused with error code {code}"
            ))),
        }
    }
}

impl fmt::Debug for Bsp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Bsp")
            .field("pid", &self.pid)
            .field("nprocs", &self.nprocs)
            .field("seed", &self.seed)
            .finish_non_exhaustive()
    }
}

fn print_lines(stream: i32, text: &str) {
    for line in text.split('\n') {
        let line = line.strip_suffix('\r').unwrap_or(line);
        let rc = host::print_line(stream, line.as_bytes());
        if rc < 0 {
            host::abort_with(&format!(
                "cannot print a line of {} bytes: the host refused with error code {rc}",
                line.len()
            ));
        }
    }
}

/// Reads every message of the current superstep from the host.
fn read_inbox() -> Vec<Message> {
    let count = host::message_count();
    let count = u32::try_from(count).unwrap_or_else(|_| {
        host::abort_with(&format!(
            "internal error: the host reported {count} messages"
        ))
    });
    (0..count)
        .map(|i| {
            let [source, superstep, len] = host::message_info(i).unwrap_or_else(|code| {
                host::abort_with(&format!(
                    "internal error: the host has no message {i} of {count} (error code {code})"
                ))
            });
            let mut data = vec![0u8; len as usize];
            let rc = host::message_read(i, &mut data);
            if rc < 0 {
                host::abort_with(&format!(
                    "internal error: the host could not copy message {i} of {count} (error code {rc})"
                ));
            }
            let tag = host::message_tag(i);
            let tag = u32::try_from(tag).unwrap_or_else(|_| {
                host::abort_with(&format!(
                    "internal error: the host has no tag for message {i} of {count} (error code {tag})"
                ))
            });
            Message {
                source,
                superstep,
                tag,
                data,
            }
        })
        .collect()
}

/// The future of [`Bsp::sync`]: frees (zeroed) the superstep's messages,
/// suspends the program once (the host sees `STATUS_SYNC`), then clears the
/// message cache so the new superstep's messages are read.
#[must_use = "`bsp.sync()` does nothing unless awaited: write `bsp.sync().await`"]
#[derive(Debug)]
pub struct SyncPoint<'a> {
    bsp: &'a mut Bsp,
    suspended: bool,
}

impl Future for SyncPoint<'_> {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<()> {
        if self.suspended {
            // The host resumed us after the barrier: a new superstep with a
            // new inbox.
            self.bsp.inbox = OnceCell::new();
            // The host's tag is 0 again in the new superstep.
            self.bsp.tag.set(0);
            Poll::Ready(())
        } else {
            self.suspended = true;
            // This superstep's messages are gone after the sync: free them
            // now, zeroed, so that the checkpoint taken at the sync does not
            // carry them. Their pages then read the same at every sync (the
            // next inbox reuses the same memory and is zeroed in turn), so
            // they are not even part of a delta.
            if let Some(mut inbox) = self.bsp.inbox.take() {
                for m in &mut inbox {
                    m.data.fill(0);
                }
            }
            rt::suspend(abi::STATUS_SYNC);
            Poll::Pending
        }
    }
}

/// The future of [`Bsp::may_migrate`]: suspends the program once (the host
/// sees `STATUS_YIELD`).
#[must_use = "`bsp.may_migrate()` does nothing unless awaited: write `bsp.may_migrate().await`"]
#[derive(Debug)]
pub struct MayMigrate {
    suspended: bool,
}

impl MayMigrate {
    #[cfg(test)]
    pub(crate) fn new() -> MayMigrate {
        MayMigrate { suspended: false }
    }
}

impl Future for MayMigrate {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<()> {
        if self.suspended {
            Poll::Ready(())
        } else {
            self.suspended = true;
            rt::suspend(abi::STATUS_YIELD);
            Poll::Pending
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn bsp(pid: u32, nprocs: u32, inbox: Vec<Message>) -> Bsp {
        Bsp {
            pid,
            nprocs,
            seed: 7,
            inbox: OnceCell::from(inbox),
            rng: None,
            tag: core::cell::Cell::new(0),
        }
    }

    pub(crate) fn msg(source: u32, data: &[u8]) -> Message {
        tagged(source, 0, data)
    }

    pub(crate) fn tagged(source: u32, tag: u32, data: &[u8]) -> Message {
        Message {
            source,
            superstep: 0,
            tag,
            data: data.to_vec(),
        }
    }

    #[test]
    fn messages_are_selected_by_tag_whatever_their_order() {
        let b = bsp(
            1,
            3,
            vec![
                tagged(0, 2, b"edge-a"),
                tagged(0, 1, b"rank-a"),
                tagged(2, 1, b"rank-b"),
                msg(2, b"plain"),
                tagged(2, 2, b"edge-b"),
            ],
        );
        let data = |tag| {
            b.messages_tagged(tag)
                .map(|m| (m.source(), m.bytes().to_vec()))
                .collect::<Vec<_>>()
        };
        assert_eq!(data(1), [(0, b"rank-a".to_vec()), (2, b"rank-b".to_vec())]);
        assert_eq!(data(2), [(0, b"edge-a".to_vec()), (2, b"edge-b".to_vec())]);
        assert_eq!(data(0), [(2, b"plain".to_vec())]);
        assert_eq!(data(3), []);
        assert_eq!(b.message(1).unwrap().tag(), 1);
    }

    #[test]
    fn bad_pids_are_refused_before_reaching_the_host() {
        let b = bsp(0, 8, vec![]);
        let e = b.send(12, &1u32).unwrap_err();
        assert_eq!(
            e.to_string(),
            "cannot send to pid 12: this job has 8 processes (pids 0..=7)"
        );
        let e = b.send_bytes(8, b"x").unwrap_err();
        assert!(e.to_string().starts_with("cannot send to pid 8:"), "{e}");
        let e = b.send_list(&[1, 2, 9], &1u32).unwrap_err();
        assert_eq!(
            e.to_string(),
            "cannot send to pid 9 (in the pid list): this job has 8 processes (pids 0..=7)"
        );
        let one = bsp(0, 1, vec![]);
        assert_eq!(
            one.send(1, &()).unwrap_err().to_string(),
            "cannot send to pid 1: this job has 1 process (pid 0)"
        );
    }

    #[test]
    fn ranges_are_checked_and_empty_ones_send_nothing() {
        let b = bsp(0, 8, vec![]);
        let e = b.send_range(4..9, &1u32).unwrap_err();
        assert_eq!(
            e.to_string(),
            "cannot send to the pid range 4..9: this job has 8 processes (pids 0..=7)"
        );
        let e = b.send_range(2..=8, &1u32).unwrap_err();
        assert!(e.to_string().contains("2..9"), "{e}");
        #[allow(clippy::reversed_empty_ranges)]
        let e = b.send_range(5..3, &1u32).unwrap_err();
        assert!(e.to_string().contains("starts after it ends"), "{e}");
        // Empty ranges and lists succeed without calling the host (which
        // would panic natively).
        b.send_range(8.., &1u32).unwrap();
        b.send_range(3..3, &1u32).unwrap();
        b.send_range_bytes(0..0, b"").unwrap();
        b.send_list(&[], &1u32).unwrap();
        assert_eq!(half_open(&(..), 8), (0, 8));
        assert_eq!(half_open(&(2..=u32::MAX), 8), (2, 1 << 32));
        assert_eq!(
            half_open(&(Bound::Excluded(1), Bound::Included(3)), 8),
            (2, 4)
        );
    }

    #[test]
    fn oversized_messages_are_refused() {
        let b = bsp(0, 2, vec![]);
        let big = vec![0u8; abi::MAX_MESSAGE_BYTES + 1];
        let e = b.send_bytes(1, &big).unwrap_err();
        assert!(e.to_string().contains("limit is 8388608 bytes"), "{e}");
        assert!(b.send_list_bytes(&[0, 1], &big).is_err());
        assert!(b.send_range_bytes(.., &big).is_err());
        let words = vec![0u64; abi::MAX_MESSAGE_BYTES / 8 + 1];
        let e = b.send_numbers(1, &words).unwrap_err();
        assert!(e.to_string().contains("limit is 8388608 bytes"), "{e}");
    }

    /// While the program waits at a sync (and its checkpoint is taken) the
    /// superstep's messages are already freed, so the checkpoint does not
    /// carry them.
    #[test]
    fn a_sync_frees_the_messages_before_it_suspends() {
        let mut b = bsp(0, 2, vec![msg(1, b"old"), msg(1, &[7; 100])]);
        assert_eq!(b.message_count(), 2);
        let mut sync = b.sync();
        let mut cx = Context::from_waker(core::task::Waker::noop());
        assert_eq!(Pin::new(&mut sync).poll(&mut cx), Poll::Pending);
        drop(sync);
        assert!(b.inbox.get().is_none());
    }

    #[test]
    fn messages_are_found_by_source_in_order() {
        let b = bsp(
            1,
            3,
            vec![msg(0, b"a"), msg(0, b"b"), msg(1, b"c"), msg(2, b"d")],
        );
        assert_eq!(b.message_count(), 4);
        assert_eq!(b.message(2).unwrap().bytes(), b"c");
        assert!(b.message(4).is_none());
        assert_eq!(b.find_message(0, 1).unwrap().bytes(), b"b");
        assert!(b.find_message(0, 2).is_none());
        assert!(b.find_message(5, 0).is_none());
        let from0: Vec<&[u8]> = b.find_messages(0).map(Message::bytes).collect();
        assert_eq!(from0, [b"a", b"b"]);
        assert_eq!(b.messages().len(), 4);
    }

    #[test]
    fn decode_round_trips_and_names_the_type_on_mismatch() {
        let m = msg(
            3,
            &postcard::to_allocvec(&(7u32, "seven".to_string())).unwrap(),
        );
        assert_eq!(
            m.decode::<(u32, String)>().unwrap(),
            (7, "seven".to_string())
        );
        let e = m.decode::<u32>().unwrap_err().to_string();
        assert!(
            e.contains("from pid 3") && e.contains("`u32`") && e.contains("left over"),
            "{e}"
        );
        let e = msg(1, &[]).decode::<u64>().unwrap_err().to_string();
        assert!(
            e.contains("0-byte message from pid 1") && e.contains("`u64`"),
            "{e}"
        );
        let i: i128 = -170_141_183_460_469_231_731_687_303_715_884_105_728;
        let m = msg(0, &postcard::to_allocvec(&i).unwrap());
        assert_eq!(m.decode::<i128>().unwrap(), i);
    }

    #[test]
    fn rng_is_the_process_stream() {
        let mut b = bsp(3, 4, vec![]);
        let mut expected = Rng::for_process(7, 3);
        assert_eq!(b.rng().next_u64(), expected.next_u64());
        assert_eq!(b.rng().next_u64(), expected.next_u64());
    }
}
