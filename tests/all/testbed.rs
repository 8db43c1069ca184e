//! A network testbed (the analog of the dissertation's §3.4): hosts are
//! network namespaces, switches are namespaces holding a Linux bridge, and
//! every link is a veth pair shaped with `tc tbf` in both directions. The
//! topologies are in `testbed/topologies/*.topo` (the format is described in
//! `flat.topo`; `scripts/testbed` reads the same files).
//!
//! [`Testbed`] creates everything under a per-run prefix
//! (`bspwebtb-<pid>-<n>-<node>`) and its `Drop` kills every process left in
//! its namespaces and deletes them (which destroys their veths), also when a
//! test panics. A run killed outright (SIGKILL, Ctrl-C) cannot clean up; the
//! next [`Testbed::create`] deletes the namespaces of runs whose process is
//! gone.
//!
//! Needs root (CAP_NET_ADMIN, CAP_SYS_ADMIN), `ip` and `tc` (Debian package
//! `iproute2`) and the kernel's veth, bridge and sch_tbf. The kernel has no
//! netem, so links have a bandwidth but no delay.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Where `ip netns add` puts a namespace's handle.
const NETNS_DIR: &str = "/var/run/netns";
/// The first part of every namespace name the testbed creates.
const PREFIX: &str = "bspwebtb";

mod sys {
    use std::os::raw::c_int;

    pub const CLONE_NEWNET: c_int = 0x4000_0000;

    unsafe extern "C" {
        /// setns(2) from the C library std links against.
        pub fn setns(fd: c_int, nstype: c_int) -> c_int;
    }
}

/// A network: switches, hosts, and links with a rate (bits per second).
#[derive(Debug, Clone)]
pub struct Topology {
    pub name: String,
    pub switches: Vec<String>,
    pub hosts: Vec<String>,
    pub links: Vec<Link>,
}

#[derive(Debug, Clone)]
pub struct Link {
    pub a: String,
    pub b: String,
    pub rate_bps: u64,
}

/// `testbed/topologies/` of the repository.
pub fn topologies_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("testbed/topologies")
}

impl Topology {
    /// `testbed/topologies/{name}.topo`.
    pub fn load(name: &str) -> Result<Topology, String> {
        let path = topologies_dir().join(format!("{name}.topo"));
        let text = std::fs::read_to_string(&path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        Topology::parse(name, &text).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// One statement a line: `switch NAME`, `host NAME`, `link A B RATE`
    /// (RATE is `<n>kbit`, `<n>mbit` or `<n>gbit`); `#` starts a comment.
    /// Every host has exactly one link, to a switch; the switches and their
    /// links form a tree (the bridges run no spanning tree protocol).
    pub fn parse(name: &str, text: &str) -> Result<Topology, String> {
        let mut topo = Topology {
            name: name.to_string(),
            switches: vec![],
            hosts: vec![],
            links: vec![],
        };
        for (i, line) in text.lines().enumerate() {
            let line = line.split('#').next().unwrap_or("").trim();
            let words: Vec<&str> = line.split_whitespace().collect();
            let err = |m: &str| format!("line {}: {m}: {line:?}", i + 1);
            match words.as_slice() {
                [] => {}
                ["switch", n] | ["host", n] => {
                    let ok = !n.is_empty()
                        && n.len() <= 16
                        && n.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
                    if !ok {
                        return Err(err("node names are 1-16 letters, digits or _"));
                    }
                    if topo.is_switch(n) || topo.is_host(n) {
                        return Err(err("a node of that name exists"));
                    }
                    if words[0] == "switch" {
                        topo.switches.push(n.to_string());
                    } else {
                        topo.hosts.push(n.to_string());
                    }
                }
                ["link", a, b, rate] => {
                    for n in [a, b] {
                        if !topo.is_switch(n) && !topo.is_host(n) {
                            return Err(err(&format!("unknown node {n} (declare it first)")));
                        }
                    }
                    if topo.is_host(a) && topo.is_host(b) {
                        return Err(err("hosts link to switches, not to each other"));
                    }
                    let rate_bps = parse_rate(rate).ok_or_else(|| err("bad rate"))?;
                    topo.links.push(Link {
                        a: a.to_string(),
                        b: b.to_string(),
                        rate_bps,
                    });
                }
                _ => return Err(err("expected `switch N`, `host N` or `link A B RATE`")),
            }
        }
        for h in &topo.hosts {
            let n = topo.links.iter().filter(|l| &l.a == h || &l.b == h).count();
            if n != 1 {
                return Err(format!("host {h} has {n} links; it needs exactly one"));
            }
        }
        // The switches must form a tree: n - 1 links, all connected.
        let trunks: Vec<&Link> = topo
            .links
            .iter()
            .filter(|l| topo.is_switch(&l.a) && topo.is_switch(&l.b))
            .collect();
        if topo.switches.is_empty() {
            return Err("no switch".into());
        }
        if trunks.len() + 1 != topo.switches.len() {
            return Err(format!(
                "{} switches need {} switch-to-switch links (a tree), not {}",
                topo.switches.len(),
                topo.switches.len() - 1,
                trunks.len()
            ));
        }
        let mut reached = vec![topo.switches[0].clone()];
        let mut grew = true;
        while grew {
            grew = false;
            for l in &trunks {
                for (x, y) in [(&l.a, &l.b), (&l.b, &l.a)] {
                    if reached.contains(x) && !reached.contains(y) {
                        reached.push(y.clone());
                        grew = true;
                    }
                }
            }
        }
        if reached.len() != topo.switches.len() {
            return Err("the switches are not all connected".into());
        }
        Ok(topo)
    }

    fn is_switch(&self, n: &str) -> bool {
        self.switches.iter().any(|s| s == n)
    }

    fn is_host(&self, n: &str) -> bool {
        self.hosts.iter().any(|h| h == n)
    }
}

fn parse_rate(s: &str) -> Option<u64> {
    let s = s.to_ascii_lowercase();
    let (num, mult) = [
        ("gbit", 1_000_000_000),
        ("mbit", 1_000_000),
        ("kbit", 1_000),
    ]
    .iter()
    .find_map(|(unit, m)| s.strip_suffix(unit).map(|n| (n.to_string(), *m)))?;
    let n: u64 = num.parse().ok()?;
    (n > 0).then_some(n * mult)
}

/// One host of a running testbed.
#[derive(Debug, Clone)]
pub struct Host {
    pub netns: String,
    pub addr: Ipv4Addr,
    /// Its end of its link.
    pub ifname: String,
}

/// One link of a running testbed: a veth pair, `ifname_a` in `netns_a`.
#[derive(Debug, Clone)]
pub struct Veth {
    pub netns_a: String,
    pub ifname_a: String,
    pub netns_b: String,
    pub ifname_b: String,
    pub rate_bps: u64,
}

/// A running testbed; dropping it kills its processes and deletes its
/// namespaces.
pub struct Testbed {
    /// `bspwebtb-<pid>-<n>`: every namespace name starts with it and a `-`.
    prefix: String,
    /// Starts every veth name (they live only inside the namespaces).
    tag: String,
    /// Namespaces created so far, in order.
    namespaces: Vec<String>,
    hosts: BTreeMap<String, Host>,
    pub veths: Vec<Veth>,
    children: Vec<Child>,
}

impl Testbed {
    /// Create every namespace, bridge, veth and shaper of `topo`. If a step
    /// fails, whatever was created is torn down and the error names the
    /// command and its stderr.
    pub fn create(topo: &Topology) -> Result<Testbed, String> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        remove_stale();
        let pid = std::process::id();
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let mut tb = Testbed {
            prefix: format!("{PREFIX}-{pid}-{n}"),
            // 1 + 5 + 1 + up to 3 digits + 1 ≤ 15 characters (IFNAMSIZ - 1).
            tag: format!("t{:05x}", (u64::from(pid) * 64 + n) & 0xf_ffff),
            namespaces: vec![],
            hosts: BTreeMap::new(),
            veths: vec![],
            children: vec![],
        };
        if topo.links.len() > 999 {
            return Err("at most 999 links".into());
        }
        // On error `tb` is dropped, which deletes what exists so far.
        tb.build(topo)
            .map_err(|e| format!("testbed {}: {e}", topo.name))?;
        Ok(tb)
    }

    fn build(&mut self, topo: &Topology) -> Result<(), String> {
        for node in topo.switches.iter().chain(&topo.hosts) {
            let ns = self.netns_name(node);
            run(Command::new("ip").args(["netns", "add", &ns]))?;
            self.namespaces.push(ns.clone());
            run(Command::new("ip").args(["-n", &ns, "link", "set", "lo", "up"]))?;
        }
        for s in &topo.switches {
            let ns = self.netns_name(s);
            run(Command::new("ip")
                .args(["-n", &ns, "link", "add", "br0", "type", "bridge"])
                .args(["stp_state", "0", "forward_delay", "0"]))?;
            run(Command::new("ip").args(["-n", &ns, "link", "set", "br0", "up"]))?;
        }
        for (i, h) in topo.hosts.iter().enumerate() {
            let i = u16::try_from(i).map_err(|_| "too many hosts")?;
            // One /16: 10.99.0.1, 10.99.0.2, ..., 10.99.1.1, ...
            let addr = Ipv4Addr::new(10, 99, (i / 254) as u8, (i % 254 + 1) as u8);
            self.hosts.insert(
                h.clone(),
                Host {
                    netns: self.netns_name(h),
                    addr,
                    ifname: String::new(),
                },
            );
        }
        for (i, l) in topo.links.iter().enumerate() {
            let v = Veth {
                netns_a: self.netns_name(&l.a),
                ifname_a: format!("{}-{i}a", self.tag),
                netns_b: self.netns_name(&l.b),
                ifname_b: format!("{}-{i}b", self.tag),
                rate_bps: l.rate_bps,
            };
            // Both ends are created inside their namespaces: no veth ever
            // appears in the root namespace.
            run(Command::new("ip").args([
                "link",
                "add",
                &v.ifname_a,
                "netns",
                &v.netns_a,
                "type",
                "veth",
                "peer",
                "name",
                &v.ifname_b,
                "netns",
                &v.netns_b,
            ]))?;
            self.veths.push(v.clone());
            for (node, ns, ifname) in [
                (&l.a, &v.netns_a, &v.ifname_a),
                (&l.b, &v.netns_b, &v.ifname_b),
            ] {
                if let Some(host) = self.hosts.get_mut(node) {
                    host.ifname = ifname.clone();
                    let cidr = format!("{}/16", host.addr);
                    run(Command::new("ip").args(["-n", ns, "addr", "add", &cidr, "dev", ifname]))?;
                } else {
                    run(
                        Command::new("ip").args(["-n", ns, "link", "set", ifname, "master", "br0"])
                    )?;
                }
                shape(ns, ifname, l.rate_bps)?;
                run(Command::new("ip").args(["-n", ns, "link", "set", ifname, "up"]))?;
            }
        }
        Ok(())
    }

    /// The namespace of a node (host or switch).
    pub fn netns_name(&self, node: &str) -> String {
        format!("{}-{node}", self.prefix)
    }

    /// `bspwebtb-<pid>-<n>`; every namespace of this testbed is named
    /// `<prefix>-<node>`.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// Every veth name of this testbed starts with it.
    pub fn veth_tag(&self) -> &str {
        &self.tag
    }

    pub fn namespaces(&self) -> &[String] {
        &self.namespaces
    }

    pub fn host(&self, host: &str) -> &Host {
        self.hosts
            .get(host)
            .unwrap_or_else(|| panic!("no host {host} in the testbed"))
    }

    pub fn addr(&self, host: &str) -> IpAddr {
        IpAddr::V4(self.host(host).addr)
    }

    fn netns_file(&self, host: &str) -> Result<File, String> {
        let path = Path::new(NETNS_DIR).join(&self.host(host).netns);
        File::open(&path).map_err(|e| format!("cannot open {}: {e}", path.display()))
    }

    /// Make `cmd` run in `host`'s network namespace.
    fn enter(&self, host: &str, cmd: &mut Command) -> Result<File, String> {
        let ns = self.netns_file(host)?;
        let fd = ns.as_raw_fd();
        // SAFETY: the closure runs in the forked child before exec and only
        // makes one async-signal-safe system call (setns) on `fd`, which
        // stays open until the caller drops the returned `File`, after the
        // spawn.
        unsafe {
            cmd.pre_exec(move || {
                if sys::setns(fd, sys::CLONE_NEWNET) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        Ok(ns)
    }

    /// Run `argv` to its end in `host`'s namespace.
    pub fn exec(&self, host: &str, argv: &[&str]) -> Result<Output, String> {
        let (prog, args) = argv.split_first().ok_or("empty command")?;
        let mut cmd = Command::new(prog);
        cmd.args(args);
        let _ns = self.enter(host, &mut cmd)?;
        cmd.output()
            .map_err(|e| format!("cannot run {argv:?} in {host}: {e}"))
    }

    /// Start `cmd` in `host`'s namespace; the testbed keeps it (see
    /// [`Testbed::child`]) and kills it when dropped. Returns its index.
    pub fn spawn(&mut self, host: &str, mut cmd: Command) -> Result<usize, String> {
        let _ns = self.enter(host, &mut cmd)?;
        let child = cmd
            .spawn()
            .map_err(|e| format!("cannot start {cmd:?} in {host}: {e}"))?;
        self.children.push(child);
        Ok(self.children.len() - 1)
    }

    pub fn child(&mut self, index: usize) -> &mut Child {
        &mut self.children[index]
    }

    /// The pids of the processes [`Testbed::spawn`] started.
    pub fn child_pids(&self) -> Vec<u32> {
        self.children.iter().map(Child::id).collect()
    }

    /// Run `f` on a new thread inside `host`'s network namespace (sockets it
    /// opens live there); join it with [`std::thread::JoinHandle::join`]
    /// before the testbed is dropped, or the namespace outlives its name.
    pub fn thread_in<T: Send + 'static>(
        &self,
        host: &str,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> Result<std::thread::JoinHandle<T>, String> {
        let ns = self.netns_file(host)?;
        let (tx, rx) = std::sync::mpsc::channel();
        let handle = std::thread::spawn(move || {
            // SAFETY: setns only changes this thread's network namespace;
            // `ns` is an open namespace file for the whole call.
            let rc = unsafe { sys::setns(ns.as_raw_fd(), sys::CLONE_NEWNET) };
            let entered = if rc == 0 {
                Ok(())
            } else {
                Err(std::io::Error::last_os_error().to_string())
            };
            drop(ns);
            let ok = entered.is_ok();
            let _ = tx.send(entered);
            if !ok {
                panic!("setns failed");
            }
            f()
        });
        match rx.recv() {
            Ok(Ok(())) => Ok(handle),
            Ok(Err(e)) => {
                let _ = handle.join();
                Err(format!("setns into {host}: {e}"))
            }
            Err(_) => Err("the namespace thread died".into()),
        }
    }

    /// Join `hosts` by a second network of their own, beside the topology:
    /// a switch namespace `<prefix>-<name>` holding a bridge, one veth per
    /// host shaped to `rate_bps` in both directions, and host `k` at
    /// `10.98.<subnet>.<k + 1>/24`. A host then reaches the others' LAN
    /// addresses over it and everything else over its topology link: a
    /// cluster with a fast local interconnect and a wide-area NIC per node
    /// (den Burger and Kielmann's emulation, §4.1). `.topo` files cannot
    /// describe it (`scripts/testbed` does not know it); the LAN goes with
    /// the testbed. Returns the hosts' LAN addresses, in order.
    // Used by `benches/broadcast.rs` (which includes this file), not by the tests.
    #[allow(dead_code)]
    pub fn add_lan(
        &mut self,
        name: &str,
        subnet: u8,
        hosts: &[&str],
        rate_bps: u64,
    ) -> Result<Vec<Ipv4Addr>, String> {
        let ns = self.netns_name(name);
        if self.namespaces.contains(&ns) {
            return Err(format!(
                "the testbed already has a node or LAN named {name}"
            ));
        }
        if hosts.len() > 99 || rate_bps == 0 {
            return Err("a LAN has 1-99 hosts and a positive rate".into());
        }
        run(Command::new("ip").args(["netns", "add", &ns]))?;
        self.namespaces.push(ns.clone());
        run(Command::new("ip").args(["-n", &ns, "link", "set", "lo", "up"]))?;
        run(Command::new("ip")
            .args(["-n", &ns, "link", "add", "br0", "type", "bridge"])
            .args(["stp_state", "0", "forward_delay", "0"]))?;
        run(Command::new("ip").args(["-n", &ns, "link", "set", "br0", "up"]))?;
        let mut addrs = Vec::with_capacity(hosts.len());
        for (k, h) in hosts.iter().enumerate() {
            let host_ns = self.host(h).netns.clone();
            let addr = Ipv4Addr::new(10, 98, subnet, k as u8 + 1);
            // `t12345-L<subnet>-<k>a`: at most 15 characters, and never a
            // topology link's name (`t12345-<i>a`).
            let (a, b) = (
                format!("{}-L{subnet}-{k}a", self.tag),
                format!("{}-L{subnet}-{k}b", self.tag),
            );
            if a.len() > 15 {
                return Err(format!("interface name {a} is too long"));
            }
            run(Command::new("ip").args([
                "link", "add", &a, "netns", &host_ns, "type", "veth", "peer", "name", &b, "netns",
                &ns,
            ]))?;
            let cidr = format!("{addr}/24");
            run(Command::new("ip").args(["-n", &host_ns, "addr", "add", &cidr, "dev", &a]))?;
            run(Command::new("ip").args(["-n", &ns, "link", "set", &b, "master", "br0"]))?;
            shape(&host_ns, &a, rate_bps)?;
            shape(&ns, &b, rate_bps)?;
            run(Command::new("ip").args(["-n", &host_ns, "link", "set", &a, "up"]))?;
            run(Command::new("ip").args(["-n", &ns, "link", "set", &b, "up"]))?;
            addrs.push(addr);
        }
        Ok(addrs)
    }
}

impl Drop for Testbed {
    fn drop(&mut self) {
        // Last started first: peers before their supernode.
        for c in self.children.iter_mut().rev() {
            let _ = c.kill();
            let _ = c.wait();
        }
        // Whatever else runs in a namespace (grandchildren) keeps it, and so
        // its veths, alive after `ip netns del`.
        let namespaces = std::mem::take(&mut self.namespaces);
        if let Err(e) = delete_namespaces(&namespaces) {
            eprintln!("testbed {}: {e}", self.prefix);
        }
    }
}

/// Kill every process in `namespaces`, wait for them to be gone, then
/// delete the namespaces.
fn delete_namespaces(namespaces: &[String]) -> Result<(), String> {
    let me = std::process::id().to_string();
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut errors = vec![];
    loop {
        let mut pids = vec![];
        for ns in namespaces {
            if let Ok(out) = run(Command::new("ip").args(["netns", "pids", ns])) {
                pids.extend(
                    out.split_whitespace()
                        .filter(|p| *p != me)
                        .map(String::from),
                );
            }
        }
        if pids.is_empty() {
            break;
        }
        if Instant::now() >= deadline {
            errors.push(format!("processes {pids:?} did not die"));
            break;
        }
        let _ = Command::new("kill")
            .arg("-KILL")
            .args(&pids)
            .stderr(Stdio::null())
            .status();
        std::thread::sleep(Duration::from_millis(20));
    }
    for ns in namespaces.iter().rev() {
        if let Err(e) = run(Command::new("ip").args(["netns", "del", ns])) {
            errors.push(e);
        }
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors.join("; "))
    }
}

/// Delete the namespaces of testbeds whose process is gone (a run killed
/// with SIGKILL or Ctrl-C cannot clean up after itself).
fn remove_stale() {
    let Ok(list) = run(Command::new("ip").args(["netns", "list"])) else {
        return;
    };
    let stale: Vec<String> = list
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|ns| {
            let Some(rest) = ns.strip_prefix(PREFIX).and_then(|r| r.strip_prefix('-')) else {
                return false;
            };
            let pid = rest.split('-').next().unwrap_or("");
            pid.parse::<u32>()
                .is_ok_and(|p| !Path::new(&format!("/proc/{p}")).exists())
        })
        .map(String::from)
        .collect();
    if !stale.is_empty() {
        eprintln!("testbed: removing stale namespaces {stale:?}");
        let _ = delete_namespaces(&stale);
    }
}

/// Shape the egress of `ifname` to `rate_bps`.
fn shape(ns: &str, ifname: &str, rate_bps: u64) -> Result<(), String> {
    // At least 10 ms worth of bytes (more than one timer tick) and a few
    // full-size packets; a queue of 100 ms.
    let burst = (rate_bps / 8 / 100).max(32 * 1024);
    run(Command::new("tc")
        .args(["-n", ns, "qdisc", "add", "dev", ifname, "root", "tbf"])
        .args([
            "rate",
            &format!("{rate_bps}bit"),
            "burst",
            &burst.to_string(),
            "latency",
            "100ms",
        ]))
    .map(|_| ())
}

/// Run a command to its end; its stdout, or an error naming the command and
/// its stderr.
fn run(cmd: &mut Command) -> Result<String, String> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run {cmd:?}: {e} (is iproute2 installed?)"))?;
    if !out.status.success() {
        return Err(format!(
            "{cmd:?} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

// ---------------------------------------------------------------------------
// Tests

/// What a testbed leaves behind, checked after it is gone.
pub struct Leftovers {
    prefix: String,
    tag: String,
    pub pids: Vec<u32>,
}

impl Leftovers {
    pub fn of(tb: &Testbed) -> Leftovers {
        Leftovers {
            prefix: tb.prefix().to_string(),
            tag: tb.veth_tag().to_string(),
            pids: vec![],
        }
    }

    #[track_caller]
    pub fn assert_none(&self) {
        let list = run(Command::new("ip").args(["netns", "list"])).unwrap();
        let mine = format!("{}-", self.prefix);
        let left: Vec<&str> = list.lines().filter(|l| l.starts_with(&mine)).collect();
        assert!(left.is_empty(), "namespaces left behind: {left:?}");
        assert!(
            std::fs::read_dir(NETNS_DIR)
                .map(|d| d
                    .flatten()
                    .all(|e| !e.file_name().to_string_lossy().starts_with(&mine)))
                .unwrap_or(true),
            "namespace files left in {NETNS_DIR}"
        );
        let links = run(Command::new("ip").args(["-o", "link", "show"])).unwrap();
        let left: Vec<&str> = links.lines().filter(|l| l.contains(&self.tag)).collect();
        assert!(
            left.is_empty(),
            "veths left in the root namespace: {left:?}"
        );
        let veths = run(Command::new("ip").args(["-o", "link", "show", "type", "veth"])).unwrap();
        assert!(
            !veths.contains(&self.tag),
            "veths left in the root namespace: {veths}"
        );
        for pid in &self.pids {
            // Gone, or a zombie (its namespaces are released at exit) that
            // the init process has not reaped yet.
            if let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) {
                let state = stat.rsplit(')').next().unwrap_or("").trim_start();
                assert!(
                    state.starts_with('Z') || state.starts_with('X'),
                    "process {pid} is still running: {stat}"
                );
            }
        }
    }
}

/// The number of namespaces named `<prefix>-…` right now.
fn count_namespaces(prefix: &str) -> usize {
    let list = run(Command::new("ip").args(["netns", "list"])).unwrap();
    list.lines()
        .filter(|l| l.starts_with(&format!("{prefix}-")))
        .count()
}

/// Start `sleep 1000` in `host` and, through a shell that exits at once, a
/// second one the testbed did not start itself (a grandchild); their pids.
fn start_sleepers(tb: &mut Testbed, host: &str) -> Vec<u32> {
    let mut sleep = Command::new("sleep");
    sleep.arg("1000");
    let i = tb.spawn(host, sleep).unwrap();
    let child = tb.child(i).id();
    let out = tb
        .exec(
            host,
            &[
                "sh",
                "-c",
                "sleep 1000 >/dev/null 2>&1 </dev/null & echo $!",
            ],
        )
        .unwrap();
    let grandchild: u32 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
    vec![child, grandchild]
}

/// Connect from `from` to a listener in `to`; one message each way.
fn assert_reachable(tb: &Testbed, from: &str, to: &str) {
    let addr = SocketAddr::new(tb.addr(to), 7000);
    let server = tb
        .thread_in(to, move || {
            let mut s = accept_one(addr);
            let mut buf = [0u8; 4];
            s.read_exact(&mut buf).unwrap();
            s.write_all(b"pong").unwrap();
            buf
        })
        .unwrap();
    let client = tb
        .thread_in(from, move || {
            let mut s = connect_retrying(addr);
            s.write_all(b"ping").unwrap();
            let mut buf = [0u8; 4];
            s.read_exact(&mut buf).unwrap();
            buf
        })
        .unwrap();
    assert_eq!(&client.join().unwrap(), b"pong", "{from} -> {to}");
    assert_eq!(&server.join().unwrap(), b"ping", "{from} -> {to}");
}

/// Accept one connection within 10 s (so that a thread of a failed test
/// does not keep a namespace alive), with 30 s read timeouts.
fn accept_one(addr: SocketAddr) -> TcpStream {
    let l = TcpListener::bind(addr).unwrap();
    l.set_nonblocking(true).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match l.accept() {
            Ok((s, _)) => {
                s.set_nonblocking(false).unwrap();
                s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
                return s;
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                assert!(Instant::now() < deadline, "nobody connected to {addr}");
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(e) => panic!("accept on {addr}: {e}"),
        }
    }
}

/// Connect, retrying while the listener is not bound yet (for at most 10 s).
fn connect_retrying(addr: SocketAddr) -> TcpStream {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match TcpStream::connect_timeout(&addr, Duration::from_secs(5)) {
            Ok(s) => return s,
            Err(e) if Instant::now() < deadline => {
                let _ = e;
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => panic!("connect to {addr}: {e}"),
        }
    }
}

#[test]
fn every_topology_comes_up_and_leaves_nothing_behind() {
    for name in ["flat", "clusters", "hetero", "large"] {
        let topo = Topology::load(name).unwrap();
        let mut tb = Testbed::create(&topo).unwrap();
        let mut left = Leftovers::of(&tb);
        assert_eq!(
            count_namespaces(tb.prefix()),
            topo.hosts.len() + topo.switches.len(),
            "{name}"
        );
        assert_eq!(count_namespaces(tb.prefix()), tb.namespaces().len());
        // The first host reaches the last one through the bridges.
        let (first, last) = (&topo.hosts[0], topo.hosts.last().unwrap());
        assert_reachable(&tb, first, last);
        // Both ends of every link are shaped.
        for v in &tb.veths {
            for (ns, dev) in [(&v.netns_a, &v.ifname_a), (&v.netns_b, &v.ifname_b)] {
                let q =
                    run(Command::new("tc").args(["-n", ns, "qdisc", "show", "dev", dev])).unwrap();
                let rate = match v.rate_bps {
                    r if r % 1_000_000_000 == 0 => format!("rate {}Gbit", r / 1_000_000_000),
                    r => format!("rate {}Mbit", r / 1_000_000),
                };
                assert!(
                    q.contains("tbf") && q.contains(&rate),
                    "{name}: {dev} in {ns} is not shaped to {rate}: {q}"
                );
            }
        }
        // A process still running when the testbed goes.
        left.pids = start_sleepers(&mut tb, last);
        drop(tb);
        left.assert_none();
    }
}

#[test]
fn a_panicking_test_leaves_nothing_behind() {
    let left = std::sync::Mutex::new(None);
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let topo = Topology::load("clusters").unwrap();
        let mut tb = Testbed::create(&topo).unwrap();
        let mut l = Leftovers::of(&tb);
        l.pids = start_sleepers(&mut tb, "b2");
        *left.lock().unwrap() = Some(l);
        panic!("on purpose, with the testbed up");
    }));
    assert!(result.is_err());
    left.into_inner()
        .unwrap()
        .expect("the testbed was created")
        .assert_none();
}

#[test]
fn a_failing_creation_leaves_nothing_behind() {
    // The second link names a node that has no namespace: `ip link add`
    // fails after every namespace and the first veth exist.
    let text = "switch failsw\nhost failh0\nhost failh1\nlink failh0 failsw 100mbit\nlink failh1 failsw 100mbit\n";
    let mut topo = Topology::parse("broken", text).unwrap();
    topo.links[1].b = "failghost".into();
    let err = match Testbed::create(&topo) {
        Ok(_) => panic!("a testbed with a link to nowhere came up"),
        Err(e) => e,
    };
    assert!(
        err.contains("\"link\" \"add\"") && err.contains("failghost") && err.contains("failed"),
        "{err}"
    );
    let mine = format!("{PREFIX}-{}-", std::process::id());
    let list = run(Command::new("ip").args(["netns", "list"])).unwrap();
    let left: Vec<&str> = list
        .lines()
        .filter(|l| l.starts_with(&mine) && l.contains("-fail"))
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");
    let links = run(Command::new("ip").args(["-o", "link", "show"])).unwrap();
    assert!(!links.contains("-0a") && !links.contains("-0b"), "{links}");
}

#[test]
fn topologies_are_validated() {
    for (text, why) in [
        ("switch s\nhost h\n", "exactly one"),
        (
            "switch s\nhost h\nhost g\nlink h g 1mbit\n",
            "not to each other",
        ),
        ("switch s\nswitch t\nhost h\nlink h s 1mbit\n", "tree"),
        ("switch s\nhost h\nlink h s fast\n", "bad rate"),
        ("host h\nlink h s 1mbit\n", "unknown node"),
    ] {
        let err = Topology::parse("t", text).unwrap_err();
        assert!(err.contains(why), "{text:?}: {err}");
    }
}

/// Send `bytes` over TCP from `from` to `to`; the rate the receiver saw, in
/// bits per second, from its first byte to the last.
fn throughput(tb: &Testbed, from: &str, to: &str, bytes: usize) -> f64 {
    let addr = SocketAddr::new(tb.addr(to), 7001);
    let receiver = tb
        .thread_in(to, move || {
            let mut s = accept_one(addr);
            let mut buf = vec![0u8; 64 * 1024];
            let mut got = s.read(&mut buf).unwrap();
            let start = Instant::now();
            let mut after_first = 0;
            loop {
                let n = s.read(&mut buf).unwrap();
                if n == 0 {
                    break;
                }
                got += n;
                after_first += n;
            }
            (got, after_first, start.elapsed())
        })
        .unwrap();
    let sender = tb
        .thread_in(from, move || {
            let mut s = connect_retrying(addr);
            let chunk = vec![7u8; 64 * 1024];
            let mut left = bytes;
            while left > 0 {
                let n = left.min(chunk.len());
                s.write_all(&chunk[..n]).unwrap();
                left -= n;
            }
            s.shutdown(std::net::Shutdown::Write).unwrap();
        })
        .unwrap();
    sender.join().unwrap();
    let (got, after_first, elapsed) = receiver.join().unwrap();
    assert_eq!(got, bytes);
    after_first as f64 * 8.0 / elapsed.as_secs_f64()
}

#[test]
fn links_are_shaped_to_their_rate() {
    // a0 -> b0 crosses the two 20 Mbit/s gateway links (and 100 Mbit/s
    // access links).
    let tb = Testbed::create(&Topology::load("clusters").unwrap()).unwrap();
    let left = Leftovers::of(&tb);
    let rate = throughput(&tb, "a0", "b0", 5_000_000);
    eprintln!("clusters a0 -> b0: {:.1} Mbit/s (gateway 20)", rate / 1e6);
    // Within a cluster only the 100 Mbit/s access links count.
    let local = throughput(&tb, "a1", "a2", 20_000_000);
    eprintln!("clusters a1 -> a2: {:.1} Mbit/s (access 100)", local / 1e6);
    drop(tb);
    left.assert_none();
    assert!(
        (10e6..=22e6).contains(&rate),
        "{:.1} Mbit/s through a 20 Mbit/s link",
        rate / 1e6
    );
    assert!(
        (50e6..=110e6).contains(&local),
        "{:.1} Mbit/s through 100 Mbit/s links",
        local / 1e6
    );

    // A 10 Mbit/s access link, in both directions.
    let tb = Testbed::create(&Topology::load("hetero").unwrap()).unwrap();
    let left = Leftovers::of(&tb);
    let up = throughput(&tb, "slow0", "lan0", 2_500_000);
    let down = throughput(&tb, "lan0", "slow0", 2_500_000);
    eprintln!(
        "hetero slow0 -> lan0: {:.1}, lan0 -> slow0: {:.1} Mbit/s (access 10)",
        up / 1e6,
        down / 1e6
    );
    drop(tb);
    left.assert_none();
    for r in [up, down] {
        assert!(
            (5e6..=11e6).contains(&r),
            "{:.1} Mbit/s through a 10 Mbit/s link",
            r / 1e6
        );
    }
}
