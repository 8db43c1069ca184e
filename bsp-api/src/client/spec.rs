//! [`JobSpec`]: a job to start, built step by step.

use std::collections::BTreeMap;

use base64::Engine;
use serde::Serialize;

use super::ClientError;
use crate::rest::{JobLimits, SubmitJob};

/// Which program a job runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Program {
    /// A name registered for the user, or a bundled example (`ring`, `mandelbrot`, …).
    Name(String),
    /// The hex SHA-256 of a module uploaded before.
    Hash(String),
    /// Module bytes: [`Client::start_job`](super::Client::start_job) uploads
    /// them first (unnamed), then submits the job by their hash.
    Wasm(Vec<u8>),
}

impl From<&str> for Program {
    fn from(name: &str) -> Program {
        Program::Name(name.to_string())
    }
}

impl From<String> for Program {
    fn from(name: String) -> Program {
        Program::Name(name)
    }
}

impl From<Vec<u8>> for Program {
    fn from(wasm: Vec<u8>) -> Program {
        Program::Wasm(wasm)
    }
}

/// A job to start with [`Client::start_job`](super::Client::start_job): the
/// program, the number of processes and, optionally, everything else
/// [`SubmitJob`] has.
///
/// ```
/// use bsp_api::client::JobSpec;
/// #[derive(serde::Serialize)]
/// struct Args { width: u32, height: u32 }
/// let spec = JobSpec::new("mandelbrot", 4)
///     .args(&Args { width: 64, height: 48 })?
///     .description("a small picture")
///     .min_peers(2);
/// assert_eq!(spec.nprocs(), 4);
/// # Ok::<(), bsp_api::client::ClientError>(())
/// ```
#[derive(Debug, Clone)]
pub struct JobSpec {
    pub(crate) program: Program,
    pub(crate) job: SubmitJob,
}

impl JobSpec {
    /// Run `program` (a name, see [`Program`] for hashes and bytes) on
    /// `nprocs` processes, with `null` arguments.
    pub fn new(program: impl Into<Program>, nprocs: u32) -> JobSpec {
        JobSpec {
            program: program.into(),
            job: SubmitJob {
                program: String::new(),
                nprocs,
                args: serde_json::Value::Null,
                description: None,
                resources: BTreeMap::new(),
                seed: None,
                limits: None,
                min_peers: None,
            },
        }
    }

    /// The arguments handed to the program's `main`: any value that
    /// serializes to JSON.
    pub fn args<T: Serialize + ?Sized>(mut self, args: &T) -> Result<JobSpec, ClientError> {
        self.job.args = serde_json::to_value(args)?;
        Ok(self)
    }

    /// The description shown in job lists.
    pub fn description(mut self, description: impl Into<String>) -> JobSpec {
        self.job.description = Some(description.into());
        self
    }

    /// A named resource the program reads with `Bsp::resource(name)`.
    pub fn resource(mut self, name: impl Into<String>, bytes: &[u8]) -> JobSpec {
        let data = base64::engine::general_purpose::STANDARD.encode(bytes);
        self.job.resources.insert(name.into(), data);
        self
    }

    /// The seed of the processes' deterministic random number generators.
    pub fn seed(mut self, seed: u64) -> JobSpec {
        self.job.seed = Some(seed);
        self
    }

    /// Limits of time, memory, output and checkpointing.
    pub fn limits(mut self, limits: JobLimits) -> JobSpec {
        self.job.limits = Some(limits);
        self
    }

    /// Refuse the job with [`ClientError::NotEnoughPeers`] instead of
    /// queueing it when fewer than `n` peers are online.
    pub fn min_peers(mut self, n: u32) -> JobSpec {
        self.job.min_peers = Some(n);
        self
    }

    /// The program.
    pub fn program(&self) -> &Program {
        &self.program
    }

    /// The number of processes.
    pub fn nprocs(&self) -> u32 {
        self.job.nprocs
    }

    /// The request, once the program is known by name or hash (`None` for
    /// [`Program::Wasm`], which must be uploaded first).
    pub fn to_submit(&self) -> Option<SubmitJob> {
        let program = match &self.program {
            Program::Name(p) | Program::Hash(p) => p.clone(),
            Program::Wasm(_) => return None,
        };
        Some(SubmitJob {
            program,
            ..self.job.clone()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_builder_fills_every_field_of_the_request() {
        let spec = JobSpec::new(Program::Hash("ab".repeat(32)), 3)
            .args(&serde_json::json!({"k": 2}))
            .unwrap()
            .description("d")
            .resource("input.txt", b"hi")
            .seed(7)
            .limits(JobLimits::default())
            .min_peers(2);
        let s = spec.to_submit().unwrap();
        assert_eq!(s.program, "ab".repeat(32));
        assert_eq!(s.nprocs, 3);
        assert_eq!(s.args, serde_json::json!({"k": 2}));
        assert_eq!(s.description.as_deref(), Some("d"));
        assert_eq!(s.resources["input.txt"], "aGk=");
        assert_eq!((s.seed, s.min_peers), (Some(7), Some(2)));
        assert_eq!(s.limits, Some(JobLimits::default()));
        assert!(JobSpec::new(vec![0u8], 1).to_submit().is_none());
    }

    #[test]
    fn arguments_that_do_not_serialize_are_an_error() {
        // A map with non-string keys has no JSON form.
        let mut m = std::collections::HashMap::new();
        m.insert((1, 2), 3);
        let err = JobSpec::new("ring", 2).args(&m).unwrap_err();
        assert!(matches!(err, ClientError::Args(_)), "{err:?}");
    }
}
