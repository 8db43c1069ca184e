-- bspweb supernode schema, version 6: output stored as bytes, and counted.
-- Output events (stdout, stderr, raw) keep their bytes in `data` and an
-- empty `payload` (JSON escaping made NUL-heavy output ~6x larger, base64
-- raw output 4/3x); other events keep their JSON payload and no `data`.
-- `jobs.output_bytes` counts the output bytes a job stored, for the
-- per-user storage quota.
ALTER TABLE events ADD COLUMN data BYTEA;
ALTER TABLE jobs ADD COLUMN output_bytes BIGINT NOT NULL DEFAULT 0;
-- What the jobs stored before count as well (their JSON payload's size).
UPDATE jobs SET output_bytes = (
    SELECT coalesce(sum(length(payload)), 0) FROM events
    WHERE events.job = jobs.id AND kind IN ('stdout', 'stderr', 'raw'));
