-- Who a session belongs to: the id of the API key that created it (NULL: the operator, or a
-- server without keys). A non-admin key sees only its own sessions.
ALTER TABLE sessions ADD COLUMN owner TEXT;
CREATE INDEX sessions_by_owner ON sessions (owner, last_activity DESC);
