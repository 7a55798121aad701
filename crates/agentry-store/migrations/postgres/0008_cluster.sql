-- Several nodes on one database. Each `agentry serve` is a node with a heartbeat row; a node
-- that misses its lease is dead and the others take its runs. `incarnation` is the process (a
-- node restarted under the same id is a new incarnation): leases name it as their worker, so a
-- restarted node never renews the leases its previous process left behind.
CREATE TABLE nodes (
    id            TEXT PRIMARY KEY NOT NULL,
    incarnation   TEXT NOT NULL,
    address       TEXT NOT NULL,
    version       TEXT NOT NULL,
    started_at    BIGINT NOT NULL,
    heartbeat_at  BIGINT NOT NULL,
    -- How long after its last heartbeat the node counts as dead.
    lease_ms      BIGINT NOT NULL,
    running_runs  BIGINT NOT NULL DEFAULT 0,
    max_runs      BIGINT NOT NULL DEFAULT 0,
    -- The machine's load average over a minute, in thousandths (NULL: unknown).
    load_milli    BIGINT,
    -- The volume its sessions' workspaces are on (the id in `<workspaces>/.agentry-volume`):
    -- a node takes over the runs of a dead node only on the same volume, where their files are.
    volume        TEXT,
    -- Set when the node stopped cleanly.
    stopped_at    BIGINT
);

-- The configuration's generation: every change to what the runtime is built from (models,
-- tools, MCP servers, skills, templates, agents, API keys, secrets) bumps it, in the same
-- transaction, so every node sees a change and rebuilds within its poll.
CREATE TABLE config_generation (
    id         BIGINT PRIMARY KEY NOT NULL CHECK (id = 1),
    generation BIGINT NOT NULL
);
INSERT INTO config_generation (id, generation) VALUES (1, 0);

CREATE FUNCTION agentry_config_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE config_generation SET generation = generation + 1 WHERE id = 1;
    RETURN NULL;
END
$$;

CREATE TRIGGER config_changed_insert AFTER INSERT ON config FOR EACH ROW
    WHEN (NEW.kind NOT IN ('workflow', 'workflow_run'))
    EXECUTE FUNCTION agentry_config_changed();
CREATE TRIGGER config_changed_update AFTER UPDATE ON config FOR EACH ROW
    WHEN (NEW.kind NOT IN ('workflow', 'workflow_run') OR OLD.kind NOT IN ('workflow', 'workflow_run'))
    EXECUTE FUNCTION agentry_config_changed();
CREATE TRIGGER config_changed_delete AFTER DELETE ON config FOR EACH ROW
    WHEN (OLD.kind NOT IN ('workflow', 'workflow_run'))
    EXECUTE FUNCTION agentry_config_changed();
CREATE TRIGGER secrets_changed AFTER INSERT OR UPDATE OR DELETE ON secrets FOR EACH ROW
    EXECUTE FUNCTION agentry_config_changed();

-- The process running a session's run: set by the write that makes the session `running`,
-- cleared by the write that sets any other status. Meanwhile other processes' writes to it are
-- refused, and when its process dies another node takes the session over and resumes its run.
ALTER TABLE sessions ADD COLUMN worker TEXT;
CREATE INDEX sessions_running ON sessions (worker) WHERE status = 'running';
