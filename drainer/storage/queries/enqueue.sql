-- Enqueue: the producer's statements, sent on the application's connection in its
-- transaction (storage/drivers.py: psycopg 3 or 2, SQLAlchemy, Django).

-- name: enqueue
INSERT INTO jobs (queue, payload, run_at, max_attempts)
VALUES (%(queue)s, %(payload)s::jsonb, (:db_time), %(max_attempts)s)
RETURNING id;

-- name: db_time
-- The database's notion of a run_at, so bulk COPY rows carry the server's clock.
SELECT coalesce(%(run_at)s, coalesce(%(now)s, now()) + coalesce(%(delay)s, interval '0'));

-- name: enqueue_keyed
-- One job with a priority, a key or a group (in meta; migration 6), in one round trip: inserted, unless
-- a queued or running job of the queue holds the key; then that holder's id, with its
-- status, or 'replaced' when %(replace)s gave a queued holder the new payload, run_at
-- and priority. No row: the holder that stopped the insert committed after this
-- statement's snapshot, which cannot see it: storage.enqueue asks again. ON CONFLICT
-- DO NOTHING locks no row; the replacing UPDATE locks only a row it sees queued, but if
-- a claim takes it meanwhile, the recheck leaves the running row locked until the
-- caller commits (the worker's writes would wait): storage.enqueue sends this in a
-- savepoint and rolls back to it when that can have happened.
WITH new AS (
  INSERT INTO jobs (queue, payload, run_at, max_attempts, priority, key, meta)
  VALUES (%(queue)s, %(payload)s::jsonb, (:db_time), %(max_attempts)s, %(priority)s,
          %(key)s, %(meta)s::jsonb)
  ON CONFLICT (queue, key) WHERE key IS NOT NULL AND status IN ('queued', 'running')
  DO NOTHING
  RETURNING id
), holder AS (
  SELECT id, status FROM jobs
  WHERE queue = %(queue)s AND key = %(key)s AND status IN ('queued', 'running')
    AND NOT EXISTS (SELECT FROM new)
), replaced AS (
  UPDATE jobs j
  SET payload = %(payload)s::jsonb, run_at = (:db_time), priority = %(priority)s
  FROM holder h
  WHERE %(replace)s AND j.id = h.id AND h.status = 'queued' AND j.status = 'queued'
  RETURNING j.id
)
SELECT id, 'inserted' FROM new
UNION ALL
SELECT h.id, CASE WHEN r.id IS NULL THEN h.status ELSE 'replaced' END
FROM holder h LEFT JOIN replaced r ON r.id = h.id;

-- name: savepoint
-- Around an enqueue that may replace a holder (storage.enqueue), in the caller's transaction.
SAVEPOINT drainer_enqueue;

-- name: savepoint_rollback
ROLLBACK TO SAVEPOINT drainer_enqueue;

-- name: savepoint_release
RELEASE SAVEPOINT drainer_enqueue;

-- name: copy_jobs
COPY jobs (queue, payload, run_at, max_attempts) FROM STDIN;

-- name: copy_jobs_priority
COPY jobs (queue, payload, run_at, max_attempts, priority) FROM STDIN;

-- name: copy_jobs_meta
COPY jobs (queue, payload, run_at, max_attempts, priority, meta) FROM STDIN;

-- name: insert_jobs
-- enqueue_many without keys, priority or meta through a driver without COPY (psycopg
-- 2): the payloads of one JSON array, inserted in their order, into the columns a
-- table made by hand has; the count.
WITH new AS (
  INSERT INTO jobs (queue, payload, run_at, max_attempts)
  SELECT %(queue)s, t.payload, %(run_at)s, %(max_attempts)s
  FROM jsonb_array_elements(%(rows)s::jsonb) WITH ORDINALITY AS t(payload, n)
  ORDER BY t.n
  RETURNING 1
)
SELECT count(*) FROM new;

-- name: enqueue_keyed_batch
-- enqueue_many with keys: the rows of one JSON array of [payload, key] pairs (its keys
-- distinct and sorted, so that concurrent batches take the keys' locks in one order),
-- inserted in their order; returns their ids, ascending, which is their order (drawn
-- one by one as they are inserted). No ON CONFLICT, whose speculative
-- insertion costs as much again per row as the insert: a key already held makes the
-- statement fail on the unique index, and storage.enqueue.enqueue_many undoes it to a savepoint
-- and sends the other keys again.
WITH new AS (
  INSERT INTO jobs (queue, payload, run_at, max_attempts, priority, key, meta)
  SELECT %(queue)s, t.pair -> 0, %(run_at)s, %(max_attempts)s, %(priority)s, t.pair ->> 1,
         %(meta)s::jsonb
  FROM jsonb_array_elements(%(rows)s::jsonb) WITH ORDINALITY AS t(pair, n)
  ORDER BY t.n
  RETURNING id
)
SELECT coalesce(array_agg(id ORDER BY id), '{}') FROM new;

-- name: batch_holders
-- enqueue_many with keys: the id of the job holding each of these keys in the queue
-- (queued or running), in the keys' order, NULL for a key no job holds, as one array
-- (100,000 rows would cost more to send and read than the lookups); the keys arrive
-- as one JSON array, which Python writes several times faster than a text[]. Read
-- when an insert failed on a held key. One probe of the unique index per key, as a
-- subquery: a join could be planned as a nested loop over a seq scan (statistics
-- taken before a bulk insert), one pass over the table per key.
SELECT array_agg((SELECT j.id FROM jobs j
                  WHERE j.queue = %(queue)s AND j.key = k.key
                    AND j.status IN ('queued', 'running')) ORDER BY k.n)
FROM jsonb_array_elements_text(%(keys)s::jsonb) WITH ORDINALITY AS k(key, n);

-- name: batch_unseen
-- enqueue_many with keys: an insert failed on the unique index, and the holders read
-- after it found none of the keys held. In READ COMMITTED the holder finished meanwhile
-- and the keys are sent again. In REPEATABLE READ or SERIALIZABLE it is a job another
-- transaction committed after this one's snapshot, which it will never see: the
-- serialization failure a single enqueue gets from ON CONFLICT, for the caller to retry.
DO $$
BEGIN
  IF current_setting('transaction_isolation') <> 'read committed' THEN
    RAISE EXCEPTION USING ERRCODE = 'serialization_failure',
      MESSAGE = 'could not serialize access due to concurrent update',
      DETAIL = 'A key is held by a job another transaction enqueued and committed after '
               'this transaction began.';
  END IF;
END
$$;
