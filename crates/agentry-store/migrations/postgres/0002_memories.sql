-- Long-term memory: facts, preferences and decisions, per agent and optionally per user, with a
-- full-text index (a generated tsvector, English stemming, under GIN).

CREATE TABLE memories (
    id         BIGSERIAL PRIMARY KEY,
    agent      TEXT NOT NULL,
    -- '' when the memory belongs to the agent as a whole.
    user_id    TEXT NOT NULL DEFAULT '',
    kind       TEXT NOT NULL,
    text       TEXT NOT NULL,
    -- The text folded for de-duplication (lower case, single spaces, no final punctuation).
    normalized TEXT NOT NULL,
    source_session TEXT,
    created_at BIGINT NOT NULL,
    updated_at BIGINT NOT NULL,
    search     TSVECTOR GENERATED ALWAYS AS (to_tsvector('english', text)) STORED,
    UNIQUE (agent, user_id, normalized)
);

CREATE INDEX memories_by_scope ON memories (agent, user_id, updated_at DESC);
CREATE INDEX memories_search ON memories USING GIN (search);
