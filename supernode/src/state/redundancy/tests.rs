//! Result validation by redundancy on a real (temporary) database:
//! placement under the twin rule, output gating, and the judging of
//! disagreements.

use bsp_api::control::{JobAssignment, PeerEvent, Stream};

use super::*;
use crate::twins::Party;
use crate::{Config, Supernode};

/// A supernode whose database holds peers `1..=n`, peer `i` enrolled by
/// volunteer `vols[i - 1]` (accounts 1, 2, …), and job 1 of owner 100
/// waiting with `nprocs` processes and redundancy 2.
struct World {
    _dir: tempfile::TempDir,
    sn: Supernode,
}

const JOB: JobId = 1;

fn world(vols: &[i64], nprocs: u32) -> World {
    let dir = tempfile::tempdir().unwrap();
    {
        let conn = crate::db::open_sqlite(&dir.path().join("bspweb.sqlite3")).unwrap();
        conn.execute(
            "INSERT INTO users (id, name, password_hash, created_at) VALUES (100, 'owner', 'x', 0)",
            [],
        )
        .unwrap();
        for &v in vols.iter().collect::<BTreeSet<_>>() {
            conn.execute(
                "INSERT INTO users (id, name, password_hash, created_at, role) \
                 VALUES (?1, ?2, 'x', 0, 'volunteer')",
                params![v, format!("v{v}")],
            )
            .unwrap();
            conn.execute(
                "INSERT INTO enrollments (id, owner, name, secret_hash, created_at) \
                 VALUES (?1, ?1, 'e', x'00', 0)",
                [v],
            )
            .unwrap();
        }
        for (i, &v) in vols.iter().enumerate() {
            let id = i as i64 + 1;
            conn.execute(
                "INSERT INTO peers (id, name, addr, speed, idle, cores, lease_id, \
                     lease_expires_at, state, first_seen, last_seen, enrollment) \
                 VALUES (?1, ?2, ?3, 1.0, 1.0, 4, 'l', ?4, 'online', 0, 0, ?5)",
                params![
                    id,
                    format!("peer{id}"),
                    format!("127.0.0.1:{}", 9000 + id),
                    i64::MAX / 2,
                    v
                ],
            )
            .unwrap();
        }
        conn.execute(
            "INSERT INTO programs (hash, bytes, size, created_at) VALUES (?1, x'00', 1, 0)",
            ["0".repeat(64)],
        )
        .unwrap();
        conn.execute(
            "INSERT INTO jobs (id, owner, program, program_hash, nprocs, args, seed, \
                 superstep_ms, memory_mib, output_mib, state, submitted_at, redundancy) \
             VALUES (?1, 100, 'p', ?2, ?3, 'null', 0, 1000, 64, 1, 'waiting', 0, 2)",
            params![JOB, "0".repeat(64), nprocs],
        )
        .unwrap();
    }
    let sn = Supernode::open(Config {
        data_dir: dir.path().to_path_buf(),
        ..Config::default()
    })
    .unwrap();
    World { _dir: dir, sn }
}

impl World {
    fn run<T>(&self, f: impl FnOnce(&mut Core, &Inner, &mut Effects) -> T) -> (T, Effects) {
        let inner = &self.sn.inner;
        let mut core = inner.lock_core();
        let mut fx = Effects::default();
        let out = f(&mut core, inner, &mut fx);
        (out, fx)
    }

    fn placed(&self) -> World2<'_> {
        let (n, _) = self.run(|c, i, fx| c.schedule(i, fx, crate::now_ms()).unwrap());
        assert_eq!(n, 1, "the job is placed");
        World2 { w: self }
    }

    fn assignment(&self) -> JobAssignment {
        self.run(|c, _, _| epoch::assignment(&c.conn, JOB, Vec::new(), Vec::new()).unwrap())
            .0
    }

    fn report(&self, peer: PeerId, events: Vec<PeerEvent>) -> Effects {
        let (r, fx) = self.run(|c, i, fx| c.report(i, fx, peer, events, crate::now_ms()));
        r.unwrap();
        fx
    }

    fn query<T: crate::sql::FromSql>(&self, sql: &str) -> T {
        self.run(|c, _, _| c.conn.query_row(sql, [], |r| r.get(0)).unwrap())
            .0
    }

    /// The kinds of job 1's events, in order.
    fn kinds(&self) -> Vec<JobEventKind> {
        self.run(|c, _, _| crate::db::events_after(&c.conn, JOB, 0, 10_000).unwrap())
            .0
            .into_iter()
            .map(|e| e.kind)
            .collect()
    }

    fn count(&self, name: &str) -> usize {
        self.kinds().iter().filter(|k| k.name() == name).count()
    }
}

/// A world whose job is placed.
struct World2<'a> {
    w: &'a World,
}

impl World2<'_> {
    /// The hosts of copy 0 and copy 1 of `pid`.
    fn hosts(&self, pid: Pid) -> (PeerId, PeerId) {
        let a = self.w.assignment();
        let n = a.nprocs as usize;
        let host = |slot: usize| a.peers[a.placement[slot] as usize].id;
        (host(pid as usize), host(n + pid as usize))
    }
}

fn volunteer_of(w: &World, peer: PeerId) -> Party {
    w.run(|c, _, _| Volunteers::load(&c.conn, [peer]).unwrap().of(peer))
        .0
}

/// Every pid's copies are on peers of different volunteers, and every
/// slot is placed.
fn assert_twins_apart(w: &World) {
    let a = w.assignment();
    let n = a.nprocs as usize;
    assert_eq!(a.placement.len(), 2 * n);
    assert_eq!(a.limits.redundancy, 2);
    for pid in 0..n {
        let p0 = a.peers[a.placement[pid] as usize].id;
        let p1 = a.peers[a.placement[n + pid] as usize].id;
        assert_ne!(p0, p1, "pid {pid}");
        assert_ne!(volunteer_of(w, p0), volunteer_of(w, p1), "pid {pid}");
    }
}

fn output(pid: Pid, seq: u64, text: &str) -> PeerEvent {
    PeerEvent::Output {
        job: JOB,
        pid,
        seq,
        stream: Stream::Stdout,
        data: text.into(),
    }
}

fn disagreement(pid: Pid, superstep: u32, groups: Vec<Vec<PeerId>>) -> PeerEvent {
    PeerEvent::Disagreement {
        job: JOB,
        pid,
        superstep,
        groups,
        what: "message 0 to pid 1".into(),
    }
}

/// The `StartJob` assignments queued in `fx`.
fn started(fx: &Effects) -> Vec<JobAssignment> {
    fx.commands
        .iter()
        .filter_map(|(_, c)| match &c.command {
            bsp_api::control::Command::StartJob(a) => Some(a.clone()),
            _ => None,
        })
        .collect()
}

#[test]
fn copies_are_placed_on_peers_of_different_volunteers() {
    let w = world(&[1, 1, 1, 2, 3, 3], 7);
    let _ = w.placed();
    assert_twins_apart(&w);
    let rows: i64 = w.query("SELECT count(*) FROM placements WHERE job = 1");
    assert_eq!(rows, 14, "a row per slot");
    let text = w
        .kinds()
        .into_iter()
        .find_map(|k| match k {
            JobEventKind::Status { text } if text.starts_with("placed") => Some(text),
            _ => None,
        })
        .unwrap();
    assert!(text.contains("7 processes × 2 copies"), "{text}");
}

#[test]
fn a_job_waits_for_peers_of_two_volunteers_and_says_so_once() {
    let w = world(&[1, 1, 1], 2);
    for _ in 0..3 {
        let (n, _) = w.run(|c, i, fx| c.schedule(i, fx, crate::now_ms()).unwrap());
        assert_eq!(n, 0);
    }
    let waits: Vec<String> = w
        .kinds()
        .into_iter()
        .filter_map(|k| match k {
            JobEventKind::Status { text } => Some(text),
            _ => None,
        })
        .collect();
    assert_eq!(waits.len(), 1, "{waits:?}");
    assert!(
        waits[0].contains("waiting for volunteers") && waits[0].contains("belong to 1"),
        "{waits:?}"
    );
    let state: String = w.query("SELECT state FROM jobs WHERE id = 1");
    assert_eq!(state, "waiting");
}

#[test]
fn output_is_published_once_two_volunteers_copies_agree() {
    let w = world(&[1, 2, 3], 2);
    let p = w.placed();
    let (a, b) = p.hosts(0);
    w.report(a, vec![output(0, 0, "hello\n")]);
    assert_eq!(w.count("stdout"), 0, "held until the other copy agrees");
    let held: i64 = w.query("SELECT count(*) FROM held_copies");
    assert_eq!(held, 1);
    // The same peer again (a retried report) is no quorum.
    w.report(a, vec![output(0, 0, "hello\n")]);
    assert_eq!(w.count("stdout"), 0);
    w.report(b, vec![output(0, 0, "hello\n")]);
    assert_eq!(
        w.kinds()
            .iter()
            .filter(|k| **k
                == JobEventKind::Stdout {
                    text: "hello\n".into()
                })
            .count(),
        1
    );
    let held: i64 = w.query("SELECT count(*) FROM held_copies");
    assert_eq!(held, 0, "nothing held once published");
    // A late copy of a published record changes nothing.
    w.report(a, vec![output(0, 0, "hello\n")]);
    assert_eq!(w.count("stdout"), 1);
    // A peer that hosts no copy of the pid is not heard.
    let outsider = (1..=3).find(|&x| x != a && x != b).unwrap();
    w.report(outsider, vec![output(0, 1, "x")]);
    let held: i64 = w.query("SELECT count(*) FROM held_copies");
    assert_eq!(held, 0);
}

#[test]
fn differing_output_copies_are_a_disagreement_and_start_a_third_run() {
    let w = world(&[1, 2, 3], 2);
    let p = w.placed();
    let (a, b) = p.hosts(0);
    let epoch_before: i64 = w.query("SELECT epoch FROM jobs WHERE id = 1");
    w.report(a, vec![output(0, 3, "right\n")]);
    let fx = w.report(b, vec![output(0, 3, "wrong\n")]);
    assert_eq!(w.count("stdout"), 0, "neither version is published");
    let told: Vec<JobEventKind> = w
        .kinds()
        .into_iter()
        .filter(|k| k.name() == "copies_disagree")
        .collect();
    assert_eq!(told.len(), 1);
    match &told[0] {
        JobEventKind::CopiesDisagree { peers, what, .. } => {
            assert!(peers.contains(&a) && peers.contains(&b));
            assert_eq!(what, "output record 3");
        }
        other => panic!("{other:?}"),
    }
    let epoch_after: i64 = w.query("SELECT epoch FROM jobs WHERE id = 1");
    assert_eq!(epoch_after, epoch_before + 1, "a third run's epoch");
    let starts = started(&fx);
    assert!(!starts.is_empty());
    assert!(starts.iter().all(|s| s.restore == vec![0]));
    let (a2, t) = p.hosts(0);
    assert_eq!(a2, a, "copy 0 stays");
    assert!(t != a && t != b);
    assert_ne!(volunteer_of(&w, t), volunteer_of(&w, a));
    assert_ne!(volunteer_of(&w, t), volunteer_of(&w, b));
    // The third run agrees with copy 0: that version is published, and
    // the peer of the other one is quarantined.
    w.report(t, vec![output(0, 3, "right\n")]);
    assert_eq!(
        w.kinds()
            .iter()
            .filter(|k| **k
                == JobEventKind::Stdout {
                    text: "right\n".into()
                })
            .count(),
        1
    );
    assert_eq!(w.count("peer_quarantined"), 1);
    let q: Option<i64> = w.query(&format!("SELECT quarantined_at FROM peers WHERE id = {b}"));
    assert!(q.is_some());
}

#[test]
fn differing_exits_are_held_and_agreeing_ones_end_the_job() {
    let w = world(&[1, 2, 3], 1);
    let p = w.placed();
    let (a, b) = p.hosts(0);
    let exit = |s| PeerEvent::ProcessExited {
        job: JOB,
        pid: 0,
        superstep: s,
    };
    w.report(a, vec![exit(4)]);
    assert_eq!(w.count("process_exited"), 0);
    let state: String = w.query("SELECT state FROM jobs WHERE id = 1");
    assert_eq!(state, "active", "one copy's exit is not the process's");
    w.report(b, vec![exit(4)]);
    assert_eq!(w.count("process_exited"), 1);
    assert_eq!(w.count("job_exited"), 1);
}

#[test]
fn a_job_whose_copies_never_matched_a_record_fails_instead_of_exiting() {
    let w = world(&[1, 2, 3], 1);
    let p = w.placed();
    let (a, b) = p.hosts(0);
    let exit = |s| PeerEvent::ProcessExited {
        job: JOB,
        pid: 0,
        superstep: s,
    };
    // Copy 0 printed a record copy 1 never delivered (a copy restored from
    // a later checkpoint does not print it again).
    w.report(a, vec![output(0, 0, "only once\n"), exit(4)]);
    w.report(b, vec![exit(4)]);
    assert_eq!(w.count("stdout"), 0);
    assert_eq!(w.count("job_exited"), 0);
    assert_eq!(w.count("job_failed"), 1);
    let error: Option<String> = w.query("SELECT error FROM jobs WHERE id = 1");
    let error = error.unwrap_or_default();
    assert!(
        error.contains("output record 0") && error.contains("incomplete"),
        "{error}"
    );
}

#[test]
fn an_outvoted_peer_is_quarantined_once_and_its_share_restored() {
    let w = world(&[1, 2, 3, 3], 3);
    let p = w.placed();
    let (a, b) = p.hosts(1);
    // A third peer that agrees with `a`: one of another volunteer that
    // was ever a peer of the job.
    let t = (1..=4)
        .find(|&x| {
            volunteer_of(&w, x) != volunteer_of(&w, a) && volunteer_of(&w, x) != volunteer_of(&w, b)
        })
        .unwrap();
    w.run(|c, _, _| {
        c.conn
            .execute(
                "INSERT INTO job_peer_history (job, peer_id) VALUES (1, ?1) ON CONFLICT DO NOTHING",
                [t],
            )
            .unwrap()
    });
    let epoch_before: i64 = w.query("SELECT epoch FROM jobs WHERE id = 1");
    let fx = w.report(a, vec![disagreement(1, 5, vec![vec![a, t], vec![b]])]);
    assert!(fx.forget_peers.contains(&b), "its lease ends");
    // Reported again (by another peer, too): still one quarantine.
    w.report(t, vec![disagreement(1, 5, vec![vec![a, t], vec![b]])]);
    let events: Vec<JobEventKind> = w
        .kinds()
        .into_iter()
        .filter(|k| k.name() == "peer_quarantined")
        .collect();
    assert_eq!(events.len(), 1, "{events:?}");
    match &events[0] {
        JobEventKind::PeerQuarantined {
            peer,
            superstep,
            reason,
        } => {
            assert_eq!((*peer, *superstep), (b, 5));
            assert!(
                reason.contains("pid 1") && reason.contains("superstep 5"),
                "{reason}"
            );
            assert!(reason.contains("message 0 to pid 1"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
    let (state, disabled): (String, bool) = w
        .run(|c, _, _| {
            c.conn
                .query_row(
                    "SELECT state, disabled FROM peers WHERE id = ?1",
                    [b],
                    |r| Ok((r.get(0)?, r.get(1)?)),
                )
                .unwrap()
        })
        .0;
    assert_eq!((state.as_str(), disabled), ("gone", true));
    let on_b: i64 = w.query(&format!(
        "SELECT count(*) FROM placements WHERE job = 1 AND peer_id = {b}"
    ));
    assert_eq!(on_b, 0, "everything it hosted runs elsewhere");
    let epoch_after: i64 = w.query("SELECT epoch FROM jobs WHERE id = 1");
    assert!(epoch_after > epoch_before);
    assert_twins_apart(&w);
    // The peer list shows it disabled; its volunteer may not enable it,
    // an administrator may (and that lifts the quarantine).
    let listed = w.run(|c, _, _| c.peers().unwrap()).0;
    assert!(listed.iter().any(|p| p.id == b && p.disabled));
    let vol = match volunteer_of(&w, b) {
        Party::Volunteer(v) => v,
        Party::Peer(_) => unreachable!(),
    };
    let (r, _) = w.run(|c, i, fx| {
        c.set_peer_disabled(
            i,
            fx,
            Caller {
                id: vol,
                admin: false,
            },
            b,
            false,
            now_ms(),
        )
    });
    assert!(matches!(r, Err(Error::Forbidden(_))), "{r:?}");
    let (r, _) = w.run(|c, i, fx| {
        c.set_peer_disabled(
            i,
            fx,
            Caller {
                id: 100,
                admin: true,
            },
            b,
            false,
            now_ms(),
        )
    });
    assert!(!r.unwrap().disabled);
    let q: Option<i64> = w.query(&format!("SELECT quarantined_at FROM peers WHERE id = {b}"));
    assert_eq!(q, None);
}

#[test]
fn no_quorum_starts_one_third_run_on_a_third_volunteer() {
    let w = world(&[1, 2, 3], 2);
    let p = w.placed();
    let (a, b) = p.hosts(1);
    let fx = w.report(a, vec![disagreement(1, 2, vec![vec![a], vec![b]])]);
    assert_eq!(w.count("copies_disagree"), 1);
    let starts = started(&fx);
    assert!(!starts.is_empty() && starts.iter().all(|s| s.restore == vec![1]));
    let (a2, t) = p.hosts(1);
    assert_eq!(a2, a);
    let third = [volunteer_of(&w, a), volunteer_of(&w, b)];
    assert!(!third.contains(&volunteer_of(&w, t)));
    let epoch: i64 = w.query("SELECT epoch FROM jobs WHERE id = 1");
    // Reported again, by the other copy's peer: told once, no new epoch
    // (the third run is under way).
    let fx = w.report(b, vec![disagreement(1, 2, vec![vec![b], vec![a]])]);
    assert!(started(&fx).is_empty());
    assert_eq!(w.count("copies_disagree"), 1);
    let again: i64 = w.query("SELECT epoch FROM jobs WHERE id = 1");
    assert_eq!(again, epoch);
}

#[test]
fn no_third_volunteer_fails_the_job_saying_why() {
    let w = world(&[1, 2], 2);
    let p = w.placed();
    let (a, b) = p.hosts(0);
    w.report(b, vec![disagreement(0, 7, vec![vec![a], vec![b]])]);
    let state: String = w.query("SELECT state FROM jobs WHERE id = 1");
    assert_eq!(state, "finished");
    let reason: String = w.query("SELECT error FROM jobs WHERE id = 1");
    assert!(
        reason.contains("copies of pid 0 disagree at superstep 7")
            && reason.contains("no peer of a third volunteer is online to decide"),
        "{reason}"
    );
}

#[test]
fn malformed_disagreements_are_ignored() {
    let w = world(&[1, 2, 3], 2);
    let p = w.placed();
    let (a, b) = p.hosts(0);
    let epoch: i64 = w.query("SELECT epoch FROM jobs WHERE id = 1");
    let bad = vec![
        disagreement(99, 1, vec![vec![a], vec![b]]),
        disagreement(0, 1, vec![vec![a], vec![999]]),
        disagreement(0, 1, vec![vec![a], vec![a]]),
        disagreement(0, 1, vec![vec![a]]),
        disagreement(0, 1, vec![]),
        disagreement(0, 1, vec![vec![], vec![b]]),
        disagreement(0, 1, (0..20).map(|_| vec![a]).collect()),
        PeerEvent::Disagreement {
            job: 42,
            pid: 0,
            superstep: 1,
            groups: vec![vec![a], vec![b]],
            what: String::new(),
        },
    ];
    w.report(a, bad);
    assert_eq!(w.count("copies_disagree") + w.count("peer_quarantined"), 0);
    let state: String = w.query("SELECT state FROM jobs WHERE id = 1");
    assert_eq!(state, "active");
    let again: i64 = w.query("SELECT epoch FROM jobs WHERE id = 1");
    assert_eq!(again, epoch);
}

#[test]
fn lost_and_revoked_peers_keep_twins_apart() {
    let w = world(&[1, 1, 2, 2, 3, 3], 6);
    let _ = w.placed();
    assert_twins_apart(&w);
    // Disable peers one after the other (fenced, restored elsewhere) while
    // three volunteers remain.
    for victim in [1, 3, 5] {
        let (r, _) = w.run(|c, i, fx| {
            c.set_peer_disabled(
                i,
                fx,
                Caller {
                    id: 100,
                    admin: true,
                },
                victim,
                true,
                now_ms(),
            )
        });
        r.unwrap();
        let state: String = w.query("SELECT state FROM jobs WHERE id = 1");
        assert_eq!(state, "active");
        assert_twins_apart(&w);
    }
    // Peers 2, 4 and 6 are left, of volunteers 1, 2 and 3; then 4 and 6.
    let (r, _) = w.run(|c, i, fx| {
        c.set_peer_disabled(
            i,
            fx,
            Caller {
                id: 100,
                admin: true,
            },
            2,
            true,
            now_ms(),
        )
    });
    r.unwrap();
    assert_twins_apart(&w);
    // One volunteer left: a lost copy has nowhere to go.
    let (r, _) = w.run(|c, i, fx| {
        c.set_peer_disabled(
            i,
            fx,
            Caller {
                id: 100,
                admin: true,
            },
            4,
            true,
            now_ms(),
        )
    });
    r.unwrap();
    let state: String = w.query("SELECT state FROM jobs WHERE id = 1");
    assert_eq!(state, "finished");
    let reason: String = w.query("SELECT error FROM jobs WHERE id = 1");
    assert!(
        reason.contains("no live peer of a volunteer other than"),
        "{reason}"
    );
}

/// A copy whose host gets busy (its volunteer uses the machine) leaves
/// it, also when its DHHT peer holds its twin: it goes to another allowed
/// peer, not back to the busy one it was on.
#[test]
fn a_busy_peer_s_copies_leave_it_for_an_allowed_peer() {
    // Volunteer 1 has peer 1, volunteer 2 peers 2 and 3: every pid has a
    // copy on peer 1 and one on peer 2 or 3.
    let w = world(&[1, 2, 2], 8);
    let _ = w.placed();
    assert_twins_apart(&w);
    let on = |peer: PeerId| -> i64 {
        w.query(&format!(
            "SELECT count(*) FROM placements WHERE job = 1 AND peer_id = {peer}"
        ))
    };
    assert!(on(2) > 0, "the layout puts copies on peer 2");
    let renew = bsp_api::control::PeerRenew {
        idle: 0.0,
        jobs: vec![JOB],
        ..bsp_api::control::PeerRenew::idle(1.0)
    };
    let (r, fx) = w.run(|c, i, fx| c.peer_renew(i, fx, 2, "l", &renew, now_ms()));
    r.unwrap();
    assert!(!started(&fx).is_empty(), "a new epoch moves copies");
    assert_eq!(on(2), 0, "copies stayed on the busy peer 2");
    assert_twins_apart(&w);
}

#[test]
fn placement_keeps_twins_apart_for_many_layouts() {
    // Volunteer layouts (peer i of volunteer vols[i]) and job sizes.
    let layouts: [(&[i64], u32); 8] = [
        (&[1, 2], 1),
        (&[1, 2], 9),
        (&[1, 1, 1, 1, 2], 6),
        (&[1, 2, 2, 2, 2, 2, 2], 13),
        (&[1, 2, 3, 4, 5, 6], 20),
        (&[3, 1, 3, 1, 3, 1], 5),
        (&[1, 1, 2, 2, 3, 3, 4, 4], 31),
        (&[7, 7, 7, 8], 3),
    ];
    for (vols, nprocs) in layouts {
        let w = world(vols, nprocs);
        let _ = w.placed();
        assert_twins_apart(&w);
    }
}

#[test]
fn drained_and_resumed_peers_keep_twins_apart() {
    let w = world(&[1, 1, 2, 2, 3], 8);
    let _ = w.placed();
    for peer in [1, 3, 5] {
        let (r, fx) = w.run(|c, i, fx| c.drain(i, fx, peer, crate::now_ms()));
        r.unwrap();
        assert!(!started(&fx).is_empty() || peer == 5);
        assert_twins_apart(&w);
        // Nothing is placed on a draining peer any more.
        let on: i64 = w.query(&format!(
            "SELECT count(*) FROM placements WHERE job = 1 AND peer_id = {peer}"
        ));
        assert_eq!(on, 0, "peer {peer}");
        // The handovers complete, as the old hosts would report them.
        w.run(|c, _, _| {
            c.conn
                .execute("UPDATE placements SET handed_over = 1 WHERE job = 1", [])
                .unwrap()
        });
    }
    for peer in [1, 3, 5] {
        let (r, _) = w.run(|c, i, fx| c.resume(i, fx, peer, crate::now_ms()));
        r.unwrap();
        assert_twins_apart(&w);
        w.run(|c, _, _| {
            c.conn
                .execute("UPDATE placements SET handed_over = 1 WHERE job = 1", [])
                .unwrap()
        });
    }
}
