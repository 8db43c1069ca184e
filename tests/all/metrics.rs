//! `GET /metrics` scraped while a job runs, parsed by a Prometheus
//! text-format parser of its own (`prometheus-parse`), not by ours.

use std::time::Duration;

use prometheus_parse::{Scrape, Value};

use crate::harness::{Cluster, Options, job, until};

/// One scrape: every sample as `name{label=value,…}` → value.
struct Metrics(Scrape);

impl Metrics {
    async fn scrape(http: &reqwest::Client, url: &str) -> Metrics {
        let resp = http.get(format!("{url}/metrics")).send().await.unwrap();
        assert_eq!(resp.status(), reqwest::StatusCode::OK);
        let ctype = resp.headers()[reqwest::header::CONTENT_TYPE]
            .to_str()
            .unwrap()
            .to_string();
        assert!(ctype.starts_with("text/plain; version=0.0.4"), "{ctype}");
        let text = resp.text().await.unwrap();
        let scrape = Scrape::parse(text.lines().map(|l| Ok(l.to_string())))
            .unwrap_or_else(|e| panic!("not the Prometheus text format ({e}):\n{text}"));
        Metrics(scrape)
    }

    /// The value of `name` with these labels; its type must be `kind`.
    #[track_caller]
    fn get(&self, name: &str, labels: &[(&str, &str)], kind: &str) -> f64 {
        let s = self
            .0
            .samples
            .iter()
            .find(|s| s.metric == name && labels.iter().all(|(k, v)| s.labels.get(k) == Some(v)))
            .unwrap_or_else(|| panic!("no sample {name} {labels:?}"));
        assert!(self.0.docs.contains_key(name), "{name} has no HELP line");
        match (&s.value, kind) {
            (Value::Counter(v), "counter") | (Value::Gauge(v), "gauge") => *v,
            (v, _) => panic!("{name} is {v:?}, expected a {kind}"),
        }
    }

    fn counter(&self, name: &str) -> f64 {
        self.get(name, &[], "counter")
    }
}

/// Scrapes until `done` holds for a scrape; panics after `limit`.
async fn scrape_until(
    http: &reqwest::Client,
    url: &str,
    what: &str,
    limit: Duration,
    done: impl Fn(&Metrics) -> bool,
) -> Metrics {
    until(what, limit, async || {
        let m = Metrics::scrape(http, url).await;
        done(&m).then_some(m)
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_follow_a_job_as_it_runs() {
    let mut cluster = Cluster::start(Options {
        peers: 2,
        lease_ttl_secs: 3,
        ..Options::default()
    });
    cluster.wait_for_peers(2);
    let http = reqwest::Client::new();
    let url = cluster.url.clone();
    let before = Metrics::scrape(&http, &url).await;
    assert_eq!(
        before.get("bspweb_peers", &[("state", "online")], "gauge"),
        2.0
    );
    assert_eq!(
        before.get("bspweb_jobs", &[("state", "active")], "gauge"),
        0.0
    );
    assert_eq!(before.counter("bspweb_process_supersteps_total"), 0.0);
    assert_eq!(before.get("bspweb_storage_ok", &[], "gauge"), 1.0);
    assert!(before.get("bspweb_cores_online", &[], "gauge") >= 2.0);

    // A job of many small supersteps with messages: it runs until killed.
    let client = cluster.admin().await;
    let info = client
        .submit(&job(
            "supersteps",
            2,
            serde_json::json!({"k": 10_000_000, "h": 4096}),
        ))
        .await
        .unwrap();
    let limit = Duration::from_secs(60);
    let running = scrape_until(&http, &url, "supersteps to be counted", limit, |m| {
        m.counter("bspweb_process_supersteps_total") > 0.0
    })
    .await;
    assert_eq!(
        running.get("bspweb_jobs", &[("state", "active")], "gauge"),
        1.0
    );
    assert_eq!(running.get("bspweb_processes", &[], "gauge"), 2.0);
    assert_eq!(running.counter("bspweb_jobs_submitted_total"), 1.0);
    // The counters move while it runs, and the peers' own counts arrive
    // with their renewals.
    let seen = running.counter("bspweb_process_supersteps_total");
    let later = scrape_until(&http, &url, "the peers' counts", limit, |m| {
        m.counter("bspweb_process_supersteps_total") > seen
            && m.counter("bspweb_checkpoints_total") > 0.0
            && m.counter("bspweb_checkpoint_bytes_total") > 0.0
            && m.counter("bspweb_message_bytes_total") > 0.0
    })
    .await;
    assert!(
        later.counter("bspweb_lease_renewals_total")
            > before.counter("bspweb_lease_renewals_total")
    );
    let rss = later.get("bspweb_peer_memory_bytes", &[("kind", "rss")], "gauge");
    assert!(rss > 0.0, "{rss}");

    client.kill(info.id).await.unwrap();
    let after = scrape_until(&http, &url, "the kill to be counted", limit, |m| {
        m.get(
            "bspweb_jobs_ended_total",
            &[("outcome", "killed")],
            "counter",
        ) == 1.0
    })
    .await;
    assert_eq!(
        after.get("bspweb_jobs", &[("state", "active")], "gauge"),
        0.0
    );
    assert_eq!(
        after.get("bspweb_jobs", &[("state", "finished")], "gauge"),
        1.0
    );
    assert_eq!(after.get("bspweb_processes", &[], "gauge"), 0.0);
    assert_eq!(
        after.get(
            "bspweb_jobs_ended_total",
            &[("outcome", "exited")],
            "counter"
        ),
        0.0
    );
    // Counters never go back.
    for name in [
        "bspweb_process_supersteps_total",
        "bspweb_checkpoints_total",
        "bspweb_checkpoint_bytes_total",
        "bspweb_lease_renewals_total",
    ] {
        assert!(after.counter(name) >= later.counter(name), "{name}");
    }

    // A lost peer is counted, and its processes' restores.
    let info = client
        .submit(&job("supersteps", 2, serde_json::json!({"k": 10_000_000})))
        .await
        .unwrap();
    scrape_until(&http, &url, "the second job to run", limit, |m| {
        m.get("bspweb_jobs", &[("state", "active")], "gauge") == 1.0
            && m.counter("bspweb_process_supersteps_total")
                > after.counter("bspweb_process_supersteps_total")
    })
    .await;
    let job_info = client.job(info.id).await.unwrap();
    let victim = job_info.placement[0];
    let index = cluster.peer_index(&client, victim).await.unwrap();
    cluster.kill_peer(index);
    let lost = scrape_until(&http, &url, "the lost peer and its restore", limit, |m| {
        m.counter("bspweb_peers_lost_total") == 1.0
            && m.get(
                "bspweb_restores_total",
                &[("from", "checkpoint")],
                "counter",
            ) + m.get("bspweb_restores_total", &[("from", "start")], "counter")
                >= 1.0
    })
    .await;
    assert_eq!(lost.get("bspweb_peers", &[("state", "gone")], "gauge"), 1.0);
    client.kill(info.id).await.unwrap();
}
