-- bspweb supernode schema, version 9: peer enrollment (issue 18).
-- A volunteer's account creates enrollment tokens; a peer logs in with one
-- and is that account's. Only the SHA-256 of a token's 256-bit secret is
-- stored.
CREATE TABLE enrollments (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    owner        INTEGER NOT NULL REFERENCES users(id),
    name         TEXT    NOT NULL,
    secret_hash  BLOB    NOT NULL,
    created_at   INTEGER NOT NULL,
    last_used_at INTEGER,
    revoked_at   INTEGER
);
CREATE INDEX enrollments_owner ON enrollments (owner);
-- The token a peer logged in with (NULL for peers of older versions).
ALTER TABLE peers ADD COLUMN enrollment INTEGER REFERENCES enrollments(id);
-- Disabled by its volunteer or an administrator: a login under the same
-- name with the same token is refused until it is enabled again.
ALTER TABLE peers ADD COLUMN disabled INTEGER NOT NULL DEFAULT 0 CHECK (disabled IN (0, 1));
CREATE INDEX peers_enrollment ON peers (enrollment, name);
