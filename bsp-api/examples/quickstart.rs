// Quickstart: log in to a supernode, run the bundled `ring` program on four
// processes, and print its events until it ends.
//
//     BSPWEB_URL=http://127.0.0.1:7878 BSPWEB_USER=alice BSPWEB_PASSWORD=… \
//         cargo run -p bsp-api --features client --example quickstart
//
// `BSPWEB_URL` defaults to http://127.0.0.1:7878.

use std::process::ExitCode;

use bsp_api::client::{Client, ClientError, ConsumerEvent, JobSpec};
use serde::Serialize;

/// The arguments of a job: any value that serializes to JSON. `ring` takes
/// none, and accepts an empty object, which a struct without fields is.
#[derive(Debug, Serialize)]
pub struct RingArgs {}

/// How the job went: the lines printed, and whether it exited normally.
#[derive(Debug)]
pub struct Outcome {
    pub lines: Vec<String>,
    pub exited: bool,
}

/// Log in at `url`, start `ring` on `nprocs` processes and print its events
/// until its last one.
pub async fn run(
    url: &str,
    user: &str,
    password: &str,
    nprocs: u32,
) -> Result<Outcome, ClientError> {
    let client = Client::login(url, user, password).await?;
    let spec = JobSpec::new("ring", nprocs)
        .args(&RingArgs {})?
        .description("quickstart");
    let job = client.start_job(spec).await?;
    let (mut lines, mut exited) = (vec![], false);
    let mut say = |line: String| {
        println!("{line}");
        lines.push(line);
    };
    say(format!("job {} started on {nprocs} processes", job.id));
    let mut events = client.job_events(job.id);
    while let Some(event) = events.next().await? {
        match event {
            ConsumerEvent::Stdout { pid, line, .. } => say(format!("[{pid}] {line}")),
            ConsumerEvent::Stderr { pid, line, .. } => say(format!("[{pid}] (stderr) {line}")),
            ConsumerEvent::RawData { pid, data, .. } => {
                say(format!("[{pid}] {} bytes of raw data", data.len()))
            }
            ConsumerEvent::StatusLine { line, .. } => say(format!("== {line}")),
            ConsumerEvent::JobExited { job } => {
                exited = true;
                say(format!("job {job} exited"));
            }
            ConsumerEvent::JobAborted { job, pid, cause }
            | ConsumerEvent::JobFailed { job, pid, cause } => {
                say(format!("job {job} ended at pid {pid:?}: {cause}"))
            }
            ConsumerEvent::JobKilled { job } => say(format!("job {job} was killed")),
            // Process exits, rollbacks, migrations, and kinds of events
            // added later.
            _ => {}
        }
    }
    // `next` returned `None`: the terminal event was the last.
    Ok(Outcome { lines, exited })
}

#[tokio::main]
async fn main() -> ExitCode {
    let url = std::env::var("BSPWEB_URL").unwrap_or_else(|_| "http://127.0.0.1:7878".into());
    let (Ok(user), Ok(password)) = (
        std::env::var("BSPWEB_USER"),
        std::env::var("BSPWEB_PASSWORD"),
    ) else {
        eprintln!("set BSPWEB_USER and BSPWEB_PASSWORD to your bspweb login");
        return ExitCode::from(2);
    };
    match run(&url, &user, &password, 4).await {
        Ok(outcome) if outcome.exited => ExitCode::SUCCESS,
        Ok(_) => ExitCode::FAILURE,
        Err(e) => {
            match &e {
                ClientError::InvalidUrl { .. } => eprintln!("check BSPWEB_URL: {e}"),
                ClientError::NotConnected { .. } => {
                    eprintln!("no supernode connection (is it running at {url}?): {e}")
                }
                ClientError::Unauthorized { .. } => {
                    eprintln!("authentication failed (check BSPWEB_USER and BSPWEB_PASSWORD): {e}")
                }
                ClientError::ProgramNotFound { .. } => eprintln!("BSP program not found: {e}"),
                ClientError::NotEnoughPeers { .. } => eprintln!("not enough peers: {e}"),
                e => eprintln!("operation failed: {e}"),
            }
            ExitCode::FAILURE
        }
    }
}
