-- bspweb supernode schema, version 10: result validation by redundancy
-- (issue 18). A job may run each process as `redundancy` copies on peers
-- of different volunteers; what the copies produce must agree.

-- Copies of each process (JobLimits::redundancy): 1 or 2.
ALTER TABLE jobs ADD COLUMN redundancy BIGINT NOT NULL DEFAULT 1 CHECK (redundancy >= 1);

-- `placements.pid` holds the *slot* `c * nprocs + pid` of copy `c` of `pid`
-- (the slot is the pid itself with one copy), so a job has `nprocs *
-- redundancy` rows, in the order of `JobAssignment::placement`.

-- Every peer that was ever a peer of a job, so a disagreement report that
-- names a peer which has left the job since is still understood.
CREATE TABLE job_peer_history (
    job     BIGINT NOT NULL REFERENCES jobs(id) ON DELETE CASCADE,
    peer_id BIGINT NOT NULL,
    PRIMARY KEY (job, peer_id)
);
INSERT INTO job_peer_history (job, peer_id) SELECT job, peer_id FROM job_peers
    ON CONFLICT DO NOTHING;
INSERT INTO job_peer_history (job, peer_id)
    SELECT job, moved_from FROM placements WHERE moved_from IS NOT NULL
    ON CONFLICT DO NOTHING;

-- The first copy of an output record (`seq` >= 0) or of an exit (`seq` =
-- -1) of a process with redundancy, held until a copy from another peer
-- agrees. `payload` is the JSON of the event it would publish; identical
-- copies have identical payloads.
CREATE TABLE held_copies (
    job     BIGINT NOT NULL REFERENCES jobs(id) ON DELETE CASCADE,
    pid     BIGINT NOT NULL,
    seq     BIGINT NOT NULL,
    peer_id BIGINT NOT NULL,
    payload TEXT    NOT NULL,
    bytes   BIGINT NOT NULL,
    at      BIGINT NOT NULL,
    PRIMARY KEY (job, pid, seq, peer_id)
);
CREATE INDEX held_copies_peer ON held_copies (peer_id);

-- Supersteps at which the copies of a process disagreed without a quorum:
-- told once, and a third run started once.
CREATE TABLE disagreements (
    job       BIGINT NOT NULL REFERENCES jobs(id) ON DELETE CASCADE,
    pid       BIGINT NOT NULL,
    superstep BIGINT NOT NULL,
    at        BIGINT NOT NULL,
    PRIMARY KEY (job, pid, superstep)
);

-- A peer whose result two peers of other volunteers outvoted: it is also
-- disabled (fenced, and refused at login), and only an administrator may
-- enable it again, which clears these.
ALTER TABLE peers ADD COLUMN quarantined_at BIGINT;
ALTER TABLE peers ADD COLUMN quarantine_reason TEXT;
