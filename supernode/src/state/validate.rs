//! Checks of what users and peers send, before any state changes.

use super::*;

pub(super) fn is_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
}

/// User names: 1 to 64 of `A-Z a-z 0-9 _ . -`.
pub(crate) fn check_user_name(name: &str) -> Result<(), Error> {
    if is_name(name) {
        Ok(())
    } else {
        Err(Error::bad_request(
            "a user name is 1 to 64 characters of letters, digits, `_`, `.` and `-`",
        ))
    }
}

/// The largest output quota, in MiB (1 EiB): beyond it the byte count
/// would not fit the database.
pub(crate) const MAX_OUTPUT_QUOTA_MIB: u64 = 1 << 40;

/// Quotas to set: the output quota within [`MAX_OUTPUT_QUOTA_MIB`].
pub(crate) fn check_quotas(q: &QuotaChange) -> Result<(), Error> {
    match q.max_output_mib {
        Some(mib) if mib > MAX_OUTPUT_QUOTA_MIB => Err(Error::bad_request(format!(
            "`quotas.max_output_mib` is at most {MAX_OUTPUT_QUOTA_MIB} (0: no limit), not {mib}"
        ))),
        _ => Ok(()),
    }
}

/// Passwords: 8 to 1024 bytes.
pub(crate) fn check_password(password: &str) -> Result<(), Error> {
    if (8..=1024).contains(&password.len()) {
        Ok(())
    } else {
        Err(Error::bad_request(
            "a password is 8 to 1024 characters long",
        ))
    }
}

/// Program names: 1 to 64 of `A-Z a-z 0-9 _ . -`.
pub(crate) fn check_program_name(name: &str) -> Result<(), Error> {
    if is_name(name) {
        Ok(())
    } else {
        Err(Error::bad_request(format!(
            "`{}` is not a valid program name: use 1 to 64 letters, digits, `_`, `.` and `-`",
            truncate(name, 80)
        )))
    }
}

/// Validates a module against the `bspweb_v1` contract and returns its hex
/// SHA-256. Slow for big modules: call from a blocking thread.
pub(crate) fn validate_module(wasm: &[u8]) -> Result<String, Error> {
    let invalid = |e: bspweb_abi::InvalidModule| Error::Unprocessable {
        code: "invalid_module",
        message: e.to_string(),
    };
    bspweb_abi::validate(wasm).map_err(invalid)?;
    // What every peer does before it compiles the module: refused here
    // rather than when a job starts.
    bspweb_abi::canonicalize_nans(wasm).map_err(invalid)?;
    Ok(hex::encode(Sha256::digest(wasm)))
}

pub(super) fn is_hash(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// A submitted job after validation.
pub(crate) struct NewJob {
    pub(crate) program: String,
    pub(crate) nprocs: u32,
    pub(crate) args: String,
    pub(crate) description: Option<String>,
    pub(crate) seed: u64,
    pub(crate) limits: JobLimits,
    pub(crate) resources: Vec<(String, Vec<u8>)>,
}

/// Limits clamped to what the supernode accepts.
pub(crate) fn clamp_limits(limits: JobLimits) -> JobLimits {
    JobLimits {
        superstep_ms: limits.superstep_ms.clamp(100, 86_400_000),
        memory_mib: limits.memory_mib.clamp(1, 4096),
        output_mib: limits.output_mib.clamp(1, 1024),
        checkpoint_every: limits.checkpoint_every.clamp(1, 1_000_000),
        replicas: limits.replicas.min(MAX_REPLICAS),
        // Checked, not clamped (`check_redundancy`): a job silently run
        // without the validation it asked for would mislead its owner.
        redundancy: limits.redundancy,
    }
}

/// Most copies of a process a job may ask for (issue 18, "result
/// validation by redundancy"): two copies and, on disagreement, a third
/// run.
pub(crate) const MAX_REDUNDANCY: u32 = 2;

/// `limits.redundancy` must be 1 (no validation) or 2.
pub(crate) fn check_redundancy(redundancy: u32) -> Result<(), Error> {
    if (1..=MAX_REDUNDANCY).contains(&redundancy) {
        Ok(())
    } else {
        Err(Error::bad_request(format!(
            "`limits.redundancy` must be 1 (each process runs once, unchecked) or 2 (each \
             process runs on peers of two different volunteers, whose results must agree), \
             not {redundancy}"
        )))
    }
}

/// Checks a submission; decodes its resources. CPU-bound for big resources:
/// call from a blocking thread.
pub(crate) fn validate_submit(job: bsp_api::rest::SubmitJob) -> Result<NewJob, Error> {
    let program = job.program.trim().to_string();
    if program.is_empty() || program.len() > 128 {
        return Err(Error::bad_request(
            "`program` must name one of your programs, a bundled example, or a module hash",
        ));
    }
    if job.nprocs == 0 || job.nprocs > MAX_NPROCS {
        return Err(Error::bad_request(format!(
            "`nprocs` must be between 1 and {MAX_NPROCS}, not {}",
            job.nprocs
        )));
    }
    let args = serde_json::to_string(&job.args)
        .map_err(|e| Error::bad_request(format!("`args` cannot be stored: {e}")))?;
    if args.len() > MAX_ARGS_BYTES {
        return Err(Error::TooLarge(format!(
            "`args` is {} bytes of JSON; the limit is {MAX_ARGS_BYTES} (pass big inputs as resources)",
            args.len()
        )));
    }
    if let Some(d) = &job.description
        && d.chars().count() > MAX_DESCRIPTION_CHARS
    {
        return Err(Error::bad_request(format!(
            "`description` is longer than {MAX_DESCRIPTION_CHARS} characters"
        )));
    }
    let limits = job.limits.unwrap_or_default();
    check_redundancy(limits.redundancy)?;
    let mut resources = Vec::with_capacity(job.resources.len());
    let mut total = 0usize;
    for (name, data) in job.resources {
        if name.is_empty() || name.len() > 256 || name.chars().any(char::is_control) {
            return Err(Error::bad_request(format!(
                "resource name `{}` is not valid: use 1 to 256 printable characters",
                truncate(&name, 80)
            )));
        }
        let bytes = BASE64.decode(data.as_bytes()).map_err(|e| {
            Error::bad_request(format!(
                "resource `{name}` is not valid base64 ({e}); encode its bytes with standard base64"
            ))
        })?;
        total += bytes.len();
        if total > MAX_RESOURCE_BYTES {
            return Err(Error::TooLarge(format!(
                "the job's resources add up to more than {} MiB",
                MAX_RESOURCE_BYTES >> 20
            )));
        }
        resources.push((name, bytes));
    }
    Ok(NewJob {
        program,
        nprocs: job.nprocs,
        args,
        description: job.description,
        // Below 2^53, so the seed survives JavaScript's numbers in the web UI.
        seed: job.seed.unwrap_or_else(|| rand::random::<u64>() >> 11),
        limits: clamp_limits(limits),
        resources,
    })
}

pub(super) fn check_peer_numbers(speed: f64, idle: f64) -> Result<(), Error> {
    if !(speed.is_finite() && speed > 0.0 && speed <= 1e9) {
        return Err(Error::bad_request(format!(
            "`speed` must be a positive number (1.0 = the reference machine), not {speed}"
        )));
    }
    if !(idle.is_finite() && (0.0..=1.0).contains(&idle)) {
        return Err(Error::bad_request(format!(
            "`idle` must be a fraction between 0 and 1, not {idle}"
        )));
    }
    Ok(())
}

/// Whether `addr` is `host:port` with a non-zero port (IPv6 hosts in brackets).
pub(super) fn is_host_port(addr: &str) -> bool {
    if addr.parse::<std::net::SocketAddr>().is_ok() {
        return !addr.ends_with(":0");
    }
    let Some((host, port)) = addr.rsplit_once(':') else {
        return false;
    };
    let port_ok = port.parse::<u16>().is_ok_and(|p| p != 0);
    let host_ok = !host.is_empty()
        && host.len() <= 253
        && host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_'));
    port_ok && host_ok
}

/// Checks a peer's login.
pub(crate) fn validate_login(login: &PeerLogin) -> Result<(), Error> {
    if login.version != bsp_api::API_VERSION {
        return Err(Error::bad_request(format!(
            "this supernode speaks protocol version {}, the peer {}; run matching bspweb versions",
            bsp_api::API_VERSION,
            login.version
        )));
    }
    if login.name.trim().is_empty()
        || login.name.chars().count() > 128
        || login.name.chars().any(char::is_control)
    {
        return Err(Error::bad_request(
            "`name` must be 1 to 128 printable characters",
        ));
    }
    if !is_host_port(&login.addr) {
        return Err(Error::bad_request(format!(
            "`addr` must be `host:port` where other peers reach this peer, not `{}`",
            truncate(&login.addr, 80)
        )));
    }
    if let Some(c) = &login.cluster
        && !bsp_api::control::valid_named_cluster(c)
    {
        return Err(Error::bad_request(format!(
            "`cluster` must be {}, not `{}`",
            bsp_api::control::NAMED_CLUSTER_RULE,
            truncate(c, 80)
        )));
    }
    check_peer_numbers(login.speed, login.idle)?;
    if login.cores == 0 || login.cores > 65_536 {
        return Err(Error::bad_request(format!(
            "`cores` must be between 1 and 65536, not {}",
            login.cores
        )));
    }
    Ok(())
}

/// Checks a renewal.
pub(crate) fn validate_renew(renew: &PeerRenew) -> Result<(), Error> {
    check_peer_numbers(renew.speed, renew.idle)?;
    if renew.jobs.len() > 100_000 {
        return Err(Error::bad_request("`jobs` lists more than 100000 jobs"));
    }
    let m = renew.memory;
    if i64::try_from(m.rss_bytes).is_err() || i64::try_from(m.held_bytes).is_err() {
        return Err(Error::bad_request(
            "`memory.rss_bytes` and `memory.held_bytes` must be below 2^63",
        ));
    }
    if renew.links.len() > MAX_LINKS_PER_RENEWAL {
        return Err(Error::bad_request(format!(
            "`links` lists {} measurements; a renewal carries at most {MAX_LINKS_PER_RENEWAL}",
            renew.links.len()
        )));
    }
    if renew.observed.len() > MAX_OBSERVATIONS_PER_RENEWAL {
        return Err(Error::bad_request(format!(
            "`observed` lists {} observations; a renewal carries at most \
             {MAX_OBSERVATIONS_PER_RENEWAL}",
            renew.observed.len()
        )));
    }
    if renew.waits.len() > MAX_WAITS_PER_RENEWAL
        || renew.waits.iter().any(|w| w.pids.len() > 1 << 16)
    {
        return Err(Error::bad_request(format!(
            "`waits` lists more than {MAX_WAITS_PER_RENEWAL} jobs, or a wait more than 65536 \
             processes"
        )));
    }
    Ok(())
}

/// Observations of other peers one renewal may carry (a peer runs a few
/// jobs with a few peers each).
pub(crate) const MAX_OBSERVATIONS_PER_RENEWAL: usize = 4096;
/// Jobs whose barrier waits one renewal may report.
pub(crate) const MAX_WAITS_PER_RENEWAL: usize = 1024;

/// Measurements one renewal may carry: a peer measures a few links per
/// renewal, this leaves room for renewals that failed.
pub(crate) const MAX_LINKS_PER_RENEWAL: usize = 256;
