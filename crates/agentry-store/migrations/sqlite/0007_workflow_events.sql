-- Workflows: each transition of a run's steps (started, retried, waiting, ended) is one small
-- event appended here, so a step costs a row instead of a rewrite of the run's document. The
-- document is a snapshot (written when the run itself changes: started, waiting, ended) that
-- names the last event it includes; the run now is the snapshot with the later events applied.
-- (run_id, seq) is the key: two drivers of one run cannot both append the same next event.
CREATE TABLE workflow_events (
    run_id TEXT NOT NULL,
    seq    INTEGER NOT NULL,
    at     INTEGER NOT NULL,
    event  TEXT NOT NULL,
    PRIMARY KEY (run_id, seq)
);
