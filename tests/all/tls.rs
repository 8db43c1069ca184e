//! TLS on the HTTP side (issue 18): a supernode serving HTTPS with a
//! self-signed certificate, peers and clients pinned to it, and everything
//! else refused before a byte of HTTP is sent.

use std::io::{BufRead, BufReader, Read, Write};
use std::process::Stdio;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use bsp_api::client::{ClientError, ClientOptions, TlsOptions};
use bsp_api::tls::Fingerprint;
use serde_json::json;

use crate::harness::{
    ADMIN, ADMIN_PASSWORD, Cluster, Options, assert_success, bspweb, job, run, until,
    without_client_env,
};

/// One TLS cluster shared by the tests that only talk to it (logging to
/// files, as [`crate::harness::shared`] does).
fn tls_cluster() -> &'static Cluster {
    static CLUSTER: OnceLock<Cluster> = OnceLock::new();
    CLUSTER.get_or_init(|| {
        Cluster::start(Options {
            peers: 2,
            tls: true,
            log_files: true,
            ..Options::default()
        })
    })
}

/// What a TLS error says; any other error fails the test.
#[track_caller]
fn tls_reason(e: &ClientError) -> &str {
    match e {
        ClientError::Tls { reason, .. } => reason,
        _ => panic!("not a TLS error: {e:?}"),
    }
}

fn pin(c: &Cluster) -> Fingerprint {
    c.fingerprint
        .as_deref()
        .expect("a TLS cluster has a fingerprint")
        .parse()
        .expect("the printed fingerprint parses")
}

/// The certificate the supernode made, as DER, from `DATA/tls/cert.pem`.
fn cert_der(data: &std::path::Path) -> Vec<u8> {
    use base64::Engine;
    let pem = std::fs::read_to_string(data.join("tls").join("cert.pem")).expect("cert.pem");
    let b64: String = pem.lines().filter(|l| !l.starts_with("-----")).collect();
    base64::engine::general_purpose::STANDARD
        .decode(b64)
        .expect("PEM base64")
}

#[tokio::test(flavor = "multi_thread")]
async fn a_job_runs_to_completion_over_https_with_pinned_peers_and_client() {
    let c = tls_cluster();
    assert!(c.url.starts_with("https://127.0.0.1:"), "{}", c.url);
    // The fingerprint printed is the certificate's in the data directory.
    assert_eq!(pin(c), Fingerprint::of_der(&cert_der(c.data_dir())));
    // The peers logged in over HTTPS, pinned (Cluster::start waited for them).
    let client = ClientOptions::new()
        .fingerprint(pin(c))
        .login(&c.url, ADMIN, ADMIN_PASSWORD)
        .await
        .expect("a pinned login");
    let peers = client.peers().await.unwrap();
    assert_eq!(peers.iter().filter(|p| p.state == "online").count(), 2);
    let r = run(&client, job("ring", 4, json!(null))).await;
    r.assert_exited();
    for pid in 0..4 {
        assert!(!r.stdout(pid).is_empty(), "pid {pid} printed nothing");
    }
    // Event streams (SSE) run over the same TLS client.
    assert!(r.events.len() > 4, "{:?}", r.events);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_wrong_pin_is_refused_saying_both_fingerprints_before_any_request() {
    let c = tls_cluster();
    let wrong = Fingerprint::of_der(b"some other certificate");
    let e = ClientOptions::new()
        .fingerprint(wrong)
        .login(&c.url, ADMIN, ADMIN_PASSWORD)
        .await
        .expect_err("a wrong pin must not log in");
    // Refused in the handshake: no HTTP answer, so no request was sent.
    let reason = tls_reason(&e);
    assert!(
        reason.starts_with(&format!(
            "the supernode's certificate has fingerprint {}, not the pinned {wrong}: ",
            pin(c)
        )),
        "{reason}"
    );
    assert!(e.status().is_none() && !e.is_transient(), "{e:?}");
    // A token does not help either: every call is refused the same way.
    let admin = c.admin().await;
    let stolen = ClientOptions::new()
        .fingerprint(wrong)
        .with_token(&c.url, admin.token());
    let e = stolen.jobs(None).await.unwrap_err();
    assert!(matches!(e, ClientError::Tls { .. }), "{e:?}");
    let e = stolen.job_events(1).next().await.unwrap_err();
    assert!(matches!(e, ClientError::Tls { .. }), "{e:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn without_pin_or_ca_a_self_signed_supernode_is_refused_saying_what_to_do() {
    let c = tls_cluster();
    let e = bsp_api::client::Client::login(&c.url, ADMIN, ADMIN_PASSWORD)
        .await
        .expect_err("an unknown self-signed certificate must be refused");
    let reason = tls_reason(&e);
    assert!(
        reason.contains(&format!(
            "certificate (fingerprint {}) is not signed by a trusted CA",
            pin(c)
        )),
        "{reason}"
    );
    assert!(reason.contains("--supernode-fingerprint"), "{reason}");
    assert!(reason.contains("--ca-cert"), "{reason}");
    // Its certificate given as a CA is trusted (it names 127.0.0.1).
    let tls = TlsOptions::new()
        .with_ca_file(&c.data_dir().join("tls").join("cert.pem"))
        .unwrap();
    ClientOptions::new()
        .tls(tls)
        .login(&c.url, ADMIN, ADMIN_PASSWORD)
        .await
        .expect("trusted by its certificate as CA");
    // Plain HTTP to the TLS listener is answered, in plain text, with what
    // to do.
    let plain = c.url.replace("https://", "http://");
    let e = bsp_api::client::Client::login(&plain, ADMIN, ADMIN_PASSWORD)
        .await
        .unwrap_err();
    assert_eq!(e.status(), Some(400), "{e:?}");
    assert!(e.to_string().contains("use its https:// URL"), "{e}");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_cli_saves_the_pin_at_login_and_refuses_a_wrong_one() {
    let c = tls_cluster();
    let config = tempfile::tempdir().unwrap();
    let login = |pin: &str| {
        let mut child = without_client_env(&mut bspweb())
            .args(["login", "--url", &c.url, "--user", ADMIN])
            .args(["--supernode-fingerprint", pin])
            .env("BSPWEB_CONFIG_DIR", config.path())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(format!("{ADMIN_PASSWORD}\n").as_bytes())
            .unwrap();
        child.wait_with_output().unwrap()
    };
    let wrong = Fingerprint::of_der(b"not it").to_string();
    let out = login(&wrong);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(8), "{stderr}");
    assert!(
        stderr.contains(&format!("not the pinned {wrong}")),
        "{stderr}"
    );
    assert!(!config.path().join("session.json").exists());

    let right = c.fingerprint.clone().unwrap();
    let out = login(&right);
    assert_success(&out);
    let session = std::fs::read_to_string(config.path().join("session.json")).unwrap();
    assert!(session.contains(&right), "{session}");
    // A later command uses the saved pin.
    let out = without_client_env(&mut bspweb())
        .args(["jobs", "--json"])
        .env("BSPWEB_CONFIG_DIR", config.path())
        .output()
        .unwrap();
    assert_success(&out);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_peer_with_a_wrong_pin_never_logs_in_and_says_why() {
    let c = tls_cluster();
    let log = c.data_dir().join("wrong-pin-peer.log");
    let wrong = Fingerprint::of_der(b"not the supernode's").to_string();
    let mut child = bspweb()
        .args(["peer", "--supernode", &c.url, "--listen", "127.0.0.1:0"])
        .args(["--name", "wrong-pin", "--speed", "1.0", "--slots", "1"])
        .arg("--compile-cache")
        .arg(c.data_dir().join("compiled-wrong-pin"))
        .args(["--supernode-fingerprint", &wrong])
        .args(["--no-control-socket", "--exit-on-stdin-eof"])
        .env("BSPWEB_CONFIG_DIR", c.data_dir())
        .env("BSPWEB_PEER_TOKEN", &c.peer_token)
        .env("BSPWEB_LOG", "warn")
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let text = loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if text.contains("not the pinned") || Instant::now() > deadline {
            break text;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let admin = c.admin().await;
    let names: Vec<String> = admin
        .peers()
        .await
        .unwrap()
        .into_iter()
        .map(|p| p.name)
        .collect();
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        text.contains(&format!("not the pinned {wrong}")),
        "the peer's log: {text}"
    );
    assert!(!names.iter().any(|n| n == "wrong-pin"), "{names:?}");
}

/// A peer that trusts the supernode's certificate as a CA (a deployment's
/// private CA) and pins nothing logs in; one given a file that holds no
/// certificate stops at once, naming it.
#[tokio::test(flavor = "multi_thread")]
async fn a_peer_trusts_a_private_ca_given_with_ca_cert() {
    // A cluster of its own: the shared one's tests count its peers.
    let c = &Cluster::start(Options {
        peers: 0,
        tls: true,
        ..Options::default()
    });
    let ca = c.data_dir().join("tls").join("cert.pem");
    let peer = |name: &str, ca: &std::path::Path| {
        let mut cmd = bspweb();
        cmd.args(["peer", "--supernode", &c.url, "--listen", "127.0.0.1:0"])
            .args(["--name", name, "--speed", "1.0", "--slots", "1"])
            .arg("--compile-cache")
            .arg(c.data_dir().join(format!("compiled-{name}")))
            .arg("--ca-cert")
            .arg(ca)
            .args(["--no-control-socket", "--exit-on-stdin-eof"])
            .env("BSPWEB_CONFIG_DIR", c.data_dir())
            .env("BSPWEB_PEER_TOKEN", &c.peer_token)
            .env_remove("BSPWEB_SUPERNODE_FINGERPRINT")
            .env("BSPWEB_LOG", "warn");
        cmd
    };
    let not_pem = c.data_dir().join("not-a-ca.pem");
    std::fs::write(&not_pem, "hello\n").unwrap();
    let out = peer("bad-ca", &not_pem).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("--ca-cert") && stderr.contains("not-a-ca.pem"),
        "{stderr}"
    );

    let mut child = peer("ca-peer", &ca)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let admin = c.admin().await;
    until(
        "the peer trusting the CA to come online",
        Duration::from_secs(60),
        async || {
            let peers = admin.peers().await.ok()?;
            peers
                .into_iter()
                .find(|p| p.name == "ca-peer" && p.state == "online")
        },
    )
    .await;
    let _ = child.kill();
    let _ = child.wait();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stalled_tls_handshake_holds_its_connection_no_longer_than_the_header_timeout() {
    let c = Cluster::start(Options {
        peers: 0,
        tls: true,
        supernode_args: vec!["--header-timeout-secs".into(), "1".into()],
        ..Options::default()
    });
    let addr = c.url.trim_start_matches("https://").to_string();
    // Half a TLS record header, then nothing; and a connection that sends
    // nothing at all.
    for first in [&[0x16u8, 0x03][..], &[]] {
        let mut s = std::net::TcpStream::connect(&addr).unwrap();
        s.write_all(first).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let start = Instant::now();
        let mut buf = [0u8; 64];
        let n = s.read(&mut buf);
        let waited = start.elapsed();
        assert!(
            matches!(n, Ok(0))
                || matches!(&n, Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset),
            "{n:?}"
        );
        assert!(
            waited >= Duration::from_millis(900) && waited < Duration::from_secs(5),
            "closed after {waited:?}"
        );
    }
    // The listener still serves.
    c.admin().await.health().await.unwrap();
}

#[test]
fn a_supernode_on_a_non_loopback_address_makes_and_keeps_a_self_signed_certificate() {
    let data = tempfile::tempdir().unwrap();
    let start = || {
        let mut child = bspweb()
            .args(["supernode", "--listen", "0.0.0.0:0", "--no-examples"])
            .args(["--tls-name", "bsp.example.org", "--exit-on-stdin-eof"])
            .arg("--data")
            .arg(data.path())
            .env_remove("BSPWEB_USER")
            .env("BSPWEB_LOG", "warn")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut lines = Vec::new();
        for _ in 0..3 {
            let mut line = String::new();
            out.read_line(&mut line).unwrap();
            lines.push(line);
        }
        drop(child.stdin.take());
        let _ = child.wait();
        lines
    };
    let first = start();
    assert!(
        first[0].starts_with("bspweb supernode listening on https://0.0.0.0:"),
        "{first:?}"
    );
    assert!(first[1].contains("(made now)"), "{first:?}");
    let printed = first[2]
        .split_whitespace()
        .find(|w| w.starts_with("sha256:"))
        .expect("a fingerprint");
    let der = cert_der(data.path());
    assert_eq!(printed, Fingerprint::of_der(&der).to_string());
    use std::os::unix::fs::PermissionsExt;
    let key = data.path().join("tls").join("key.pem");
    let mode = std::fs::metadata(&key).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "{}", key.display());
    // The names asked for are in the certificate (DER holds them as text).
    let has = |name: &[u8]| der.windows(name.len()).any(|w| w == name);
    assert!(has(b"bsp.example.org") && has(b"localhost"));
    // The next start reuses it: the same fingerprint.
    let second = start();
    assert!(!second[1].contains("(made now)"), "{second:?}");
    assert!(second[2].contains(printed), "{second:?}");
}

#[test]
fn a_loopback_supernode_without_tls_says_it_serves_plain_http_there_only() {
    let data = tempfile::tempdir().unwrap();
    let mut child = bspweb()
        .args(["supernode", "--listen", "127.0.0.1:0", "--no-examples"])
        .arg("--exit-on-stdin-eof")
        .arg("--data")
        .arg(data.path())
        .env_remove("BSPWEB_USER")
        .env("BSPWEB_LOG", "warn")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let (mut first, mut second) = (String::new(), String::new());
    out.read_line(&mut first).unwrap();
    out.read_line(&mut second).unwrap();
    drop(child.stdin.take());
    let _ = child.wait();
    assert!(first.contains("listening on http://127.0.0.1:"), "{first}");
    assert!(
        second.starts_with("plain HTTP on loopback only; use --tls"),
        "{second}"
    );
    assert!(!data.path().join("tls").exists());
}
