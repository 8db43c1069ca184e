//! Why a job's work failed on this peer, typed: a process's host work (its
//! superstep, capture or restore) and getting the program and the job's
//! resources. The messages are the ones the job's events carry.

use crate::control::ControlError;
use crate::runtime::{CompileError, RestoreError, StartError};
use crate::slots::Closed;

/// Why a process's superstep, capture or restore failed on this peer.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    #[error(transparent)]
    Slots(#[from] Closed),
    #[error(transparent)]
    Start(#[from] StartError),
    #[error(transparent)]
    Restore(#[from] RestoreError),
    /// The blocking thread that ran it panicked or was cancelled.
    #[error("its host thread failed: {0}")]
    Thread(#[from] tokio::task::JoinError),
    /// The job's driver was gone when the process synced.
    #[error("the job ended")]
    JobEnded,
    #[error("cannot encode a checkpoint: {0}")]
    Encode(#[from] postcard::Error),
}

/// Where a program or the job's resources came from, for messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    Supernode,
    OtherPeers,
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Source::Supernode => "the supernode",
            Source::OtherPeers => "other peers",
        })
    }
}

/// Why this peer could not get the job's program or resources.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error("could not download the job's resources: {0}")]
    ResourcesDownload(ControlError),
    #[error("could not download the program {hash}: {error}")]
    Download { hash: String, error: ControlError },
    /// The blocking thread that compiled it panicked or was cancelled.
    #[error("compiling the program failed: {0}")]
    Thread(#[from] tokio::task::JoinError),
    /// The program as downloaded from the supernode.
    #[error(transparent)]
    Compile(#[from] CompileError),
    /// The program as Robber assembled it from other peers.
    #[error("the program from other peers is unusable: {0}")]
    Assembled(CompileError),
    #[error("the job's resources from {0} do not match their hash")]
    ResourcesHash(Source),
    #[error("the job's resources from {whence} are malformed: {error}")]
    ResourcesMalformed { whence: Source, error: String },
}
