-- What each model call used and cost: one row per assistant message, written in the same
-- transaction as the message's event, so the ledger and the log never disagree. No foreign key:
-- the record outlives its session (deleting a conversation does not undo what it spent). The
-- owner is the session's (the API key it is charged to; NULL: the operator). cost_nanos is
-- billionths of a US dollar; NULL when the model had no price.
CREATE TABLE usage_records (
    session_id                  TEXT NOT NULL,
    seq                         INTEGER NOT NULL,
    run_id                      TEXT NOT NULL,
    agent_id                    TEXT,
    owner                       TEXT,
    model                       TEXT NOT NULL,
    input_tokens                INTEGER NOT NULL,
    cached_input_tokens         INTEGER NOT NULL,
    cache_creation_input_tokens INTEGER NOT NULL,
    output_tokens               INTEGER NOT NULL,
    reasoning_tokens            INTEGER NOT NULL,
    cost_nanos                  INTEGER,
    created_at                  INTEGER NOT NULL,
    PRIMARY KEY (session_id, seq)
);

CREATE INDEX usage_by_time ON usage_records (created_at);
CREATE INDEX usage_by_agent ON usage_records (agent_id, created_at) WHERE agent_id IS NOT NULL;
CREATE INDEX usage_by_owner ON usage_records (owner, created_at);
