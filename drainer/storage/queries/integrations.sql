-- The statements of drainer.contrib.django's task backend and of drainer.testing.

-- name: django_result
-- drainer.contrib.django's get_result: a Django task's job, from jobs or, once
-- archived, from jobs_archive.
SELECT status, queue, priority, payload::text, attempts, created_at, done_at, run_at,
       result::text, last_error, meta::text FROM jobs WHERE id = %(id)s
UNION ALL
SELECT status, queue, priority, payload::text, attempts, created_at, done_at, run_at,
       result::text, last_error, meta::text FROM jobs_archive WHERE id = %(id)s
LIMIT 1;

-- name: django_record_error
-- drainer.contrib.django: a failure's class and traceback, appended to the running
-- attempt's meta (Django's result shows them; last_error keeps one line); the attempt
-- number keeps a stale worker (its job taken over) from writing to another's.
UPDATE jobs
SET meta = coalesce(meta, '{}'::jsonb) || jsonb_build_object(
             %(key)s::text, coalesce(meta -> %(key)s, '[]'::jsonb) || %(error)s::jsonb)
WHERE id = %(id)s AND attempts = %(attempts)s AND status = 'running';

-- name: handler_savepoint
-- drainer.testing.drain_now(in_transaction=True): each handler's call in a savepoint of
-- the test's transaction, rolled back to only when a statement of the handler's failed.
SAVEPOINT drainer_handler;

-- name: handler_savepoint_rollback
ROLLBACK TO SAVEPOINT drainer_handler;

-- name: handler_savepoint_release
RELEASE SAVEPOINT drainer_handler;

-- name: testing_queued
-- drainer.testing.enqueued(): the queued jobs (of one queue, or all), with every
-- column but the payload as one JSON object: a table made by hand may lack the key,
-- priority and meta columns.
SELECT j.id, j.queue, j.payload, j.run_at, j.attempts, j.max_attempts, to_jsonb(j) - 'payload'
FROM jobs j
WHERE j.status = 'queued' AND (%(queue)s::text IS NULL OR j.queue = %(queue)s::text)
ORDER BY j.queue, j.id;
