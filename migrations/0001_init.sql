-- bspweb supernode schema, version 1.
-- Applied by the supernode at start; `PRAGMA user_version` records how many
-- numbered migration files have been applied. Times are Unix milliseconds.

CREATE TABLE users (
    id            INTEGER PRIMARY KEY,
    name          TEXT    NOT NULL UNIQUE,
    -- PHC string of an Argon2id hash.
    password_hash TEXT    NOT NULL,
    admin         INTEGER NOT NULL DEFAULT 0 CHECK (admin IN (0, 1)),
    created_at    INTEGER NOT NULL
);

-- Validated modules, content-addressed by the hex SHA-256 of their bytes.
CREATE TABLE programs (
    hash       TEXT    PRIMARY KEY CHECK (length(hash) = 64),
    bytes      BLOB    NOT NULL,
    size       INTEGER NOT NULL,
    created_at INTEGER NOT NULL
);

-- Names of programs. `owner` is NULL for the built-in examples every user can run.
CREATE TABLE program_names (
    id          INTEGER PRIMARY KEY,
    owner       INTEGER REFERENCES users(id) ON DELETE CASCADE,
    name        TEXT    NOT NULL,
    hash        TEXT    NOT NULL REFERENCES programs(hash),
    description TEXT,
    updated_at  INTEGER NOT NULL
);
-- One name per owner; builtins (owner NULL) share the key 0, which no user has.
CREATE UNIQUE INDEX program_names_owner_name ON program_names (coalesce(owner, 0), name);

-- Which user uploaded which module (named or not): a user may run by hash only
-- what they uploaded themselves or a builtin.
CREATE TABLE program_uploads (
    owner       INTEGER NOT NULL REFERENCES users(id) ON DELETE CASCADE,
    hash        TEXT    NOT NULL REFERENCES programs(hash),
    uploaded_at INTEGER NOT NULL,
    PRIMARY KEY (owner, hash)
);

CREATE TABLE peers (
    id               INTEGER PRIMARY KEY AUTOINCREMENT,
    name             TEXT    NOT NULL,
    addr             TEXT    NOT NULL,
    speed            REAL    NOT NULL,
    idle             REAL    NOT NULL,
    cores            INTEGER NOT NULL,
    -- Golden-ratio index of the peer's DHHT position while online (§4.2.4).
    golden           INTEGER,
    -- Random id of the current lease; a lease token names it, so tokens of an
    -- earlier lease of the same peer id stop working.
    lease_id         TEXT    NOT NULL,
    lease_expires_at INTEGER NOT NULL,
    state            TEXT    NOT NULL CHECK (state IN ('online', 'gone')),
    -- Sequence number of the last control command queued for the peer.
    cmd_seq          INTEGER NOT NULL DEFAULT 0,
    first_seen       INTEGER NOT NULL,
    last_seen        INTEGER NOT NULL
);
CREATE INDEX peers_state ON peers (state);

CREATE TABLE jobs (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    owner        INTEGER NOT NULL REFERENCES users(id),
    -- The program as the user named it (a name or a hash), and what it resolved to.
    program      TEXT    NOT NULL,
    program_hash TEXT    NOT NULL REFERENCES programs(hash),
    nprocs       INTEGER NOT NULL CHECK (nprocs >= 1),
    args         TEXT    NOT NULL,
    description  TEXT,
    -- The u64 seed, stored as its two's-complement i64 bits.
    seed         INTEGER NOT NULL,
    superstep_ms INTEGER NOT NULL,
    memory_mib   INTEGER NOT NULL,
    output_mib   INTEGER NOT NULL,
    state        TEXT    NOT NULL CHECK (state IN ('waiting', 'active', 'finished')),
    outcome      TEXT    CHECK (outcome IN ('exited', 'aborted', 'failed', 'killed')),
    error        TEXT,
    error_pid    INTEGER,
    submitted_at INTEGER NOT NULL,
    started_at   INTEGER,
    finished_at  INTEGER,
    -- Secret the peers of the job show each other; set when the job is placed.
    job_token    TEXT,
    exited       INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX jobs_owner ON jobs (owner, id);
CREATE INDEX jobs_state ON jobs (state, id);

CREATE TABLE job_resources (
    job  INTEGER NOT NULL REFERENCES jobs(id) ON DELETE CASCADE,
    name TEXT    NOT NULL,
    data BLOB    NOT NULL,
    PRIMARY KEY (job, name)
);

-- Where each process of an active or finished job runs, and the golden index
-- of its DHHT position (held while the job is active).
CREATE TABLE placements (
    job      INTEGER NOT NULL REFERENCES jobs(id) ON DELETE CASCADE,
    pid      INTEGER NOT NULL,
    peer_id  INTEGER NOT NULL REFERENCES peers(id),
    position INTEGER NOT NULL,
    PRIMARY KEY (job, pid)
);
CREATE INDEX placements_peer ON placements (peer_id, job);

-- A job's event stream. `seq` is the output record number for output events
-- (-1 for a process's exit, so a repeated exit report counts once) and NULL
-- otherwise; a repeated `(job, pid, seq)` is stored once.
CREATE TABLE events (
    id      INTEGER PRIMARY KEY AUTOINCREMENT,
    job     INTEGER NOT NULL REFERENCES jobs(id) ON DELETE CASCADE,
    pid     INTEGER,
    kind    TEXT    NOT NULL,
    seq     INTEGER,
    payload TEXT    NOT NULL,
    at      INTEGER NOT NULL,
    UNIQUE (job, pid, seq)
);
CREATE INDEX events_job ON events (job, id);
