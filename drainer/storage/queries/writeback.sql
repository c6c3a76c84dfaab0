-- Writing back a batch, and the heartbeat. Writes after the claim are all guarded by
-- id AND status = 'running' AND attempts, so a worker can only change a job it still
-- owns. Times come from now(); durations arrive as intervals.
--
-- The batch writes (settle: complete, fail, release; extend) find their rows through the
-- primary key (j.id = ANY(ids)) and compare status with a value that travels with each id
-- (t.status, filled with 'running') instead of the constant: the statistics seldom see
-- a running row, so with `j.status = 'running'` the planner expects one row and joins
-- every running row with every id of the batch, 20 ms instead of 2 for a batch of 500.

-- name: settle
-- Every change of state after the claim, for a whole batch in one statement, guarded:
-- a row changes only while it is still running with the token (id, attempts) this
-- worker claimed it with. Each row carries where it goes: 'done'; 'retry', a failed
-- attempt (queued again after its delay, or failed for good at max_attempts), with its
-- error; 'failed', for good at once (an exception the task does not retry), with its
-- error; 'snooze', queued again after its delay with the attempt not counted: its
-- budget (max_attempts) rises by one, since attempts, the token, is never lowered;
-- 'queued', released unstarted, the attempt given back. A NULL delay is the default
-- backoff least(1 hour, 10 s * 2^attempts). (A heartbeat is `extend`: it changes no
-- state, and sets only locked_until, so a user's UPDATE OF trigger stays quiet.) Returns
-- the rows still ours, with the new run_at of each job queued again, so the log line
-- says when it is due (a done row's run_at may be a time Python cannot hold: not read).
-- A job failed for good gets run_at now, when it failed (archiving judges its age by
-- it: a job that waited past the failed retention must not leave as it fails); a job
-- done gets done_at now (on a table without the column, storage.roundtrip.settle_sql
-- leaves that line out; migration 15 keeps the jobs_done_at trigger out of it). The
-- backoff's exponent is capped before the power (2^9 * 10 s is past the hour
-- already): 10 s * 2^40 overflows, and would fail the whole batch. A NULL
-- max_attempts (a hand-made table may allow it) counts as the column default, 5.
-- Arrays shorter than ids (errors, delays) are padded with NULLs by unnest.
UPDATE jobs j
SET status       = CASE WHEN t.target = 'snooze' THEN 'queued'
                        WHEN t.target <> 'retry' THEN t.target
                        WHEN j.attempts >= coalesce(j.max_attempts, 5) THEN 'failed'
                        ELSE 'queued' END,
    attempts     = CASE WHEN t.target = 'queued' THEN j.attempts - 1 ELSE j.attempts END,
    max_attempts = CASE WHEN t.target = 'snooze'
                        THEN least(coalesce(j.max_attempts, 5)::bigint + 1, 2147483647)::int
                        ELSE j.max_attempts END,
    run_at       = CASE WHEN t.target = 'snooze' OR (
                          t.target = 'retry' AND j.attempts < coalesce(j.max_attempts, 5))
                        THEN coalesce(%(now)s, now()) + coalesce(
                               t.delay, least(interval '1 hour', interval '10 seconds'
                                              * 2 ^ least(greatest(j.attempts, 0), 12)))
                        WHEN t.target IN ('retry', 'failed') THEN coalesce(%(now)s, now())
                        ELSE j.run_at END,
    locked_until = NULL,
    done_at      = CASE WHEN t.target = 'done' THEN now() ELSE j.done_at END,
    last_error   = CASE WHEN t.target IN ('retry', 'failed') THEN t.error
                        ELSE j.last_error END
FROM unnest(%(ids)s::bigint[], %(attempts)s::int[], %(targets)s::text[],
            %(errors)s::text[], %(delays)s::interval[],
            array_fill('running'::text, ARRAY[cardinality(%(ids)s::bigint[])]))
     AS t(id, attempts, target, error, delay, status)
WHERE j.id = ANY(%(ids)s::bigint[])
  AND j.id = t.id AND j.status = t.status AND j.attempts = t.attempts
RETURNING j.id, t.attempts, t.target, j.status,
          CASE WHEN j.status = 'queued' AND t.target <> 'queued' THEN j.run_at END;

-- name: keep_results
-- The return values of jobs whose task keeps results, written just before `settle`
-- marks them done, in the same round trip and guarded the same way (a job no longer
-- ours keeps what it had). Sent only when the batch has results to keep.
UPDATE jobs j
SET result = t.result
FROM unnest(%(ids)s::bigint[], %(attempts)s::int[], %(results)s::jsonb[],
            array_fill('running'::text, ARRAY[cardinality(%(ids)s::bigint[])]))
     AS t(id, attempts, result, status)
WHERE j.id = ANY(%(ids)s::bigint[])
  AND j.id = t.id AND j.status = t.status AND j.attempts = t.attempts;

-- name: extend
-- Lease heartbeat for jobs still running; returns the claims (id, attempts) still ours.
UPDATE jobs j
SET locked_until = coalesce(%(now)s, now()) + %(lease)s
FROM unnest(%(ids)s::bigint[], %(attempts)s::int[],
            array_fill('running'::text, ARRAY[cardinality(%(ids)s::bigint[])]))
     AS t(id, attempts, status)
WHERE j.id = ANY(%(ids)s::bigint[])
  AND j.id = t.id AND j.status = t.status AND j.attempts = t.attempts
RETURNING j.id, j.attempts;

-- name: extend_cancelled
-- The heartbeat of claims cancelled while running whose handler still runs in this
-- worker: cancelled_running_until is pushed on, as a running job's lease is, so they
-- keep their places while the handler runs; the kept lease too, for the drainers of
-- releases before migration 11 (which read only that form) during an upgrade. Guarded
-- by the claim's token and by the state: one that ended is not revived.
UPDATE jobs j
SET cancelled_running_until = coalesce(%(now)s, now()) + %(lease)s,
    locked_until = coalesce(%(now)s, now()) + %(lease)s
FROM unnest(%(ids)s::bigint[], %(attempts)s::int[]) AS t(id, attempts)
WHERE j.id = ANY(%(ids)s::bigint[]) AND j.id = t.id AND j.attempts = t.attempts
  AND (:cancelled_running);

-- name: extend_cancelled_unmigrated
-- extend_cancelled on a schema without migration 11: the kept lease only.
UPDATE jobs j
SET locked_until = coalesce(%(now)s, now()) + %(lease)s
FROM unnest(%(ids)s::bigint[], %(attempts)s::int[]) AS t(id, attempts)
WHERE j.id = ANY(%(ids)s::bigint[]) AND j.id = t.id AND j.attempts = t.attempts
  AND (:cancelled_running_unmigrated);

-- name: landed
-- After a write-back whose answer was lost with the session, which of its writes had
-- landed before it was sent again: a job done with our token can only be our
-- completion (a started job is never released, so no one else held that token); a
-- failure is ours if the row has our token, our error and no lease; a snooze, if the
-- row is queued with our token, no lease and a budget above the one we claimed it
-- with (only a requeue after a reap could do that too, and the row is the same), or
-- at the largest budget, which a snooze cannot raise.
-- Returns each such claim (id, attempts) with its status, and run_at unless done (a
-- done row's may be a time Python cannot hold, so it is not read).
SELECT j.id, j.attempts, j.status, CASE WHEN t.target <> 'done' THEN j.run_at END
FROM jobs j
JOIN unnest(%(ids)s::bigint[], %(attempts)s::int[], %(targets)s::text[],
            %(errors)s::text[], %(budgets)s::int[])
     AS t(id, attempts, target, error, budget) ON j.id = t.id AND j.attempts = t.attempts
WHERE j.id = ANY(%(ids)s::bigint[])
  AND CASE t.target
        WHEN 'done' THEN j.status = 'done'
        WHEN 'snooze' THEN j.status = 'queued' AND j.locked_until IS NULL
                           AND j.max_attempts > least(coalesce(t.budget, 5), 2147483646)
        ELSE j.status IN ('queued', 'failed') AND j.last_error = t.error
             AND j.locked_until IS NULL END;

-- name: end_cancelled
-- Claims cancelled while running whose handler has ended in their worker, or never
-- began: they leave cancelled_running, and their limits' places free now (both of its
-- forms are cleared). Only a job in that state since that claim (its token) changes.
UPDATE jobs j
SET cancelled_running_until = NULL, locked_until = NULL
FROM unnest(%(ids)s::bigint[], %(attempts)s::int[]) AS t(id, attempts)
WHERE j.id = ANY(%(ids)s::bigint[]) AND j.id = t.id AND j.attempts = t.attempts
  AND (:cancelled_running);

-- name: end_cancelled_unmigrated
-- end_cancelled on a schema without migration 11: the kept lease alone.
UPDATE jobs j
SET locked_until = NULL
FROM unnest(%(ids)s::bigint[], %(attempts)s::int[]) AS t(id, attempts)
WHERE j.id = ANY(%(ids)s::bigint[]) AND j.id = t.id AND j.attempts = t.attempts
  AND (:cancelled_running_unmigrated);
