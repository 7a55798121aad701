-- The run queue and schedules. Every background run is a durable record that workers claim under a lease.
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
    -- The schedule that fired it.
    schedule_id     TEXT,
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
CREATE INDEX runs_by_schedule ON runs (schedule_id, created_at DESC) WHERE schedule_id IS NOT NULL;
-- One key per submitter: the same key returns the same run.
CREATE UNIQUE INDEX runs_by_idempotency_key ON runs (COALESCE(owner, ''), idempotency_key)
    WHERE idempotency_key IS NOT NULL;

-- Schedules: a cron expression in a time zone, or an interval, and the run each fire submits.
-- A fire submits its run with the idempotency key `schedule:<id>:<slot>`, so one slot never
-- fires twice, whichever process (or how many) sees it due.
CREATE TABLE schedules (
    id            TEXT PRIMARY KEY NOT NULL,
    name          TEXT NOT NULL,
    owner         TEXT,
    cron          TEXT,
    timezone      TEXT NOT NULL DEFAULT 'UTC',
    interval_secs BIGINT,
    -- What each fire submits: the body of POST /v1/runs.
    request       TEXT NOT NULL,
    enabled       BIGINT NOT NULL DEFAULT 1,
    -- After downtime: `skip` the missed slots, or run `once` for them.
    catch_up      TEXT NOT NULL DEFAULT 'skip',
    -- When the previous run still goes: `skip` this slot, `queue` it, or `cancel` the previous.
    overlap       TEXT NOT NULL DEFAULT 'skip',
    next_fire_at  BIGINT,
    last_fire_at  BIGINT,
    last_run_id   TEXT,
    created_at    BIGINT NOT NULL,
    updated_at    BIGINT NOT NULL,
    CHECK ((cron IS NULL) <> (interval_secs IS NULL))
);

CREATE INDEX schedules_due ON schedules (next_fire_at) WHERE enabled = 1;
