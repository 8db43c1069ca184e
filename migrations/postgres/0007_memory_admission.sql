-- bspweb supernode schema, version 7: memory-aware admission (issue 20,
-- finding 1). `peers.budget_bytes` is the most memory a peer may use for
-- bspweb (its `--memory-budget-mib`; 0: no budget), from its renewals;
-- `jobs.proc_bytes` estimates what one of the job's processes takes on a
-- peer (memory, checkpoints, replicas), computed at submission.
ALTER TABLE peers ADD COLUMN budget_bytes BIGINT NOT NULL DEFAULT 0;
ALTER TABLE jobs ADD COLUMN proc_bytes BIGINT NOT NULL DEFAULT 0;
-- `programs.initial_pages` caches the initial memory of a module (NULL:
-- not known yet, computed at the next submission).
ALTER TABLE programs ADD COLUMN initial_pages BIGINT;
-- A row the supernode writes to find out whether its disk takes writes
-- again after it took none.
CREATE TABLE storage_probe (id BIGINT PRIMARY KEY, at BIGINT NOT NULL);
