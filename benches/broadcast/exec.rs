//! The executor: runs the `collectives` crate's schedules and multicast
//! state machines over real TCP between the testbed's hosts.
//!
//! A [`Mesh`] starts one thread per host inside the host's network
//! namespace, connects every pair of hosts once (a full mesh, reused by
//! every run, as an MPI library keeps its connections), and gives every
//! connection a reader thread (frames into the host's inbox) and a writer
//! thread (frames out of a queue, so a host never blocks on a slow peer —
//! Robber's implementation, §3.4, does the same). A run hands each host
//! its part ([`Part`]); all wait on a barrier, the root notes the start,
//! and each host reports when it held all the data and whether its hash
//! matched. All hosts are threads of this process, so the root's start and
//! the receivers' completion instants are on one clock.

use std::collections::{BTreeMap, VecDeque};
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::ops::Range;
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, channel};
use std::sync::{Arc, Barrier, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use collectives::{MulticastMsg, PeerNode, Schedule};

use crate::testbed::Testbed;

/// The port every host listens on (each host has its own namespace).
const PORT: u16 = 7300;
/// A run that makes no progress for this long has failed.
const STALL: Duration = Duration::from_secs(120);

/// FNV-1a, 64 bits: what receivers compare their data against.
pub fn hash(data: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in data {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// How a host orders the transfers it sends in a [`Schedule`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Order {
    /// MPI-like: a host posts all its transfers of a step at once and
    /// starts its next step only when the receivers acknowledged them
    /// (a blocking send of a large message completes when it is received).
    /// For the flat, binomial and symmetric broadcasts.
    Steps,
    /// Each connection sends its transfers in schedule order as soon as
    /// the sender holds the bytes: pipelines and multiple trees at the
    /// rates TCP gives each connection. For the tree plans.
    Connections,
}

/// One host's share of a run.
pub enum Part {
    /// Send and receive the transfers of a schedule (host indices).
    Schedule {
        schedule: Arc<Schedule>,
        order: Order,
        /// The data (the root sends it, the others check its hash).
        data: Arc<Vec<u8>>,
    },
    /// Drive one node of a receiver-initiated multicast.
    Multicast {
        node: Box<PeerNode>,
        root: usize,
        expect: u64,
    },
}

/// What a host reports after a run.
#[derive(Debug, Clone)]
pub struct Report {
    pub host: usize,
    /// The root: when it started sending.
    pub start: Option<Instant>,
    /// A receiver: when it held all the data.
    pub done: Option<Instant>,
    /// Whether the data's hash matched (true for the root).
    pub ok: bool,
    pub error: Option<String>,
}

enum Event {
    Frame(usize, Vec<u8>),
    Run(u32, Part, Arc<Barrier>),
    Quit,
}

/// Persistent per-host threads connected all to all.
pub struct Mesh {
    inboxes: Vec<Sender<Event>>,
    threads: Vec<JoinHandle<()>>,
    reports: Receiver<Report>,
    next_job: u32,
}

impl Mesh {
    /// Start a thread in each of `hosts` and connect every pair; host `i`
    /// reaches host `j` at `addr(i, j)` (port added).
    ///
    /// With `relay_limit`, a host stops reading from all its connections
    /// while more than that many bytes wait in its outgoing queues: a relay
    /// with a bounded buffer, whose slowest child throttles what it takes
    /// in (with small socket buffers, TCP passes that on upstream). Without
    /// it a host takes in everything at once and its queues absorb it.
    pub fn start(
        tb: &Testbed,
        hosts: &[String],
        addr: impl Fn(usize, usize) -> Ipv4Addr,
        relay_limit: Option<usize>,
    ) -> Result<Mesh, String> {
        let n = hosts.len();
        let bound = Arc::new(Barrier::new(n));
        let (report_tx, reports) = channel();
        let (ready_tx, ready_rx) = channel::<Result<usize, String>>();
        let mut inboxes = Vec::with_capacity(n);
        let mut threads = Vec::with_capacity(n);
        for (i, host) in hosts.iter().enumerate() {
            let (tx, rx) = channel();
            inboxes.push(tx.clone());
            let peers: Vec<SocketAddr> = (0..n)
                .map(|j| SocketAddr::new(addr(i, j).into(), PORT))
                .collect();
            let bound = bound.clone();
            let report_tx = report_tx.clone();
            let ready_tx = ready_tx.clone();
            threads.push(
                tb.thread_in(host, move || match connect_all(i, &peers, &bound) {
                    Ok(conns) => {
                        let _ = ready_tx.send(Ok(i));
                        let gate = Arc::new(Gate {
                            queued: Mutex::new(0),
                            drained: Condvar::new(),
                            limit: relay_limit.unwrap_or(usize::MAX),
                        });
                        host_main(i, conns, gate, tx, rx, report_tx);
                    }
                    Err(e) => {
                        let _ = ready_tx.send(Err(format!("host {i}: {e}")));
                    }
                })?,
            );
        }
        drop(ready_tx);
        let mut mesh = Mesh {
            inboxes,
            threads,
            reports,
            next_job: 0,
        };
        for _ in 0..n {
            match ready_rx.recv_timeout(Duration::from_secs(60)) {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => {
                    mesh.stop();
                    return Err(e);
                }
                Err(_) => {
                    mesh.stop();
                    return Err("the mesh did not connect within 60 s".into());
                }
            }
        }
        Ok(mesh)
    }

    /// Run one broadcast: `parts[h]` for each host taking part. Returns
    /// the reports of those hosts.
    pub fn run(&mut self, parts: Vec<(usize, Part)>) -> Result<Vec<Report>, String> {
        self.next_job += 1;
        let job = self.next_job;
        let barrier = Arc::new(Barrier::new(parts.len()));
        let count = parts.len();
        for (h, part) in parts {
            self.inboxes[h]
                .send(Event::Run(job, part, barrier.clone()))
                .map_err(|_| format!("host {h} is gone"))?;
        }
        let mut reports = Vec::with_capacity(count);
        for _ in 0..count {
            let r = self
                .reports
                .recv_timeout(STALL + Duration::from_secs(10))
                .map_err(|_| "a host did not report".to_string())?;
            if let Some(e) = &r.error {
                return Err(format!("host {}: {e}", r.host));
            }
            reports.push(r);
        }
        Ok(reports)
    }

    fn stop(&mut self) {
        for tx in &self.inboxes {
            let _ = tx.send(Event::Quit);
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Drop for Mesh {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Connections of host `me`, by peer (`None` for itself).
type Conns = Vec<Option<TcpStream>>;

fn connect_all(me: usize, peers: &[SocketAddr], bound: &Barrier) -> Result<Conns, String> {
    let listener = TcpListener::bind(("0.0.0.0", PORT)).map_err(|e| format!("bind: {e}"))?;
    bound.wait();
    let mut conns: Conns = (0..peers.len()).map(|_| None).collect();
    // Connect to every higher index (the listeners' backlogs take them
    // before anyone accepts), then accept every lower one.
    for (j, &addr) in peers.iter().enumerate().skip(me + 1) {
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut s = loop {
            match TcpStream::connect_timeout(&addr, Duration::from_secs(5)) {
                Ok(s) => break s,
                Err(e) if Instant::now() >= deadline => return Err(format!("connect {addr}: {e}")),
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        };
        s.write_all(&(me as u32).to_le_bytes())
            .map_err(|e| format!("hello to {addr}: {e}"))?;
        conns[j] = Some(s);
    }
    for _ in 0..me {
        let (mut s, _) = listener.accept().map_err(|e| format!("accept: {e}"))?;
        let mut b = [0u8; 4];
        s.read_exact(&mut b).map_err(|e| format!("hello: {e}"))?;
        let j = u32::from_le_bytes(b) as usize;
        if j >= me || conns[j].is_some() {
            return Err(format!("unexpected hello from {j}"));
        }
        conns[j] = Some(s);
    }
    for s in conns.iter().flatten() {
        s.set_nodelay(true).map_err(|e| e.to_string())?;
    }
    Ok(conns)
}

/// Frame kinds (the first payload byte).
const DATA: u8 = 0;
const ACK: u8 = 1;
const MULTICAST: u8 = 2;

/// A frame: `[u32 length of the rest][kind][u32 job]` + body.
fn frame(kind: u8, job: u32, body_len: usize) -> Vec<u8> {
    let mut f = Vec::with_capacity(9 + body_len);
    f.extend_from_slice(&((5 + body_len) as u32).to_le_bytes());
    f.push(kind);
    f.extend_from_slice(&job.to_le_bytes());
    f
}

/// The bytes waiting in a host's outgoing queues, and the most its readers
/// let wait before they stop reading.
struct Gate {
    queued: Mutex<usize>,
    drained: Condvar,
    limit: usize,
}

impl Gate {
    fn add(&self, n: usize) {
        *self.queued.lock().expect("gate") += n;
    }

    fn sub(&self, n: usize) {
        let mut q = self.queued.lock().expect("gate");
        *q -= n;
        if *q <= self.limit {
            self.drained.notify_all();
        }
    }

    fn wait_below_limit(&self) {
        let mut q = self.queued.lock().expect("gate");
        while *q > self.limit {
            q = self.drained.wait(q).expect("gate");
        }
    }
}

fn host_main(
    me: usize,
    conns: Conns,
    gate: Arc<Gate>,
    inbox_tx: Sender<Event>,
    inbox: Receiver<Event>,
    reports: Sender<Report>,
) {
    let mut writers: Vec<Option<Sender<Vec<u8>>>> = Vec::with_capacity(conns.len());
    let mut io_threads = Vec::new();
    let mut sockets = Vec::new();
    for (j, c) in conns.into_iter().enumerate() {
        let Some(stream) = c else {
            writers.push(None);
            continue;
        };
        let mut rd = stream.try_clone().expect("clone socket");
        let tx = inbox_tx.clone();
        let rgate = gate.clone();
        io_threads.push(std::thread::spawn(move || {
            let mut len = [0u8; 4];
            while {
                rgate.wait_below_limit();
                rd.read_exact(&mut len).is_ok()
            } {
                let mut buf = vec![0u8; u32::from_le_bytes(len) as usize];
                if rd.read_exact(&mut buf).is_err() || tx.send(Event::Frame(j, buf)).is_err() {
                    break;
                }
            }
        }));
        let (wtx, wrx) = channel::<Vec<u8>>();
        let mut wr = stream.try_clone().expect("clone socket");
        let wgate = gate.clone();
        io_threads.push(std::thread::spawn(move || {
            for f in wrx {
                let ok = wr.write_all(&f).is_ok();
                wgate.sub(f.len());
                if !ok {
                    break;
                }
            }
        }));
        writers.push(Some(wtx));
        sockets.push(stream);
    }
    drop(inbox_tx);
    let mut host = Host { me, writers, gate };
    while let Ok(ev) = inbox.recv() {
        match ev {
            Event::Quit => break,
            Event::Frame(from, f) => {
                // Only runs consume frames; one between runs is a bug.
                let _ = reports.send(Report {
                    host: me,
                    start: None,
                    done: None,
                    ok: false,
                    error: Some(format!("stray frame of {} bytes from {from}", f.len())),
                });
            }
            Event::Run(job, part, barrier) => {
                let report = match part {
                    Part::Schedule {
                        schedule,
                        order,
                        data,
                    } => host.schedule(job, &schedule, order, &data, &barrier, &inbox),
                    Part::Multicast { node, root, expect } => {
                        host.multicast(job, *node, root, expect, &barrier, &inbox)
                    }
                };
                let _ = reports.send(report.unwrap_or_else(|e| Report {
                    host: me,
                    start: None,
                    done: None,
                    ok: false,
                    error: Some(e),
                }));
            }
        }
    }
    host.writers.clear();
    for s in &sockets {
        let _ = s.shutdown(std::net::Shutdown::Both);
    }
    for t in io_threads {
        let _ = t.join();
    }
}

struct Host {
    me: usize,
    writers: Vec<Option<Sender<Vec<u8>>>>,
    gate: Arc<Gate>,
}

/// Sorted, merged byte ranges.
#[derive(Default)]
struct Held(Vec<Range<usize>>);

impl Held {
    fn insert(&mut self, r: Range<usize>) {
        self.0.push(r);
        self.0.sort_by_key(|r| r.start);
        let mut merged: Vec<Range<usize>> = Vec::with_capacity(self.0.len());
        for r in self.0.drain(..) {
            match merged.last_mut() {
                Some(last) if r.start <= last.end => last.end = last.end.max(r.end),
                _ => merged.push(r),
            }
        }
        self.0 = merged;
    }

    fn contains(&self, r: &Range<usize>) -> bool {
        r.is_empty() || self.0.iter().any(|h| h.start <= r.start && r.end <= h.end)
    }
}

fn next_frame(inbox: &Receiver<Event>) -> Result<(usize, Vec<u8>), String> {
    match inbox.recv_timeout(STALL) {
        Ok(Event::Frame(from, f)) => Ok((from, f)),
        Ok(Event::Run(..)) => Err("a run began before the last one ended".into()),
        Ok(Event::Quit) => Err("stopped during a run".into()),
        Err(RecvTimeoutError::Timeout) => Err(format!("no progress for {STALL:?}")),
        Err(RecvTimeoutError::Disconnected) => Err("inbox closed".into()),
    }
}

fn check_job(f: &[u8], job: u32) -> Result<(u8, &[u8]), String> {
    if f.len() < 5 {
        return Err("short frame".into());
    }
    let got = u32::from_le_bytes(f[1..5].try_into().expect("4 bytes"));
    if got != job {
        return Err(format!("frame of run {got} during run {job}"));
    }
    Ok((f[0], &f[5..]))
}

impl Host {
    fn send(&self, to: usize, f: Vec<u8>) -> Result<(), String> {
        self.gate.add(f.len());
        self.writers[to]
            .as_ref()
            .ok_or_else(|| format!("no connection to {to}"))?
            .send(f)
            .map_err(|_| format!("the writer to {to} is gone"))
    }

    fn send_data(&self, job: u32, to: usize, buf: &[u8], r: &Range<usize>) -> Result<(), String> {
        let mut f = frame(DATA, job, 8 + r.len());
        f.extend_from_slice(&(r.start as u64).to_le_bytes());
        f.extend_from_slice(&buf[r.clone()]);
        self.send(to, f)
    }

    fn schedule(
        &mut self,
        job: u32,
        schedule: &Schedule,
        order: Order,
        data: &[u8],
        barrier: &Barrier,
        inbox: &Receiver<Event>,
    ) -> Result<Report, String> {
        let me = self.me;
        let len = schedule.len;
        let is_root = schedule.root == me;
        let mut buf = if is_root {
            data.to_vec()
        } else {
            vec![0u8; len]
        };
        let mut held = Held::default();
        if is_root {
            held.insert(0..len);
        }
        let mut incoming = 0usize;
        // Steps: my transfers grouped by step. Connections: per receiver.
        let mut steps: Vec<Vec<(usize, Range<usize>)>> = Vec::new();
        let mut queues: BTreeMap<usize, VecDeque<Range<usize>>> = BTreeMap::new();
        for (s, t) in schedule.transfers() {
            if t.to == me {
                incoming += 1;
            }
            if t.from != me {
                continue;
            }
            match order {
                Order::Steps => {
                    if steps.len() <= s {
                        steps.resize_with(s + 1, Vec::new);
                    }
                    steps[s].push((t.to, t.range.clone()));
                }
                Order::Connections => queues.entry(t.to).or_default().push_back(t.range.clone()),
            }
        }
        steps.retain(|s| !s.is_empty());
        let mut next_step = 0usize;
        let mut acks = 0usize;
        let mut received = 0usize;
        let mut done = None;
        let is_dest = schedule.destinations.contains(&me);

        barrier.wait();
        let start = is_root.then(Instant::now);
        loop {
            // Send whatever may go now.
            match order {
                Order::Steps => {
                    if acks == 0
                        && next_step < steps.len()
                        && steps[next_step].iter().all(|(_, r)| held.contains(r))
                    {
                        for (to, r) in &steps[next_step] {
                            self.send_data(job, *to, &buf, r)?;
                        }
                        acks = steps[next_step].len();
                        next_step += 1;
                    }
                }
                Order::Connections => {
                    for (&to, q) in queues.iter_mut() {
                        while q.front().is_some_and(|r| held.contains(r)) {
                            let r = q.pop_front().expect("front");
                            self.send_data(job, to, &buf, &r)?;
                        }
                    }
                }
            }
            if is_dest && done.is_none() && held.contains(&(0..len)) {
                done = Some(Instant::now());
            }
            let sent_all = match order {
                Order::Steps => next_step == steps.len() && acks == 0,
                Order::Connections => queues.values().all(VecDeque::is_empty),
            };
            if sent_all && received == incoming {
                break;
            }
            let (from, f) = next_frame(inbox)?;
            let (kind, body) = check_job(&f, job)?;
            match kind {
                DATA => {
                    let at = u64::from_le_bytes(body[..8].try_into().expect("8 bytes")) as usize;
                    let bytes = &body[8..];
                    buf[at..at + bytes.len()].copy_from_slice(bytes);
                    held.insert(at..at + bytes.len());
                    received += 1;
                    if order == Order::Steps {
                        self.send(from, frame(ACK, job, 0))?;
                    }
                }
                ACK => acks = acks.checked_sub(1).ok_or("unexpected ack")?,
                k => return Err(format!("unexpected frame kind {k}")),
            }
        }
        let ok = !is_dest || (held.contains(&(0..len)) && hash(&buf) == hash(data));
        Ok(Report {
            host: me,
            start,
            done,
            ok,
            error: None,
        })
    }

    fn multicast(
        &mut self,
        job: u32,
        mut node: PeerNode,
        root: usize,
        expect: u64,
        barrier: &Barrier,
        inbox: &Receiver<Event>,
    ) -> Result<Report, String> {
        let me = self.me;
        barrier.wait();
        let start = (me == root).then(Instant::now);
        let mut done = None;
        let out = node.start();
        self.post(job, out)?;
        while !node.is_finished() {
            if done.is_none() && node.has_all() && me != root {
                done = Some(Instant::now());
            }
            let (from, f) = next_frame(inbox)?;
            let (kind, body) = check_job(&f, job)?;
            if kind != MULTICAST {
                return Err(format!("unexpected frame kind {kind}"));
            }
            let msg = decode(body)?;
            let out = node.handle(from, msg).map_err(|e| e.to_string())?;
            self.post(job, out)?;
        }
        if done.is_none() && node.has_all() && me != root {
            done = Some(Instant::now());
        }
        let ok = node.data().is_some_and(|d| hash(&d) == expect);
        Ok(Report {
            host: me,
            start,
            done,
            ok,
            error: None,
        })
    }

    fn post(&self, job: u32, out: Vec<(usize, MulticastMsg)>) -> Result<(), String> {
        for (to, msg) in out {
            self.send(to, encode(job, &msg))?;
        }
        Ok(())
    }
}

fn put_bits(f: &mut Vec<u8>, bits: &[bool]) {
    f.extend_from_slice(&(bits.len() as u32).to_le_bytes());
    for chunk in bits.chunks(8) {
        f.push(
            chunk
                .iter()
                .enumerate()
                .fold(0u8, |b, (i, &x)| b | (u8::from(x) << i)),
        );
    }
}

fn get_bits(b: &[u8]) -> Result<Vec<bool>, String> {
    let n = u32::from_le_bytes(b.get(..4).ok_or("short bits")?.try_into().expect("4")) as usize;
    let bytes = b.get(4..4 + n.div_ceil(8)).ok_or("short bits")?;
    Ok((0..n).map(|i| bytes[i / 8] >> (i % 8) & 1 == 1).collect())
}

fn get_u32(b: &[u8]) -> Result<usize, String> {
    Ok(u32::from_le_bytes(b.get(..4).ok_or("short frame")?.try_into().expect("4")) as usize)
}

/// The wire form of a multicast message (Table 1 of den Burger and
/// Kielmann): an opcode, then its fields.
fn encode(job: u32, msg: &MulticastMsg) -> Vec<u8> {
    let extra = match msg {
        MulticastMsg::Piece { data, .. } => data.len(),
        _ => 0,
    };
    let mut f = frame(MULTICAST, job, 64 + extra);
    match msg {
        MulticastMsg::Desire(b) => {
            f.push(0);
            put_bits(&mut f, b);
        }
        MulticastMsg::Bitfield(b) => {
            f.push(1);
            put_bits(&mut f, b);
        }
        MulticastMsg::Have(i) => {
            f.push(2);
            f.extend_from_slice(&(*i as u32).to_le_bytes());
        }
        MulticastMsg::Request(i) => {
            f.push(3);
            f.extend_from_slice(&(*i as u32).to_le_bytes());
        }
        MulticastMsg::Piece { index, data } => {
            f.push(4);
            f.extend_from_slice(&(*index as u32).to_le_bytes());
            f.extend_from_slice(data);
        }
        MulticastMsg::Steal => f.push(5),
        MulticastMsg::Work(b) => {
            f.push(6);
            put_bits(&mut f, b);
        }
        MulticastMsg::FoundWork => f.push(7),
        MulticastMsg::Done => f.push(8),
        MulticastMsg::Stop => f.push(9),
    }
    let len = (f.len() - 4) as u32;
    f[..4].copy_from_slice(&len.to_le_bytes());
    f
}

fn decode(b: &[u8]) -> Result<MulticastMsg, String> {
    let (&op, rest) = b.split_first().ok_or("empty message")?;
    Ok(match op {
        0 => MulticastMsg::Desire(get_bits(rest)?),
        1 => MulticastMsg::Bitfield(get_bits(rest)?),
        2 => MulticastMsg::Have(get_u32(rest)?),
        3 => MulticastMsg::Request(get_u32(rest)?),
        4 => MulticastMsg::Piece {
            index: get_u32(rest)?,
            data: rest[4..].to_vec(),
        },
        5 => MulticastMsg::Steal,
        6 => MulticastMsg::Work(get_bits(rest)?),
        7 => MulticastMsg::FoundWork,
        8 => MulticastMsg::Done,
        9 => MulticastMsg::Stop,
        op => return Err(format!("unknown opcode {op}")),
    })
}
