-- Long-term memory: facts, preferences and decisions, per agent and optionally per user, with a
-- full-text index (FTS5, Porter stemming over unicode61) kept in step by triggers.

CREATE TABLE memories (
    id         INTEGER PRIMARY KEY AUTOINCREMENT,
    agent      TEXT NOT NULL,
    -- '' when the memory belongs to the agent as a whole.
    user_id    TEXT NOT NULL DEFAULT '',
    kind       TEXT NOT NULL,
    text       TEXT NOT NULL,
    -- The text folded for de-duplication (lower case, single spaces, no final punctuation).
    normalized TEXT NOT NULL,
    source_session TEXT,
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL,
    UNIQUE (agent, user_id, normalized)
);

CREATE INDEX memories_by_scope ON memories (agent, user_id, updated_at DESC);

CREATE VIRTUAL TABLE memories_fts USING fts5 (
    text,
    content = 'memories',
    content_rowid = 'id',
    tokenize = 'porter unicode61'
);

CREATE TRIGGER memories_fts_insert AFTER INSERT ON memories BEGIN
    INSERT INTO memories_fts (rowid, text) VALUES (new.id, new.text);
END;

CREATE TRIGGER memories_fts_delete AFTER DELETE ON memories BEGIN
    INSERT INTO memories_fts (memories_fts, rowid, text) VALUES ('delete', old.id, old.text);
END;

CREATE TRIGGER memories_fts_update AFTER UPDATE OF text ON memories BEGIN
    INSERT INTO memories_fts (memories_fts, rowid, text) VALUES ('delete', old.id, old.text);
    INSERT INTO memories_fts (rowid, text) VALUES (new.id, new.text);
END;
