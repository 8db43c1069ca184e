-- bspweb supernode schema, version 3: per-process progress for displays.
-- The number of supersteps (syncs) the process has completed, as last
-- reported by its peer (`PeerEvent::Progress`, `ProcessExited`, ...).
ALTER TABLE placements ADD COLUMN superstep BIGINT NOT NULL DEFAULT 0;
