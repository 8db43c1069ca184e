-- bspweb supernode schema, version 7: memory-aware admission (issue 20,
-- finding 1). `peers.budget_bytes` is the most memory a peer may use for
-- bspweb (its `--memory-budget-mib`; 0: no budget), from its renewals;
-- `jobs.proc_bytes` estimates what one of the job's processes takes on a
-- peer (memory, checkpoints, replicas), computed at submission.
ALTER TABLE peers ADD COLUMN budget_bytes INTEGER NOT NULL DEFAULT 0;
ALTER TABLE jobs ADD COLUMN proc_bytes INTEGER NOT NULL DEFAULT 0;
