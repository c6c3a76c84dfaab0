-- Generated: every claim text drainer can send, exactly as a drain sends it (plain claims for a batch of 100).
-- Do not edit; regenerate with
--   python -m drainer.storage.claim_text

-- variant: plain, by oldest, no meta, few queues
WITH next AS (SELECT c.id, row_number() OVER (ORDER BY c.run_at, c.id) AS rank
FROM (SELECT unnest(%(queues)s::text[]) LIMIT cardinality(%(queues)s::text[])) AS q(name)
CROSS JOIN LATERAL (
  (SELECT id, run_at FROM jobs
WHERE queue = q.name AND status = 'queued' AND run_at <= now()
ORDER BY run_at)
  LIMIT (100)
  FOR UPDATE SKIP LOCKED
) AS c
ORDER BY c.run_at, c.id
LIMIT 100), claimed AS (
  UPDATE jobs j
  SET status       = CASE WHEN coalesce(j.attempts, 0) < 2147483647
                          THEN 'running' ELSE 'failed' END,
      attempts     = CASE WHEN coalesce(j.attempts, 0) < 2147483647
                          THEN coalesce(j.attempts, 0) + 1 ELSE j.attempts END,
      locked_until = CASE WHEN coalesce(j.attempts, 0) < 2147483647
                          THEN now() + %(lease)s END,
      last_error   = CASE WHEN coalesce(j.attempts, 0) < 2147483647 THEN j.last_error
                          ELSE 'attempts is at the integer limit (2147483647): no attempt '
                               'can be counted; lower it to run this job again' END
  WHERE j.id = ANY(ARRAY(SELECT id FROM next))
  RETURNING j.id, j.queue, j.payload, j.attempts, j.max_attempts, j.status,
            (NULL::jsonb) AS meta
), started AS (SELECT 1)
SELECT c.id, c.queue, (c.payload), c.attempts, c.max_attempts, c.meta
FROM claimed c JOIN next n ON n.id = c.id
WHERE c.status = 'running'
ORDER BY n.rank;

-- variant: plain, by oldest, no meta, many queues
WITH next AS (SELECT c.id, row_number() OVER (ORDER BY c.run_at, c.id) AS rank
FROM (SELECT s.name, count(*) AS take
FROM (SELECT q.name FROM (SELECT unnest(%(queues)s::text[]) LIMIT cardinality(%(queues)s::text[])) AS q(name)
      CROSS JOIN LATERAL (SELECT 0 AS priority, r.run_at, r.id FROM ((SELECT id, run_at FROM jobs
WHERE queue = q.name AND status = 'queued' AND run_at <= now()
ORDER BY run_at) LIMIT 100) AS r) AS c
      ORDER BY c.priority DESC, c.run_at, c.id
      LIMIT 100) AS s
GROUP BY s.name) AS q(name)
CROSS JOIN LATERAL (
  (SELECT id, run_at FROM jobs
WHERE queue = q.name AND status = 'queued' AND run_at <= now()
ORDER BY run_at)
  LIMIT (q.take)
  FOR UPDATE SKIP LOCKED
) AS c
ORDER BY c.run_at, c.id
LIMIT 100), claimed AS (
  UPDATE jobs j
  SET status       = CASE WHEN coalesce(j.attempts, 0) < 2147483647
                          THEN 'running' ELSE 'failed' END,
      attempts     = CASE WHEN coalesce(j.attempts, 0) < 2147483647
                          THEN coalesce(j.attempts, 0) + 1 ELSE j.attempts END,
      locked_until = CASE WHEN coalesce(j.attempts, 0) < 2147483647
                          THEN now() + %(lease)s END,
      last_error   = CASE WHEN coalesce(j.attempts, 0) < 2147483647 THEN j.last_error
                          ELSE 'attempts is at the integer limit (2147483647): no attempt '
                               'can be counted; lower it to run this job again' END
  WHERE j.id = ANY(ARRAY(SELECT id FROM next))
  RETURNING j.id, j.queue, j.payload, j.attempts, j.max_attempts, j.status,
            (NULL::jsonb) AS meta
), started AS (SELECT 1)
SELECT c.id, c.queue, (c.payload), c.attempts, c.max_attempts, c.meta
FROM claimed c JOIN next n ON n.id = c.id
WHERE c.status = 'running'
ORDER BY n.rank;

-- variant: plain, by oldest, meta, few queues
WITH next AS (SELECT c.id, row_number() OVER (ORDER BY c.run_at, c.id) AS rank
FROM (SELECT unnest(%(queues)s::text[]) LIMIT cardinality(%(queues)s::text[])) AS q(name)
CROSS JOIN LATERAL (
  (SELECT id, run_at FROM jobs
WHERE queue = q.name AND status = 'queued' AND run_at <= now()
ORDER BY run_at)
  LIMIT (100)
  FOR UPDATE SKIP LOCKED
) AS c
ORDER BY c.run_at, c.id
LIMIT 100), claimed AS (
  UPDATE jobs j
  SET status       = CASE WHEN coalesce(j.attempts, 0) < 2147483647
                          THEN 'running' ELSE 'failed' END,
      attempts     = CASE WHEN coalesce(j.attempts, 0) < 2147483647
                          THEN coalesce(j.attempts, 0) + 1 ELSE j.attempts END,
      locked_until = CASE WHEN coalesce(j.attempts, 0) < 2147483647
                          THEN now() + %(lease)s END,
      last_error   = CASE WHEN coalesce(j.attempts, 0) < 2147483647 THEN j.last_error
                          ELSE 'attempts is at the integer limit (2147483647): no attempt '
                               'can be counted; lower it to run this job again' END
  WHERE j.id = ANY(ARRAY(SELECT id FROM next))
  RETURNING j.id, j.queue, j.payload, j.attempts, j.max_attempts, j.status,
            (j.meta) AS meta
), started AS (SELECT 1)
SELECT c.id, c.queue, (c.payload), c.attempts, c.max_attempts, c.meta
FROM claimed c JOIN next n ON n.id = c.id
WHERE c.status = 'running'
ORDER BY n.rank;

-- variant: plain, by oldest, meta, many queues
WITH next AS (SELECT c.id, row_number() OVER (ORDER BY c.run_at, c.id) AS rank
FROM (SELECT s.name, count(*) AS take
FROM (SELECT q.name FROM (SELECT unnest(%(queues)s::text[]) LIMIT cardinality(%(queues)s::text[])) AS q(name)
      CROSS JOIN LATERAL (SELECT 0 AS priority, r.run_at, r.id FROM ((SELECT id, run_at FROM jobs
WHERE queue = q.name AND status = 'queued' AND run_at <= now()
ORDER BY run_at) LIMIT 100) AS r) AS c
      ORDER BY c.priority DESC, c.run_at, c.id
      LIMIT 100) AS s
GROUP BY s.name) AS q(name)
CROSS JOIN LATERAL (
  (SELECT id, run_at FROM jobs
WHERE queue = q.name AND status = 'queued' AND run_at <= now()
ORDER BY run_at)
  LIMIT (q.take)
  FOR UPDATE SKIP LOCKED
) AS c
ORDER BY c.run_at, c.id
LIMIT 100), claimed AS (
  UPDATE jobs j
  SET status       = CASE WHEN coalesce(j.attempts, 0) < 2147483647
                          THEN 'running' ELSE 'failed' END,
      attempts     = CASE WHEN coalesce(j.attempts, 0) < 2147483647
                          THEN coalesce(j.attempts, 0) + 1 ELSE j.attempts END,
      locked_until = CASE WHEN coalesce(j.attempts, 0) < 2147483647
                          THEN now() + %(lease)s END,
      last_error   = CASE WHEN coalesce(j.attempts, 0) < 2147483647 THEN j.last_error
                          ELSE 'attempts is at the integer limit (2147483647): no attempt '
                               'can be counted; lower it to run this job again' END
  WHERE j.id = ANY(ARRAY(SELECT id FROM next))
  RETURNING j.id, j.queue, j.payload, j.attempts, j.max_attempts, j.status,
            (j.meta) AS meta
), started AS (SELECT 1)
SELECT c.id, c.queue, (c.payload), c.attempts, c.max_attempts, c.meta
FROM claimed c JOIN next n ON n.id = c.id
WHERE c.status = 'running'
ORDER BY n.rank;

-- variant: plain, by priority, no meta, few queues
WITH next AS (SELECT c.id, row_number() OVER (ORDER BY c.priority DESC, c.run_at, c.id) AS rank
FROM (SELECT unnest(%(queues)s::text[]) LIMIT cardinality(%(queues)s::text[])) AS q(name)
CROSS JOIN LATERAL (
  SELECT p.priority, r.id, r.run_at
  FROM (WITH RECURSIVE p(priority) AS (
  (SELECT priority FROM jobs
   WHERE queue = q.name AND status = 'queued'
   ORDER BY priority DESC LIMIT 1)
  UNION ALL
  SELECT (SELECT j.priority FROM jobs j
          WHERE j.queue = q.name AND j.status = 'queued' AND j.priority < p.priority
          ORDER BY j.priority DESC LIMIT 1)
  FROM p WHERE p.priority IS NOT NULL
)
SELECT priority FROM p WHERE priority IS NOT NULL) AS p
  CROSS JOIN LATERAL (
    (SELECT id, run_at FROM jobs
WHERE queue = q.name AND status = 'queued' AND priority = p.priority
  AND run_at <= now()
ORDER BY run_at)
    LIMIT (100)
    FOR UPDATE SKIP LOCKED
  ) AS r
  LIMIT (100)
) AS c
ORDER BY c.priority DESC, c.run_at, c.id
LIMIT 100), claimed AS (
  UPDATE jobs j
  SET status       = CASE WHEN coalesce(j.attempts, 0) < 2147483647
                          THEN 'running' ELSE 'failed' END,
      attempts     = CASE WHEN coalesce(j.attempts, 0) < 2147483647
                          THEN coalesce(j.attempts, 0) + 1 ELSE j.attempts END,
      locked_until = CASE WHEN coalesce(j.attempts, 0) < 2147483647
                          THEN now() + %(lease)s END,
      last_error   = CASE WHEN coalesce(j.attempts, 0) < 2147483647 THEN j.last_error
                          ELSE 'attempts is at the integer limit (2147483647): no attempt '
                               'can be counted; lower it to run this job again' END
  WHERE j.id = ANY(ARRAY(SELECT id FROM next))
  RETURNING j.id, j.queue, j.payload, j.attempts, j.max_attempts, j.status,
            (NULL::jsonb) AS meta
), started AS (SELECT 1)
SELECT c.id, c.queue, (c.payload), c.attempts, c.max_attempts, c.meta
FROM claimed c JOIN next n ON n.id = c.id
WHERE c.status = 'running'
ORDER BY n.rank;

-- variant: plain, by priority, no meta, many queues
WITH next AS (SELECT c.id, row_number() OVER (ORDER BY c.priority DESC, c.run_at, c.id) AS rank
FROM (SELECT s.name, count(*) AS take
FROM (SELECT q.name FROM (SELECT unnest(%(queues)s::text[]) LIMIT cardinality(%(queues)s::text[])) AS q(name)
      CROSS JOIN LATERAL (SELECT p.priority, r.run_at, r.id
FROM (WITH RECURSIVE p(priority) AS (
  (SELECT priority FROM jobs
   WHERE queue = q.name AND status = 'queued'
   ORDER BY priority DESC LIMIT 1)
  UNION ALL
  SELECT (SELECT j.priority FROM jobs j
          WHERE j.queue = q.name AND j.status = 'queued' AND j.priority < p.priority
          ORDER BY j.priority DESC LIMIT 1)
  FROM p WHERE p.priority IS NOT NULL
)
SELECT priority FROM p WHERE priority IS NOT NULL) AS p
CROSS JOIN LATERAL ((SELECT id, run_at FROM jobs
WHERE queue = q.name AND status = 'queued' AND priority = p.priority
  AND run_at <= now()
ORDER BY run_at) LIMIT 100) AS r
LIMIT 100) AS c
      ORDER BY c.priority DESC, c.run_at, c.id
      LIMIT 100) AS s
GROUP BY s.name) AS q(name)
CROSS JOIN LATERAL (
  SELECT p.priority, r.id, r.run_at
  FROM (WITH RECURSIVE p(priority) AS (
  (SELECT priority FROM jobs
   WHERE queue = q.name AND status = 'queued'
   ORDER BY priority DESC LIMIT 1)
  UNION ALL
  SELECT (SELECT j.priority FROM jobs j
          WHERE j.queue = q.name AND j.status = 'queued' AND j.priority < p.priority
          ORDER BY j.priority DESC LIMIT 1)
  FROM p WHERE p.priority IS NOT NULL
)
SELECT priority FROM p WHERE priority IS NOT NULL) AS p
  CROSS JOIN LATERAL (
    (SELECT id, run_at FROM jobs
WHERE queue = q.name AND status = 'queued' AND priority = p.priority
  AND run_at <= now()
ORDER BY run_at)
    LIMIT (q.take)
    FOR UPDATE SKIP LOCKED
  ) AS r
  LIMIT (q.take)
) AS c
ORDER BY c.priority DESC, c.run_at, c.id
LIMIT 100), claimed AS (
  UPDATE jobs j
  SET status       = CASE WHEN coalesce(j.attempts, 0) < 2147483647
                          THEN 'running' ELSE 'failed' END,
      attempts     = CASE WHEN coalesce(j.attempts, 0) < 2147483647
                          THEN coalesce(j.attempts, 0) + 1 ELSE j.attempts END,
      locked_until = CASE WHEN coalesce(j.attempts, 0) < 2147483647
                          THEN now() + %(lease)s END,
      last_error   = CASE WHEN coalesce(j.attempts, 0) < 2147483647 THEN j.last_error
                          ELSE 'attempts is at the integer limit (2147483647): no attempt '
                               'can be counted; lower it to run this job again' END
  WHERE j.id = ANY(ARRAY(SELECT id FROM next))
  RETURNING j.id, j.queue, j.payload, j.attempts, j.max_attempts, j.status,
            (NULL::jsonb) AS meta
), started AS (SELECT 1)
SELECT c.id, c.queue, (c.payload), c.attempts, c.max_attempts, c.meta
FROM claimed c JOIN next n ON n.id = c.id
WHERE c.status = 'running'
ORDER BY n.rank;

-- variant: plain, by priority, meta, few queues
WITH next AS (SELECT c.id, row_number() OVER (ORDER BY c.priority DESC, c.run_at, c.id) AS rank
FROM (SELECT unnest(%(queues)s::text[]) LIMIT cardinality(%(queues)s::text[])) AS q(name)
CROSS JOIN LATERAL (
  SELECT p.priority, r.id, r.run_at
  FROM (WITH RECURSIVE p(priority) AS (
  (SELECT priority FROM jobs
   WHERE queue = q.name AND status = 'queued'
   ORDER BY priority DESC LIMIT 1)
  UNION ALL
  SELECT (SELECT j.priority FROM jobs j
          WHERE j.queue = q.name AND j.status = 'queued' AND j.priority < p.priority
          ORDER BY j.priority DESC LIMIT 1)
  FROM p WHERE p.priority IS NOT NULL
)
SELECT priority FROM p WHERE priority IS NOT NULL) AS p
  CROSS JOIN LATERAL (
    (SELECT id, run_at FROM jobs
WHERE queue = q.name AND status = 'queued' AND priority = p.priority
  AND run_at <= now()
ORDER BY run_at)
    LIMIT (100)
    FOR UPDATE SKIP LOCKED
  ) AS r
  LIMIT (100)
) AS c
ORDER BY c.priority DESC, c.run_at, c.id
LIMIT 100), claimed AS (
  UPDATE jobs j
  SET status       = CASE WHEN coalesce(j.attempts, 0) < 2147483647
                          THEN 'running' ELSE 'failed' END,
      attempts     = CASE WHEN coalesce(j.attempts, 0) < 2147483647
                          THEN coalesce(j.attempts, 0) + 1 ELSE j.attempts END,
      locked_until = CASE WHEN coalesce(j.attempts, 0) < 2147483647
                          THEN now() + %(lease)s END,
      last_error   = CASE WHEN coalesce(j.attempts, 0) < 2147483647 THEN j.last_error
                          ELSE 'attempts is at the integer limit (2147483647): no attempt '
                               'can be counted; lower it to run this job again' END
  WHERE j.id = ANY(ARRAY(SELECT id FROM next))
  RETURNING j.id, j.queue, j.payload, j.attempts, j.max_attempts, j.status,
            (j.meta) AS meta
), started AS (SELECT 1)
SELECT c.id, c.queue, (c.payload), c.attempts, c.max_attempts, c.meta
FROM claimed c JOIN next n ON n.id = c.id
WHERE c.status = 'running'
ORDER BY n.rank;

-- variant: plain, by priority, meta, many queues
WITH next AS (SELECT c.id, row_number() OVER (ORDER BY c.priority DESC, c.run_at, c.id) AS rank
FROM (SELECT s.name, count(*) AS take
FROM (SELECT q.name FROM (SELECT unnest(%(queues)s::text[]) LIMIT cardinality(%(queues)s::text[])) AS q(name)
      CROSS JOIN LATERAL (SELECT p.priority, r.run_at, r.id
FROM (WITH RECURSIVE p(priority) AS (
  (SELECT priority FROM jobs
   WHERE queue = q.name AND status = 'queued'
   ORDER BY priority DESC LIMIT 1)
  UNION ALL
  SELECT (SELECT j.priority FROM jobs j
          WHERE j.queue = q.name AND j.status = 'queued' AND j.priority < p.priority
          ORDER BY j.priority DESC LIMIT 1)
  FROM p WHERE p.priority IS NOT NULL
)
SELECT priority FROM p WHERE priority IS NOT NULL) AS p
CROSS JOIN LATERAL ((SELECT id, run_at FROM jobs
WHERE queue = q.name AND status = 'queued' AND priority = p.priority
  AND run_at <= now()
ORDER BY run_at) LIMIT 100) AS r
LIMIT 100) AS c
      ORDER BY c.priority DESC, c.run_at, c.id
      LIMIT 100) AS s
GROUP BY s.name) AS q(name)
CROSS JOIN LATERAL (
  SELECT p.priority, r.id, r.run_at
  FROM (WITH RECURSIVE p(priority) AS (
  (SELECT priority FROM jobs
   WHERE queue = q.name AND status = 'queued'
   ORDER BY priority DESC LIMIT 1)
  UNION ALL
  SELECT (SELECT j.priority FROM jobs j
          WHERE j.queue = q.name AND j.status = 'queued' AND j.priority < p.priority
          ORDER BY j.priority DESC LIMIT 1)
  FROM p WHERE p.priority IS NOT NULL
)
SELECT priority FROM p WHERE priority IS NOT NULL) AS p
  CROSS JOIN LATERAL (
    (SELECT id, run_at FROM jobs
WHERE queue = q.name AND status = 'queued' AND priority = p.priority
  AND run_at <= now()
ORDER BY run_at)
    LIMIT (q.take)
    FOR UPDATE SKIP LOCKED
  ) AS r
  LIMIT (q.take)
) AS c
ORDER BY c.priority DESC, c.run_at, c.id
LIMIT 100), claimed AS (
  UPDATE jobs j
  SET status       = CASE WHEN coalesce(j.attempts, 0) < 2147483647
                          THEN 'running' ELSE 'failed' END,
      attempts     = CASE WHEN coalesce(j.attempts, 0) < 2147483647
                          THEN coalesce(j.attempts, 0) + 1 ELSE j.attempts END,
      locked_until = CASE WHEN coalesce(j.attempts, 0) < 2147483647
                          THEN now() + %(lease)s END,
      last_error   = CASE WHEN coalesce(j.attempts, 0) < 2147483647 THEN j.last_error
                          ELSE 'attempts is at the integer limit (2147483647): no attempt '
                               'can be counted; lower it to run this job again' END
  WHERE j.id = ANY(ARRAY(SELECT id FROM next))
  RETURNING j.id, j.queue, j.payload, j.attempts, j.max_attempts, j.status,
            (j.meta) AS meta
), started AS (SELECT 1)
SELECT c.id, c.queue, (c.payload), c.attempts, c.max_attempts, c.meta
FROM claimed c JOIN next n ON n.id = c.id
WHERE c.status = 'running'
ORDER BY n.rank;

-- variant: plain, by priority, meta, paused queues, few queues
WITH next AS (SELECT c.id, row_number() OVER (ORDER BY c.priority DESC, c.run_at, c.id) AS rank
FROM (SELECT q.name FROM (SELECT unnest(%(queues)s::text[]) LIMIT cardinality(%(queues)s::text[])) AS q(name) WHERE q.name <> ALL(ARRAY(SELECT queue FROM drainer_pauses))) AS q(name)
CROSS JOIN LATERAL (
  SELECT p.priority, r.id, r.run_at
  FROM (WITH RECURSIVE p(priority) AS (
  (SELECT priority FROM jobs
   WHERE queue = q.name AND status = 'queued'
   ORDER BY priority DESC LIMIT 1)
  UNION ALL
  SELECT (SELECT j.priority FROM jobs j
          WHERE j.queue = q.name AND j.status = 'queued' AND j.priority < p.priority
          ORDER BY j.priority DESC LIMIT 1)
  FROM p WHERE p.priority IS NOT NULL
)
SELECT priority FROM p WHERE priority IS NOT NULL) AS p
  CROSS JOIN LATERAL (
    (SELECT id, run_at FROM jobs
WHERE queue = q.name AND status = 'queued' AND priority = p.priority
  AND run_at <= now()
ORDER BY run_at)
    LIMIT (100)
    FOR UPDATE SKIP LOCKED
  ) AS r
  LIMIT (100)
) AS c
ORDER BY c.priority DESC, c.run_at, c.id
LIMIT 100), claimed AS (
  UPDATE jobs j
  SET status       = CASE WHEN coalesce(j.attempts, 0) < 2147483647
                          THEN 'running' ELSE 'failed' END,
      attempts     = CASE WHEN coalesce(j.attempts, 0) < 2147483647
                          THEN coalesce(j.attempts, 0) + 1 ELSE j.attempts END,
      locked_until = CASE WHEN coalesce(j.attempts, 0) < 2147483647
                          THEN now() + %(lease)s END,
      last_error   = CASE WHEN coalesce(j.attempts, 0) < 2147483647 THEN j.last_error
                          ELSE 'attempts is at the integer limit (2147483647): no attempt '
                               'can be counted; lower it to run this job again' END
  WHERE j.id = ANY(ARRAY(SELECT id FROM next))
  RETURNING j.id, j.queue, j.payload, j.attempts, j.max_attempts, j.status,
            (j.meta) AS meta
), started AS (SELECT 1)
SELECT c.id, c.queue, (c.payload), c.attempts, c.max_attempts, c.meta
FROM claimed c JOIN next n ON n.id = c.id
WHERE c.status = 'running'
ORDER BY n.rank;

-- variant: plain, by priority, meta, paused queues, many queues
WITH next AS (SELECT c.id, row_number() OVER (ORDER BY c.priority DESC, c.run_at, c.id) AS rank
FROM (SELECT s.name, count(*) AS take
FROM (SELECT q.name FROM (SELECT q.name FROM (SELECT unnest(%(queues)s::text[]) LIMIT cardinality(%(queues)s::text[])) AS q(name) WHERE q.name <> ALL(ARRAY(SELECT queue FROM drainer_pauses))) AS q(name)
      CROSS JOIN LATERAL (SELECT p.priority, r.run_at, r.id
FROM (WITH RECURSIVE p(priority) AS (
  (SELECT priority FROM jobs
   WHERE queue = q.name AND status = 'queued'
   ORDER BY priority DESC LIMIT 1)
  UNION ALL
  SELECT (SELECT j.priority FROM jobs j
          WHERE j.queue = q.name AND j.status = 'queued' AND j.priority < p.priority
          ORDER BY j.priority DESC LIMIT 1)
  FROM p WHERE p.priority IS NOT NULL
)
SELECT priority FROM p WHERE priority IS NOT NULL) AS p
CROSS JOIN LATERAL ((SELECT id, run_at FROM jobs
WHERE queue = q.name AND status = 'queued' AND priority = p.priority
  AND run_at <= now()
ORDER BY run_at) LIMIT 100) AS r
LIMIT 100) AS c
      ORDER BY c.priority DESC, c.run_at, c.id
      LIMIT 100) AS s
GROUP BY s.name) AS q(name)
CROSS JOIN LATERAL (
  SELECT p.priority, r.id, r.run_at
  FROM (WITH RECURSIVE p(priority) AS (
  (SELECT priority FROM jobs
   WHERE queue = q.name AND status = 'queued'
   ORDER BY priority DESC LIMIT 1)
  UNION ALL
  SELECT (SELECT j.priority FROM jobs j
          WHERE j.queue = q.name AND j.status = 'queued' AND j.priority < p.priority
          ORDER BY j.priority DESC LIMIT 1)
  FROM p WHERE p.priority IS NOT NULL
)
SELECT priority FROM p WHERE priority IS NOT NULL) AS p
  CROSS JOIN LATERAL (
    (SELECT id, run_at FROM jobs
WHERE queue = q.name AND status = 'queued' AND priority = p.priority
  AND run_at <= now()
ORDER BY run_at)
    LIMIT (q.take)
    FOR UPDATE SKIP LOCKED
  ) AS r
  LIMIT (q.take)
) AS c
ORDER BY c.priority DESC, c.run_at, c.id
LIMIT 100), claimed AS (
  UPDATE jobs j
  SET status       = CASE WHEN coalesce(j.attempts, 0) < 2147483647
                          THEN 'running' ELSE 'failed' END,
      attempts     = CASE WHEN coalesce(j.attempts, 0) < 2147483647
                          THEN coalesce(j.attempts, 0) + 1 ELSE j.attempts END,
      locked_until = CASE WHEN coalesce(j.attempts, 0) < 2147483647
                          THEN now() + %(lease)s END,
      last_error   = CASE WHEN coalesce(j.attempts, 0) < 2147483647 THEN j.last_error
                          ELSE 'attempts is at the integer limit (2147483647): no attempt '
                               'can be counted; lower it to run this job again' END
  WHERE j.id = ANY(ARRAY(SELECT id FROM next))
  RETURNING j.id, j.queue, j.payload, j.attempts, j.max_attempts, j.status,
            (j.meta) AS meta
), started AS (SELECT 1)
SELECT c.id, c.queue, (c.payload), c.attempts, c.max_attempts, c.meta
FROM claimed c JOIN next n ON n.id = c.id
WHERE c.status = 'running'
ORDER BY n.rank;
