-- What each model call of a run without a session used and cost (a stateless run: `/v1/infer`
-- without a session, OpenAI chat without `x-agentry-session-id`, Responses with `store: false`),
-- charged to the API key that started it. One row per call, keyed by its run and round. The
-- ledger every report, budget and quota reads is `usage_ledger`: these rows beside the
-- session runs' `usage_records` (whose session_id they lack).
CREATE TABLE run_usage (
    run_id                      TEXT NOT NULL,
    round                       BIGINT NOT NULL,
    agent_id                    TEXT,
    owner                       TEXT,
    model                       TEXT NOT NULL,
    input_tokens                BIGINT NOT NULL,
    cached_input_tokens         BIGINT NOT NULL,
    cache_creation_input_tokens BIGINT NOT NULL,
    output_tokens               BIGINT NOT NULL,
    reasoning_tokens            BIGINT NOT NULL,
    cost_nanos                  BIGINT,
    created_at                  BIGINT NOT NULL,
    PRIMARY KEY (run_id, round)
);

CREATE INDEX run_usage_by_time ON run_usage (created_at);
CREATE INDEX run_usage_by_agent ON run_usage (agent_id, created_at) WHERE agent_id IS NOT NULL;
CREATE INDEX run_usage_by_owner ON run_usage (owner, created_at);

CREATE VIEW usage_ledger AS
    SELECT session_id, run_id, agent_id, owner, model, input_tokens, cached_input_tokens,
           cache_creation_input_tokens, output_tokens, reasoning_tokens, cost_nanos, created_at
    FROM usage_records
    UNION ALL
    SELECT CAST(NULL AS TEXT), run_id, agent_id, owner, model, input_tokens, cached_input_tokens,
           cache_creation_input_tokens, output_tokens, reasoning_tokens, cost_nanos, created_at
    FROM run_usage;

-- The sessions a key created lately, read by its `sessions_per_minute` quota on every node.
CREATE INDEX sessions_by_owner_created ON sessions (owner, created_at);
