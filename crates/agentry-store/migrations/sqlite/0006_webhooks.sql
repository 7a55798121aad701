-- Webhooks: a background run may name a URL that hears when it stops. Each (run, event, URL)
-- gets one delivery with one id for good, kept in this outbox until it is delivered or given
-- up, so a restart neither loses nor duplicates it; every attempt is logged.

ALTER TABLE runs ADD COLUMN webhook_url TEXT;
-- At most this many runs of its agent run at once (the agent's `limits.max_concurrent_runs`).
ALTER TABLE runs ADD COLUMN agent_limit INTEGER;

CREATE TABLE webhook_deliveries (
    id              TEXT PRIMARY KEY NOT NULL,
    run_id          TEXT NOT NULL,
    event           TEXT NOT NULL,
    url             TEXT NOT NULL,
    payload         TEXT NOT NULL,
    -- pending, delivered, failed
    state           TEXT NOT NULL DEFAULT 'pending',
    attempts        INTEGER NOT NULL DEFAULT 0,
    next_attempt_at INTEGER NOT NULL,
    last_status     INTEGER,
    last_error      TEXT,
    created_at      INTEGER NOT NULL,
    delivered_at    INTEGER,
    UNIQUE (run_id, event, url)
);

CREATE INDEX webhook_deliveries_due ON webhook_deliveries (next_attempt_at)
    WHERE state = 'pending';

CREATE TABLE webhook_attempts (
    delivery_id TEXT NOT NULL REFERENCES webhook_deliveries (id) ON DELETE CASCADE,
    attempt     INTEGER NOT NULL,
    at          INTEGER NOT NULL,
    status      INTEGER,
    error       TEXT,
    duration_ms INTEGER NOT NULL,
    PRIMARY KEY (delivery_id, attempt)
);
