-- Every run in a session has a record in `runs`, not only queued (background) ones. A session's
-- run is recorded by the group commit in the same transaction as its `run_started` event and
-- follows the session's status to its end; no worker holds it under a lease (its session's
-- worker fences it), so the queue never claims, renews or counts it. `background` tells them
-- apart: 1 for a run submitted to the queue, 0 for one started in its session directly.
ALTER TABLE runs ADD COLUMN background INTEGER NOT NULL DEFAULT 1;

-- The queue's claims read only background runs: its index leaves the others out, so a run
-- started in its session costs no claim-index write when it is recorded or moves.
DROP INDEX runs_claimable;
CREATE INDEX runs_claimable ON runs (state, priority DESC, created_at) WHERE background = 1;
