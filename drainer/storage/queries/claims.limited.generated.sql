-- Generated: every claim text drainer can send, exactly as a drain sends it (plain claims for a batch of 100).
-- Do not edit; regenerate with
--   python -m drainer.storage.claim_text

-- variant: limited, no groups, before migration 10
WITH next AS (SELECT * FROM (
SELECT c.id, row_number() OVER (ORDER BY c.priority DESC, c.run_at, c.id) AS rank
FROM jsonb_to_recordset(%(limits)s::jsonb)
     AS l(queue text, concurrency int, per_group int, rate int, per_seconds float8,
        take bigint)
CROSS JOIN (SELECT statement_timestamp() AS now) AS t
CROSS JOIN LATERAL (
  SELECT greatest(0, least(l.take, l.concurrency - (SELECT (SELECT count(*) FROM jobs r WHERE r.queue = l.queue AND r.status = 'running')
     + (SELECT 0)),
                           l.rate - (SELECT count(*) FROM drainer_starts s
WHERE s.queue = l.queue AND s.at > t.now - make_interval(secs => l.per_seconds)))) AS room
) AS n
CROSS JOIN LATERAL (SELECT j.id, j.priority, j.run_at FROM jobs j
WHERE l.per_group IS NULL
  AND j.queue = l.queue AND j.status = 'queued' AND j.run_at <= t.now
ORDER BY j.priority DESC, j.run_at
LIMIT n.room
FOR UPDATE SKIP LOCKED) AS c
WHERE l.queue <> ALL('{}'::text[])
) AS ranked
WHERE ranked.rank <= %(take)s), claimed AS (
  UPDATE jobs j
  SET status       = CASE WHEN coalesce(j.attempts, 0) < 2147483647
                          THEN 'running' ELSE 'failed' END,
      attempts     = CASE WHEN coalesce(j.attempts, 0) < 2147483647
                          THEN coalesce(j.attempts, 0) + 1 ELSE j.attempts END,
      locked_until = CASE WHEN coalesce(j.attempts, 0) < 2147483647
                          THEN statement_timestamp() + %(lease)s END,
      last_error   = CASE WHEN coalesce(j.attempts, 0) < 2147483647 THEN j.last_error
                          ELSE 'attempts is at the integer limit (2147483647): no attempt '
                               'can be counted; lower it to run this job again' END
  WHERE j.id = ANY(ARRAY(SELECT id FROM next))
  RETURNING j.id, j.queue, j.payload, j.attempts, j.max_attempts, j.status,
            (j.meta) AS meta
), started AS (INSERT INTO drainer_starts (queue, at)
SELECT c.queue, statement_timestamp() FROM claimed c
WHERE c.status = 'running' AND c.queue = ANY(%(rated)s::text[])
RETURNING 1)
SELECT c.id, c.queue, (CASE WHEN sum(octet_length(c.payload::text))
       OVER (ORDER BY n.rank ROWS UNBOUNDED PRECEDING) <= 65536
     THEN c.payload END), c.attempts, c.max_attempts, c.meta
FROM claimed c JOIN next n ON n.id = c.id
WHERE c.status = 'running'
ORDER BY n.rank;

-- variant: limited, no groups, migration 10
WITH next AS (SELECT * FROM (
SELECT c.id, row_number() OVER (ORDER BY c.priority DESC, c.run_at, c.id) AS rank
FROM jsonb_to_recordset(%(limits)s::jsonb)
     AS l(queue text, concurrency int, per_group int, rate int, per_seconds float8,
        take bigint)
CROSS JOIN (SELECT statement_timestamp() AS now) AS t
CROSS JOIN LATERAL (
  SELECT greatest(0, least(l.take, l.concurrency - (SELECT (SELECT count(*) FROM jobs r WHERE r.queue = l.queue AND r.status = 'running')
     + (SELECT count(*) FROM jobs h WHERE h.queue = l.queue AND (status = 'failed' AND ((locked_until > statement_timestamp() AND locked_until < '9999-01-01'))))),
                           l.rate - (SELECT count(*) FROM drainer_starts s
WHERE s.queue = l.queue AND s.at > t.now - make_interval(secs => l.per_seconds)))) AS room
) AS n
CROSS JOIN LATERAL (SELECT j.id, j.priority, j.run_at FROM jobs j
WHERE l.per_group IS NULL
  AND j.queue = l.queue AND j.status = 'queued' AND j.run_at <= t.now
ORDER BY j.priority DESC, j.run_at
LIMIT n.room
FOR UPDATE SKIP LOCKED) AS c
WHERE l.queue <> ALL('{}'::text[])
) AS ranked
WHERE ranked.rank <= %(take)s), claimed AS (
  UPDATE jobs j
  SET status       = CASE WHEN coalesce(j.attempts, 0) < 2147483647
                          THEN 'running' ELSE 'failed' END,
      attempts     = CASE WHEN coalesce(j.attempts, 0) < 2147483647
                          THEN coalesce(j.attempts, 0) + 1 ELSE j.attempts END,
      locked_until = CASE WHEN coalesce(j.attempts, 0) < 2147483647
                          THEN statement_timestamp() + %(lease)s END,
      last_error   = CASE WHEN coalesce(j.attempts, 0) < 2147483647 THEN j.last_error
                          ELSE 'attempts is at the integer limit (2147483647): no attempt '
                               'can be counted; lower it to run this job again' END
  WHERE j.id = ANY(ARRAY(SELECT id FROM next))
  RETURNING j.id, j.queue, j.payload, j.attempts, j.max_attempts, j.status,
            (j.meta) AS meta
), started AS (INSERT INTO drainer_starts (queue, at)
SELECT c.queue, statement_timestamp() FROM claimed c
WHERE c.status = 'running' AND c.queue = ANY(%(rated)s::text[])
RETURNING 1)
SELECT c.id, c.queue, (CASE WHEN sum(octet_length(c.payload::text))
       OVER (ORDER BY n.rank ROWS UNBOUNDED PRECEDING) <= 65536
     THEN c.payload END), c.attempts, c.max_attempts, c.meta
FROM claimed c JOIN next n ON n.id = c.id
WHERE c.status = 'running'
ORDER BY n.rank;

-- variant: limited, no groups, migration 11
WITH next AS (SELECT * FROM (
SELECT c.id, row_number() OVER (ORDER BY c.priority DESC, c.run_at, c.id) AS rank
FROM jsonb_to_recordset(%(limits)s::jsonb)
     AS l(queue text, concurrency int, per_group int, rate int, per_seconds float8,
        take bigint)
CROSS JOIN (SELECT statement_timestamp() AS now) AS t
CROSS JOIN LATERAL (
  SELECT greatest(0, least(l.take, l.concurrency - (SELECT (SELECT count(*) FROM jobs r WHERE r.queue = l.queue AND r.status = 'running')
     + (SELECT count(*) FROM jobs h WHERE h.queue = l.queue AND (status = 'failed' AND (cancelled_running_until > statement_timestamp()
                       OR ((locked_until > statement_timestamp() AND locked_until < '9999-01-01')))))),
                           l.rate - (SELECT count(*) FROM drainer_starts s
WHERE s.queue = l.queue AND s.at > t.now - make_interval(secs => l.per_seconds)))) AS room
) AS n
CROSS JOIN LATERAL (SELECT j.id, j.priority, j.run_at FROM jobs j
WHERE l.per_group IS NULL
  AND j.queue = l.queue AND j.status = 'queued' AND j.run_at <= t.now
ORDER BY j.priority DESC, j.run_at
LIMIT n.room
FOR UPDATE SKIP LOCKED) AS c
WHERE l.queue <> ALL('{}'::text[])
) AS ranked
WHERE ranked.rank <= %(take)s), claimed AS (
  UPDATE jobs j
  SET status       = CASE WHEN coalesce(j.attempts, 0) < 2147483647
                          THEN 'running' ELSE 'failed' END,
      attempts     = CASE WHEN coalesce(j.attempts, 0) < 2147483647
                          THEN coalesce(j.attempts, 0) + 1 ELSE j.attempts END,
      locked_until = CASE WHEN coalesce(j.attempts, 0) < 2147483647
                          THEN statement_timestamp() + %(lease)s END,
      last_error   = CASE WHEN coalesce(j.attempts, 0) < 2147483647 THEN j.last_error
                          ELSE 'attempts is at the integer limit (2147483647): no attempt '
                               'can be counted; lower it to run this job again' END
  WHERE j.id = ANY(ARRAY(SELECT id FROM next))
  RETURNING j.id, j.queue, j.payload, j.attempts, j.max_attempts, j.status,
            (j.meta) AS meta
), started AS (INSERT INTO drainer_starts (queue, at)
SELECT c.queue, statement_timestamp() FROM claimed c
WHERE c.status = 'running' AND c.queue = ANY(%(rated)s::text[])
RETURNING 1)
SELECT c.id, c.queue, (CASE WHEN sum(octet_length(c.payload::text))
       OVER (ORDER BY n.rank ROWS UNBOUNDED PRECEDING) <= 65536
     THEN c.payload END), c.attempts, c.max_attempts, c.meta
FROM claimed c JOIN next n ON n.id = c.id
WHERE c.status = 'running'
ORDER BY n.rank;

-- variant: limited, no groups, paused queues
WITH next AS (SELECT * FROM (
SELECT c.id, row_number() OVER (ORDER BY c.priority DESC, c.run_at, c.id) AS rank
FROM jsonb_to_recordset(%(limits)s::jsonb)
     AS l(queue text, concurrency int, per_group int, rate int, per_seconds float8,
        take bigint)
CROSS JOIN (SELECT statement_timestamp() AS now) AS t
CROSS JOIN LATERAL (
  SELECT greatest(0, least(l.take, l.concurrency - (SELECT (SELECT count(*) FROM jobs r WHERE r.queue = l.queue AND r.status = 'running')
     + (SELECT count(*) FROM jobs h WHERE h.queue = l.queue AND (status = 'failed' AND (cancelled_running_until > statement_timestamp()
                       OR ((locked_until > statement_timestamp() AND locked_until < '9999-01-01')))))),
                           l.rate - (SELECT count(*) FROM drainer_starts s
WHERE s.queue = l.queue AND s.at > t.now - make_interval(secs => l.per_seconds)))) AS room
) AS n
CROSS JOIN LATERAL (SELECT j.id, j.priority, j.run_at FROM jobs j
WHERE l.per_group IS NULL
  AND j.queue = l.queue AND j.status = 'queued' AND j.run_at <= t.now
ORDER BY j.priority DESC, j.run_at
LIMIT n.room
FOR UPDATE SKIP LOCKED) AS c
WHERE l.queue <> ALL(ARRAY(SELECT queue FROM drainer_pauses))
) AS ranked
WHERE ranked.rank <= %(take)s), claimed AS (
  UPDATE jobs j
  SET status       = CASE WHEN coalesce(j.attempts, 0) < 2147483647
                          THEN 'running' ELSE 'failed' END,
      attempts     = CASE WHEN coalesce(j.attempts, 0) < 2147483647
                          THEN coalesce(j.attempts, 0) + 1 ELSE j.attempts END,
      locked_until = CASE WHEN coalesce(j.attempts, 0) < 2147483647
                          THEN statement_timestamp() + %(lease)s END,
      last_error   = CASE WHEN coalesce(j.attempts, 0) < 2147483647 THEN j.last_error
                          ELSE 'attempts is at the integer limit (2147483647): no attempt '
                               'can be counted; lower it to run this job again' END
  WHERE j.id = ANY(ARRAY(SELECT id FROM next))
  RETURNING j.id, j.queue, j.payload, j.attempts, j.max_attempts, j.status,
            (j.meta) AS meta
), started AS (INSERT INTO drainer_starts (queue, at)
SELECT c.queue, statement_timestamp() FROM claimed c
WHERE c.status = 'running' AND c.queue = ANY(%(rated)s::text[])
RETURNING 1)
SELECT c.id, c.queue, (CASE WHEN sum(octet_length(c.payload::text))
       OVER (ORDER BY n.rank ROWS UNBOUNDED PRECEDING) <= 65536
     THEN c.payload END), c.attempts, c.max_attempts, c.meta
FROM claimed c JOIN next n ON n.id = c.id
WHERE c.status = 'running'
ORDER BY n.rank;
