-- bspweb supernode schema, version 2: fault tolerance (docs/fault-tolerance.md).
-- Epochs of job assignments, the job's peer list (with checkpoint replicas),
-- where each process came from, draining peers, DHHT power with hysteresis,
-- and command queues that survive a restart.

-- Configuration epoch of the job's assignment: +1 at every change of its
-- peers or placement (a peer lost, a process migrating, a peer leaving).
ALTER TABLE jobs ADD COLUMN epoch BIGINT NOT NULL DEFAULT 0;
-- Job limits added with checkpoints (JobLimits::checkpoint_every, ::replicas).
ALTER TABLE jobs ADD COLUMN checkpoint_every BIGINT NOT NULL DEFAULT 1;
ALTER TABLE jobs ADD COLUMN replicas BIGINT NOT NULL DEFAULT 2;
-- When the job's last migration epoch was sent (rate limit), Unix ms.
ALTER TABLE jobs ADD COLUMN migrated_at BIGINT;

-- A draining peer gets no new processes and sees its processes migrate away.
ALTER TABLE peers ADD COLUMN draining BIGINT NOT NULL DEFAULT 0 CHECK (draining IN (0, 1));
-- The weight the DHHT uses for the peer (speed × idle, updated with
-- hysteresis); NULL: derive it from `speed` and `idle`.
ALTER TABLE peers ADD COLUMN power DOUBLE PRECISION;

-- The last move of a process: in epoch `moved_epoch` it left `moved_from`,
-- because that peer was lost (`lost`) or to migrate (`migrate`). A migrating
-- process is still run by its old host until that host reports the handover
-- (`handed_over` = 1).
ALTER TABLE placements ADD COLUMN moved_epoch BIGINT;
ALTER TABLE placements ADD COLUMN moved_from BIGINT;
ALTER TABLE placements ADD COLUMN moved_kind TEXT CHECK (moved_kind IN ('lost', 'migrate'));
ALTER TABLE placements ADD COLUMN handed_over BIGINT NOT NULL DEFAULT 0 CHECK (handed_over IN (0, 1));
CREATE INDEX placements_moved_from ON placements (moved_from) WHERE moved_from IS NOT NULL;

-- The peers of a job, in the order of `JobAssignment::peers`: the hosts of
-- its processes and replica-only peers that hold checkpoints.
CREATE TABLE job_peers (
    job     BIGINT NOT NULL REFERENCES jobs(id) ON DELETE CASCADE,
    peer_id BIGINT NOT NULL REFERENCES peers(id),
    ord     BIGINT NOT NULL,
    PRIMARY KEY (job, peer_id)
);
CREATE INDEX job_peers_peer ON job_peers (peer_id, job);
INSERT INTO job_peers (job, peer_id, ord)
    SELECT job, peer_id, min(pid) FROM placements GROUP BY job, peer_id;

-- Control commands queued for a peer and not yet acknowledged by a long poll
-- with a larger `after`. `body` is the JSON of `bsp_api::control::Command`.
CREATE TABLE commands (
    peer_id BIGINT NOT NULL REFERENCES peers(id),
    seq     BIGINT NOT NULL,
    body    TEXT    NOT NULL,
    PRIMARY KEY (peer_id, seq)
);

-- Events: `seq` is also -2 - e for the rolled-back or migrated event of a
-- process moved in epoch e, so a repeated ProcessRestored report counts once.
-- Event ids come from an identity column and so keep increasing across restarts
-- and disposals.
