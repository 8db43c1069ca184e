//! Each example program's output against a native reference computation.

use serde_json::json;

use crate::harness::{job, run, shared};

/// Listing 2.1: who sends what to whom, computed natively.
fn ring_reference(pid: u32, n: u32) -> Vec<String> {
    let mut msgs = vec![];
    for src in 0..n {
        let (left, right) = ((src + n - 1) % n, (src + 1) % n);
        if left == pid {
            msgs.push((src, 1));
        }
        if right == pid {
            msgs.push((src, 2));
        }
    }
    let mut lines: Vec<String> = msgs
        .iter()
        .map(|(src, c)| format!("got {c} from pid {src} in superstep 0"))
        .collect();
    lines.push(format!("got in total {} messages", msgs.len()));
    let from0: Vec<_> = msgs.iter().filter(|(s, _)| *s == 0).collect();
    for (_, c) in &from0 {
        lines.push(format!("received {c} from pid 0 in superstep 0"));
    }
    lines.push(format!("got {} messages from pid 0", from0.len()));
    lines
}

#[tokio::test(flavor = "multi_thread")]
async fn ring_listing_2_1_prints_every_message_four_ways() {
    let c = shared();
    let client = c.admin().await;
    for n in [1u32, 2, 8] {
        let r = run(&client, job("ring", n, json!(null))).await;
        r.assert_exited();
        for pid in 0..n {
            assert_eq!(
                r.stdout(pid),
                ring_reference(pid, n),
                "ring n={n} pid={pid}"
            );
        }
    }
}

fn mandelbrot_row(r: u32, w: u32, h: u32, max_iter: u32) -> Vec<u8> {
    let (x0, y0, x1, y1) = (-2.0f64, -1.25f64, 0.5f64, 1.25f64);
    let mut row = r.to_le_bytes().to_vec();
    for px in 0..w {
        let cx = x0 + (px as f64 + 0.5) * (x1 - x0) / w as f64;
        let cy = y0 + (r as f64 + 0.5) * (y1 - y0) / h as f64;
        let (mut zx, mut zy, mut it) = (0.0f64, 0.0f64, 0u32);
        while it < max_iter && zx * zx + zy * zy <= 4.0 {
            let t = zx * zx - zy * zy + cx;
            zy = 2.0 * zx * zy + cy;
            zx = t;
            it += 1;
        }
        row.push((it as u64 * 255 / max_iter as u64) as u8);
    }
    row
}

#[tokio::test(flavor = "multi_thread")]
async fn mandelbrot_rows_match_the_native_computation() {
    let c = shared();
    let client = c.admin().await;
    let (w, h, it, n) = (96u32, 64u32, 200u32, 5u32);
    let r = run(
        &client,
        job(
            "mandelbrot",
            n,
            json!({"width": w, "height": h, "max_iter": it}),
        ),
    )
    .await;
    r.assert_exited();
    let mut rows_seen = 0;
    for pid in 0..n {
        let raw = r.raw(pid);
        let expected_rows: Vec<u32> = (0..h).filter(|row| row % n == pid).collect();
        assert_eq!(raw.len(), expected_rows.len(), "pid {pid} row count");
        for (rec, row) in raw.iter().zip(&expected_rows) {
            assert_eq!(rec, &mandelbrot_row(*row, w, h, it), "pid {pid} row {row}");
            rows_seen += 1;
        }
        assert_eq!(
            r.stdout(pid)[0],
            format!("pid {pid} computed {} rows", expected_rows.len())
        );
    }
    assert_eq!(rows_seen, h);
    assert!(r.stdout(0).contains(&format!("mandelbrot {w}x{h} done")));
}

/// A job submitted without arguments (`null`, as the CLI, the web UI and the
/// API send them) runs with the program's defaults (issue 19: the README's
/// `bspweb submit mandelbrot -n 4 --follow` aborted on `null`).
#[tokio::test(flavor = "multi_thread")]
async fn no_arguments_mean_the_programs_defaults() {
    let c = shared();
    let client = c.admin().await;
    let r = run(&client, job("mandelbrot", 4, serde_json::Value::Null)).await;
    r.assert_exited();
    assert!(r.stdout(0).contains(&"mandelbrot 256x256 done".to_string()));
    let rows: usize = (0..4).map(|pid| r.raw(pid).len()).sum();
    assert_eq!(rows, 256);
}

#[tokio::test(flavor = "multi_thread")]
async fn inner_product_matches_the_sequential_result() {
    let c = shared();
    let client = c.admin().await;
    let n: u64 = 1_000_000;
    let seq: i128 = (0..n)
        .map(|i| {
            let x = (i % 1000) as i64 - 500;
            let y = ((7 * i + 3) % 1001) as i64 - 500;
            (x * y) as i128
        })
        .sum();
    let r = run(&client, job("inner-product", 8, json!({"n": n}))).await;
    r.assert_exited();
    assert!(
        r.stdout(0)
            .contains(&format!("inner product of two {n}-vectors = {seq}")),
        "pid 0 printed {:?}, expected the sum {seq}",
        r.stdout(0)
    );
}

fn sample_sort_keys(seed: u64, p: u32, nprocs: u32, n: u64) -> Vec<u64> {
    let lo = p as u64 * n / nprocs as u64;
    let hi = (p as u64 + 1) * n / nprocs as u64;
    let mut rng = bspweb::Rng::for_process(seed, p);
    (lo..hi).map(|_| rng.next_u64()).collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn sample_sort_of_a_million_keys_on_8_processes_verifies() {
    let c = shared();
    let client = c.admin().await;
    let (n, p) = (1_000_000u64, 8u32);
    let checksum = (0..p)
        .flat_map(|pid| sample_sort_keys(42, pid, p, n))
        .fold(0u64, |a, k| a.wrapping_add(k));
    let r = run(&client, job("sample-sort", p, json!({"n": n}))).await;
    r.assert_exited();
    let out = r.stdout(0);
    assert!(
        out.contains(&format!("sorted {n} keys on {p} processes: ok")),
        "{out:?}"
    );
    assert!(
        out.contains(&format!("checksum {checksum:016x}")),
        "{out:?}"
    );
    let held: u64 = (0..p)
        .map(|pid| {
            let line = r
                .stdout(pid)
                .into_iter()
                .find(|l| l.starts_with(&format!("pid {pid} holds ")))
                .expect("holds line");
            line.split_whitespace()
                .nth(3)
                .unwrap()
                .parse::<u64>()
                .unwrap()
        })
        .sum();
    assert_eq!(held, n);
}

#[tokio::test(flavor = "multi_thread")]
async fn sample_sort_emits_exactly_the_natively_sorted_keys() {
    let c = shared();
    let client = c.admin().await;
    let (n, p) = (20_000u64, 4u32);
    let mut expected: Vec<u64> = (0..p)
        .flat_map(|pid| sample_sort_keys(42, pid, p, n))
        .collect();
    expected.sort_unstable();
    let r = run(
        &client,
        job("sample-sort", p, json!({"n": n, "emit": true})),
    )
    .await;
    r.assert_exited();
    let got: Vec<u64> = (0..p)
        .flat_map(|pid| r.raw(pid).concat())
        .collect::<Vec<u8>>()
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(got.len(), expected.len());
    assert!(
        got == expected,
        "concatenated output differs from the sorted keys"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn broadcast_delivers_the_range_and_list_forms() {
    let c = shared();
    let client = c.admin().await;
    let n = 6u32;
    let r = run(&client, job("broadcast", n, json!(null))).await;
    r.assert_exited();
    for me in 0..n {
        let mut expected = vec![];
        for src in 0..n {
            if src == 0 {
                expected.push(format!("pid {me} got range hello from 0"));
                if me % 2 == 0 {
                    expected.push(format!("pid {me} got list hello from 0"));
                }
            }
            if me == 0 || me == n - 1 {
                expected.push(format!("pid {me} got from {src} from {src}"));
            }
        }
        expected.push(format!("pid {me} got {} messages", expected.len()));
        assert_eq!(r.stdout(me), expected, "pid {me}");
    }
}

/// Issue 19: messages of different kinds are told apart by their tag,
/// whatever order they were sent in, also in broadcasts that travel by
/// relay (300 KB to every process).
#[tokio::test(flavor = "multi_thread")]
async fn tags_select_each_kind_of_message() {
    let c = shared();
    let client = c.admin().await;
    let hash = misbehave_hash(&client).await;
    let n = 4u32;
    let r = run(&client, job(&hash, n, json!({"mode": "tags"}))).await;
    r.assert_exited();
    for me in 0..n {
        assert_eq!(r.stdout(me), [format!("pid {me} tags ok")], "pid {me}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_hundred_supersteps_with_an_h_relation() {
    let c = shared();
    let client = c.admin().await;
    let r = run(&client, job("supersteps", 6, json!({"k": 100, "h": 3000}))).await;
    r.assert_exited();
    assert!(
        r.stdout(0)
            .contains(&"done 100 supersteps h=3000".to_string())
    );
    for pid in 0..6 {
        assert!(
            r.stdout(pid).contains(&format!("pid {pid} ok")),
            "pid {pid}"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn three_jobs_at_once_each_get_their_own_output() {
    let c = shared();
    let client = c.admin().await;
    let a = client.submit(&job("ring", 4, json!(null))).await.unwrap();
    let b = client
        .submit(&job("supersteps", 5, json!({"k": 30, "h": 500})))
        .await
        .unwrap();
    let d = client
        .submit(&job("inner-product", 3, json!({"n": 3000})))
        .await
        .unwrap();
    let (ra, rb, rd) = tokio::join!(
        crate::harness::collect(&client, a.id),
        crate::harness::collect(&client, b.id),
        crate::harness::collect(&client, d.id)
    );
    ra.assert_exited();
    rb.assert_exited();
    rd.assert_exited();
    for pid in 0..4 {
        assert_eq!(ra.stdout(pid), ring_reference(pid, 4));
    }
    assert!(
        rb.stdout(0)
            .contains(&"done 30 supersteps h=500".to_string())
    );
    let seq: i128 = (0..3000u64)
        .map(|i| (((i % 1000) as i64 - 500) * (((7 * i + 3) % 1001) as i64 - 500)) as i128)
        .sum();
    assert!(
        rd.stdout(0)
            .contains(&format!("inner product of two 3000-vectors = {seq}"))
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn more_processes_than_peers_share_peers() {
    let c = shared();
    let client = c.admin().await;
    let n = 16u32;
    let r = run(&client, job("ring", n, json!(null))).await;
    r.assert_exited();
    let mut peers = r.info.placement.clone();
    assert_eq!(peers.len(), n as usize);
    peers.sort_unstable();
    peers.dedup();
    assert!(
        peers.len() <= 3,
        "16 processes on at most the 3 peers: {:?}",
        r.info.placement
    );
    for pid in 0..n {
        assert_eq!(r.stdout(pid), ring_reference(pid, n));
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_resource_is_readable_by_name() {
    use base64::Engine;
    let c = shared();
    let client = c.admin().await;
    let mut spec = job("misbehave", 2, json!({"mode": "resource"}));
    spec.resources.insert(
        "input.txt".into(),
        base64::engine::general_purpose::STANDARD.encode("hello resource"),
    );
    spec.program = misbehave_hash(&client).await;
    let r = run(&client, spec).await;
    r.assert_exited();
    assert_eq!(r.stdout(0), vec!["hello resource".to_string()]);
}

/// The test-only program is not registered by name; upload it.
pub async fn misbehave_hash(client: &bsp_api::client::Client) -> String {
    let wasm = bspweb_programs::get("misbehave")
        .expect("misbehave is built")
        .wasm
        .to_vec();
    client
        .upload_program(wasm, None)
        .await
        .expect("upload misbehave")
        .hash
}

/// The PageRank kernel of the `pagerank` guest, compiled natively: the
/// reference is the same source run on one block.
#[path = "../../guest-sdk/examples/pagerank/kernel.rs"]
pub(crate) mod pagerank_kernel;

/// The kernel split into `p` blocks in-process, exchanging the blocks the
/// guest sends (without the SDK): the exactness argument of the kernel, checked
/// without a cluster.
fn pagerank_in_blocks(params: &pagerank_kernel::Params, p: u32) -> Vec<String> {
    use pagerank_kernel::{Graph, PageRank, Summary, encode_words};
    let blocks: Vec<_> = (0..p)
        .map(|q| {
            let b = bspweb::dist::block(u64::from(params.n), p, q);
            b.start as u32..b.end as u32
        })
        .collect();
    let graphs: Vec<Graph> = blocks
        .iter()
        .map(|b| Graph::generate(params, b.clone()))
        .collect();
    let mut ranks: Vec<PageRank> = graphs.iter().map(|g| PageRank::new(params, g)).collect();
    for _ in 0..params.iters {
        let dangling: Vec<u64> = ranks
            .iter_mut()
            .zip(&graphs)
            .map(|(r, g)| r.scatter(g))
            .collect();
        let mut inboxes: Vec<Vec<Vec<u8>>> = vec![vec![]; p as usize];
        for (src, r) in ranks.iter_mut().enumerate() {
            for (dst, b) in blocks.iter().enumerate().filter(|&(d, _)| d != src) {
                let mut bytes = vec![];
                encode_words(&mut bytes, r.outgoing(b.clone()));
                inboxes[dst].push(bytes);
            }
            // As the guest does once they are sent (the next scatter needs them zero).
            r.clear_outgoing();
        }
        let total = dangling.iter().sum();
        for (r, inbox) in ranks.iter_mut().zip(&inboxes) {
            for bytes in inbox {
                r.absorb(0, bytes).expect("a block of the right size");
            }
            r.update(total);
        }
    }
    // Merged in reverse, through the wire form: the order must not matter.
    let mut summary = Summary::default();
    for (r, g) in ranks.iter().zip(&graphs).rev() {
        summary.merge(&Summary::from_bytes(&r.summary(g).to_bytes()).expect("a summary"));
    }
    summary.lines(params)
}

#[test]
fn pagerank_kernel_gives_the_same_ranks_for_every_split_and_agrees_with_f64() {
    let params = pagerank_kernel::Params::new(2000, 10_000, 20, 7).unwrap();
    let reference = pagerank_kernel::reference(&params);
    for p in 1..=6 {
        assert_eq!(pagerank_in_blocks(&params, p), reference, "{p} blocks");
    }

    // Textbook PageRank in f64 over the same edges: the fixed-point ranks
    // agree to about 1e-12.
    let (n, m) = (params.n as usize, params.m);
    let edges: Vec<(usize, usize)> = (0..m)
        .map(|e| {
            let (s, t) = pagerank_kernel::edge(params.seed, params.n, e);
            (s as usize, t as usize)
        })
        .collect();
    let mut degree = vec![0usize; n];
    for &(s, _) in &edges {
        degree[s] += 1;
    }
    let mut rank = vec![1.0 / n as f64; n];
    for _ in 0..params.iters {
        let dangling: f64 = (0..n).filter(|&v| degree[v] == 0).map(|v| rank[v]).sum();
        let mut next = vec![0.15 / n as f64 + 0.85 * dangling / n as f64; n];
        for &(s, t) in &edges {
            next[t] += 0.85 * rank[s] / degree[s] as f64;
        }
        rank = next;
    }
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by(|&a, &b| rank[b].total_cmp(&rank[a]).then(a.cmp(&b)));
    let dangling = degree.iter().filter(|&&d| d == 0).count();
    assert!(
        reference[0].contains(&format!("({dangling} dangling)")),
        "{reference:?}"
    );
    for (i, &v) in order[..pagerank_kernel::TOP].iter().enumerate() {
        let line = &reference[3 + i];
        assert!(
            line.starts_with(&format!("top {}: vertex {v} rank ", i + 1)),
            "f64 ranks vertex {v} at {}: {line}",
            i + 1
        );
        let fixed: f64 = line.rsplit(' ').next().unwrap().parse().unwrap();
        assert!((fixed - rank[v]).abs() < 1e-11, "{line} vs {}", rank[v]);
    }

    // Bad arguments are errors, not panics.
    for (n, m, says) in [
        (0, 10, "n must be at least 1"),
        (1 << 27, 10, "n = 134217728 is too large"),
        (10, 1 << 29, "m = 536870912 is too large"),
    ] {
        let e = pagerank_kernel::Params::new(n, m, 1, 1).unwrap_err();
        assert!(e.starts_with(says), "{e}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn pagerank_prints_the_native_result_at_every_p() {
    let c = shared();
    let client = c.admin().await;
    let (n, m, iters, seed) = (2000u64, 10_000u64, 20u32, 3u64);
    let args = json!({"n": n, "m": m, "iters": iters, "seed": seed});
    let expected =
        pagerank_kernel::reference(&pagerank_kernel::Params::new(n, m, iters, seed).unwrap());
    for p in [1u32, 3, 4] {
        let r = run(&client, job("pagerank", p, args.clone())).await;
        r.assert_exited();
        assert_eq!(r.stdout(0), expected, "pagerank at p = {p}");
        for pid in 1..p {
            assert!(
                r.stdout(pid).is_empty(),
                "pid {pid} printed {:?}",
                r.stdout(pid)
            );
        }
    }

    // Blocks of more than 1 MiB travel as several messages.
    let (n, m, iters) = (300_000u64, 300_000u64, 2u32);
    let r = run(
        &client,
        job("pagerank", 2, json!({"n": n, "m": m, "iters": iters})),
    )
    .await;
    r.assert_exited();
    let expected =
        pagerank_kernel::reference(&pagerank_kernel::Params::new(n, m, iters, 1).unwrap());
    assert_eq!(r.stdout(0), expected, "pagerank in 1 MiB pieces");

    // Bad arguments end the job with a message.
    let r = run(&client, job("pagerank", 2, json!({"n": 0}))).await;
    assert!(
        r.failure().contains("n must be at least 1"),
        "{}",
        r.failure()
    );
}
