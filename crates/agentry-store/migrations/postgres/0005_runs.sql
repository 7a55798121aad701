-- The run queue: every background run is a durable record that workers claim under a lease.
-- `lease_epoch` grows with every claim, so a worker whose lease was taken over (it stalled, or
-- its process died) is refused when it renews or finishes: the fence.

CREATE TABLE runs (
    id              TEXT PRIMARY KEY NOT NULL,
    session_id      TEXT NOT NULL,
    agent_id        TEXT,
    -- The API key that submitted it (NULL: the operator).
    owner           TEXT,
    -- queued, running, waiting, paused, succeeded, failed, cancelled
    state           TEXT NOT NULL,
    priority        BIGINT NOT NULL DEFAULT 0,
    attempt         BIGINT NOT NULL DEFAULT 0,
    worker          TEXT,
    lease_until     BIGINT,
    lease_epoch     BIGINT NOT NULL DEFAULT 0,
    idempotency_key TEXT,
    request_digest  TEXT NOT NULL,
    request         TEXT NOT NULL,
    outcome         TEXT,
    cancel_requested BIGINT NOT NULL DEFAULT 0,
    created_at      BIGINT NOT NULL,
    started_at      BIGINT,
    finished_at     BIGINT
);

CREATE INDEX runs_claimable ON runs (state, priority DESC, created_at);
CREATE INDEX runs_by_session ON runs (session_id, created_at DESC);
CREATE INDEX runs_by_created ON runs (created_at DESC, id DESC);
-- One key per submitter: the same key returns the same run.
CREATE UNIQUE INDEX runs_by_idempotency_key ON runs (COALESCE(owner, ''), idempotency_key)
    WHERE idempotency_key IS NOT NULL;
