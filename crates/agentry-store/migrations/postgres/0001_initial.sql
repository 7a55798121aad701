-- Sessions, their append-only event log, configuration and sealed secrets (PostgreSQL).
-- Times are Unix milliseconds; session ids are canonical UUIDv7 text. Payloads are kept as the
-- exact JSON text appended (the store never interprets them).

CREATE TABLE sessions (
    id            TEXT PRIMARY KEY,
    title         TEXT,
    status        TEXT NOT NULL DEFAULT 'idle',
    created_at    BIGINT NOT NULL,
    last_activity BIGINT NOT NULL,
    last_seq      BIGINT NOT NULL DEFAULT 0,
    read_seq      BIGINT NOT NULL DEFAULT 0,
    -- A fork's history starts with parent_id's events up to and including parent_seq.
    parent_id     TEXT REFERENCES sessions (id),
    parent_seq    BIGINT,
    expires_at    BIGINT,
    metadata      TEXT NOT NULL DEFAULT '{}',
    CHECK ((parent_id IS NULL) = (parent_seq IS NULL))
);

CREATE INDEX sessions_by_activity ON sessions (last_activity DESC, id DESC);
CREATE INDEX sessions_by_parent ON sessions (parent_id) WHERE parent_id IS NOT NULL;
CREATE INDEX sessions_by_expiry ON sessions (expires_at) WHERE expires_at IS NOT NULL;

-- Only ever inserted into (and deleted with the session); never updated.
CREATE TABLE events (
    session_id TEXT NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
    seq        BIGINT NOT NULL,
    kind       TEXT NOT NULL,
    payload    TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    PRIMARY KEY (session_id, seq)
);

CREATE TABLE config (
    kind       TEXT NOT NULL,
    name       TEXT NOT NULL,
    value      TEXT NOT NULL,
    updated_at BIGINT NOT NULL,
    PRIMARY KEY (kind, name)
);

-- sealed = version byte, 24-byte nonce, XChaCha20-Poly1305 ciphertext and tag.
CREATE TABLE secrets (
    name       TEXT PRIMARY KEY,
    sealed     BYTEA NOT NULL,
    updated_at BIGINT NOT NULL
);
