-- bspweb supernode schema, version 5: what a peer's memory holds, from its
-- last renewal (resident bytes, and bytes its jobs hold for fault tolerance).
ALTER TABLE peers ADD COLUMN rss_bytes BIGINT NOT NULL DEFAULT 0;
ALTER TABLE peers ADD COLUMN held_bytes BIGINT NOT NULL DEFAULT 0;
