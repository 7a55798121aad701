-- The group commit's function again (postgres/0011_group_commit.sql), changed in two places:
-- the runs that fence a batch's writes are locked only when the batch has fenced writes (the
-- lock query ran for every batch, and over no ids it still cost about 74 µs, a tenth of the
-- whole call: pg_stat_statements with `track = all`, `postgres durable 20` in the runs bench),
-- and its statements are planned once per connection, not at every call (see `SET` below).
-- Everything else is as in migration 11, whose comment describes the function.
CREATE OR REPLACE FUNCTION agentry_group_commit(
    w_session TEXT[], w_expected BIGINT[], w_count BIGINT[], w_now BIGINT[], w_status TEXT[],
    w_worker TEXT[], w_lease_run TEXT[], w_lease_worker TEXT[], w_lease_epoch BIGINT[],
    w_create BOOLEAN[], c_title TEXT[], c_expires BIGINT[], c_metadata TEXT[], c_owner TEXT[],
    e_write INT[], e_offset BIGINT[], e_kind TEXT[], e_payload TEXT[],
    u_write INT[], u_offset BIGINT[], u_run TEXT[], u_agent TEXT[], u_model TEXT[],
    u_input BIGINT[], u_cached BIGINT[], u_creation BIGINT[], u_output BIGINT[],
    u_reasoning BIGINT[], u_cost BIGINT[],
    m_write INT[], m_run TEXT[], m_started BOOLEAN[], m_agent TEXT[], m_state TEXT[],
    m_final BOOLEAN[],
    OUT last_seqs BIGINT[], OUT refusals TEXT[]
) LANGUAGE plpgsql
-- Its statements run with generic plans. With the default, PostgreSQL planned the inserts from
-- `unnest` of the arrays again at every call (a generic plan assumes 10 rows from `unnest`,
-- so it never looked cheaper than a plan for the actual few): about a tenth of the backend's
-- CPU, found with `perf` on the backends. The generic plans use the same indexes.
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    n INT := COALESCE(array_length(w_session, 1), 0);
    i INT;
    v_last BIGINT;
    v_worker TEXT;
BEGIN
    last_seqs := array_fill(NULL::BIGINT, ARRAY[n]);
    refusals := array_fill(NULL::TEXT, ARRAY[n]);
    FOR i IN 1..n LOOP
        CONTINUE WHEN NOT w_create[i];
        INSERT INTO sessions (id, title, status, created_at, last_activity, last_seq, read_seq,
                              expires_at, metadata, owner)
        VALUES (w_session[i], c_title[i], 'idle', w_now[i], w_now[i], 0, 0, c_expires[i],
                c_metadata[i], c_owner[i])
        ON CONFLICT (id) DO NOTHING;
        IF FOUND THEN
            last_seqs[i] := 0;
        ELSE
            refusals[i] := 'exists';
        END IF;
    END LOOP;
    -- The runs the writes are fenced by are locked first, all at once and in id order, as the
    -- lease renewal locks them: the two never wait on each other in a cycle. Only when some
    -- write is fenced: the query costs as much over no ids as over a few.
    IF cardinality(array_remove(w_lease_run, NULL)) > 0 THEN
        PERFORM 1 FROM runs WHERE id = ANY (w_lease_run) ORDER BY id FOR SHARE;
    END IF;
    FOR i IN 1..n LOOP
        CONTINUE WHEN refusals[i] IS NOT NULL
            OR (w_create[i] AND w_count[i] = 0 AND w_status[i] IS NULL);
        IF w_lease_run[i] IS NOT NULL THEN
            PERFORM 1 FROM runs
            WHERE id = w_lease_run[i] AND state = 'running' AND worker = w_lease_worker[i]
              AND lease_epoch = w_lease_epoch[i]
            FOR SHARE;
            IF NOT FOUND THEN
                refusals[i] := 'lease';
                CONTINUE;
            END IF;
        END IF;
        UPDATE sessions SET
            last_seq = last_seq + w_count[i],
            last_activity = CASE WHEN w_count[i] > 0 THEN w_now[i] ELSE last_activity END,
            status = COALESCE(w_status[i], status),
            worker = CASE WHEN w_status[i] IS NULL THEN worker
                          WHEN w_status[i] = 'running' THEN w_worker[i] ELSE NULL END
        WHERE id = w_session[i]
          AND (w_expected[i] IS NULL OR last_seq = w_expected[i])
          AND (worker IS NULL OR worker = w_worker[i])
        RETURNING last_seq INTO v_last;
        IF FOUND THEN
            last_seqs[i] := v_last;
            CONTINUE;
        END IF;
        SELECT last_seq, worker INTO v_last, v_worker FROM sessions WHERE id = w_session[i];
        IF NOT FOUND THEN
            refusals[i] := 'missing';
        ELSIF v_worker IS NOT NULL AND v_worker IS DISTINCT FROM w_worker[i] THEN
            refusals[i] := 'held ' || v_worker;
        ELSE
            refusals[i] := 'seq ' || v_last;
        END IF;
    END LOOP;
    -- An event's seq: its write's last seq, less the write's count, plus its place (from 1).
    INSERT INTO events (session_id, seq, kind, payload, created_at)
    SELECT w_session[e.w], last_seqs[e.w] - w_count[e.w] + e.k, e.kind, e.payload, w_now[e.w]
    FROM unnest(e_write, e_offset, e_kind, e_payload) AS e (w, k, kind, payload)
    WHERE last_seqs[e.w] IS NOT NULL;
    INSERT INTO usage_records (session_id, seq, run_id, agent_id, model, input_tokens,
                               cached_input_tokens, cache_creation_input_tokens, output_tokens,
                               reasoning_tokens, cost_nanos, created_at, owner)
    SELECT w_session[u.w], last_seqs[u.w] - w_count[u.w] + u.k, u.run, u.agent, u.model,
           u.input, u.cached, u.creation, u.output, u.reasoning, u.cost, w_now[u.w],
           (SELECT owner FROM sessions WHERE id = w_session[u.w])
    FROM unnest(u_write, u_offset, u_run, u_agent, u_model, u_input, u_cached, u_creation,
                u_output, u_reasoning, u_cost)
         AS u (w, k, run, agent, model, input, cached, creation, output, reasoning, cost)
    WHERE last_seqs[u.w] IS NOT NULL;
    -- The records of runs started in their sessions, mark by mark: a record that ended stays
    -- ended, so a run's first final state wins, else its last.
    FOR i IN 1..COALESCE(array_length(m_write, 1), 0) LOOP
        CONTINUE WHEN last_seqs[m_write[i]] IS NULL;
        IF m_started[i] THEN
            INSERT INTO runs (id, session_id, agent_id, created_at, started_at, owner, state,
                              request_digest, request, background)
            VALUES (m_run[i], w_session[m_write[i]], m_agent[i], w_now[m_write[i]],
                    w_now[m_write[i]],
                    (SELECT owner FROM sessions WHERE id = w_session[m_write[i]]),
                    'running', '', 'null', 0)
            ON CONFLICT (id) DO NOTHING;
        ELSE
            UPDATE runs SET
                state = m_state[i],
                finished_at = CASE WHEN m_final[i] THEN w_now[m_write[i]] ELSE finished_at END
            WHERE id = m_run[i] AND background = 0
              AND state NOT IN ('succeeded', 'failed', 'cancelled');
        END IF;
    END LOOP;
END
$$;
