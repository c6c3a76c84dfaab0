-- Schedules: each one's definition and its last enqueued slot (drainer/schedules.py).

-- name: schedules_read
-- The database clock's now, and the stored schedules of these queues (of all when
-- %(queues)s is NULL); one row with NULLs after now when there are none.
SELECT t.now, s.name, s.queue, s.definition, s.retired, s.withdrawn, (:schedule_last_slot)
FROM (SELECT coalesce(%(now)s, now()) AS now) AS t
LEFT JOIN drainer_schedules s
  ON %(queues)s::text[] IS NULL OR s.queue = ANY(%(queues)s::text[])
ORDER BY s.name;

-- name: schedule_last_slot
-- (An expression.) Schedule s's last slot as Python can read it: an infinity (or a
-- year Python's datetime cannot hold in every zone) written by hand would otherwise
-- fail every drain's reconcile. 'infinity' then reads as a last slot still to come
-- (no slot is enqueued until the definition changes), '-infinity' as one long past.
least(greatest(s.last_slot, '0001-01-02 00:00+00'), '9999-12-30 00:00+00');

-- name: schedule_define
-- Store a schedule's definition, new or changed, starting from %(since)s (its next
-- slot comes after it), if what is stored is still what the caller read (%(was)s,
-- NULL for none; %(was_withdrawn)s): two drainers changing it at once change it once.
-- The old definition is retired, so older code still running leaves the new one
-- alone, and the job of the slot it had queued last (%(pending_key)s) is deleted: it
-- never ran, and would run under a definition that is gone.
WITH stored AS (
  INSERT INTO drainer_schedules AS s
    (name, queue, cron, tz, catch_up, payload, definition, last_slot)
  VALUES (%(name)s, %(queue)s, %(cron)s, %(tz)s, %(catch_up)s, %(payload)s::jsonb,
          %(definition)s, %(since)s)
  ON CONFLICT (name) DO UPDATE
  SET queue = excluded.queue, cron = excluded.cron, tz = excluded.tz,
      catch_up = excluded.catch_up, payload = excluded.payload,
      definition = excluded.definition, last_slot = excluded.last_slot,
      retired = array_append(array_remove(array_remove(s.retired, s.definition),
                                          excluded.definition), s.definition),
      withdrawn = false, updated_at = now()
  WHERE s.definition IS NOT DISTINCT FROM %(was)s AND s.withdrawn = %(was_withdrawn)s
  RETURNING s.name
)
DELETE FROM jobs
WHERE queue = %(pending_queue)s AND key = %(pending_key)s AND status = 'queued'
  AND EXISTS (SELECT FROM stored);

-- name: schedule_withdraw
-- A schedule no task module of its queue declares any more: withdrawn (kept, its
-- definition retired, so older code that still declares it leaves it alone), and the
-- job of the slot it had queued last deleted.
WITH gone AS (
  UPDATE drainer_schedules
  SET withdrawn = true, updated_at = now(),
      retired = array_append(array_remove(retired, definition), definition)
  WHERE name = %(name)s AND definition = %(was)s AND NOT withdrawn
  RETURNING name
)
DELETE FROM jobs
WHERE queue = %(pending_queue)s AND key = %(pending_key)s AND status = 'queued'
  AND EXISTS (SELECT FROM gone);

-- name: schedule_enqueue
-- A schedule's slots as jobs (%(slots)s: a JSON array of [slot, key], ascending), only
-- if its last_slot moves forward to the last of them by compare-and-set (from before
-- the first), under this definition: a slot is enqueued once, whoever sees it and
-- however often. Each job's meta names its schedule, slot and time zone.
WITH picked AS (
  SELECT (e ->> 0)::timestamptz AS slot, e ->> 0 AS slot_text, e ->> 1 AS key
  FROM jsonb_array_elements(%(slots)s::jsonb) AS e
), moved AS (
  UPDATE drainer_schedules
  SET last_slot = (SELECT max(slot) FROM picked), updated_at = now()
  WHERE name = %(name)s AND definition = %(definition)s AND NOT withdrawn
    AND EXISTS (SELECT FROM picked)
    AND (last_slot IS NULL OR last_slot < (SELECT min(slot) FROM picked))
  RETURNING name
)
INSERT INTO jobs (queue, payload, run_at, max_attempts, key, meta)
SELECT %(queue)s, %(payload)s::jsonb, p.slot, %(max_attempts)s, p.key,
       jsonb_build_object('schedule', %(name)s::text, 'slot', p.slot_text, 'tz', %(tz)s::text)
FROM picked p, moved
ON CONFLICT (queue, key) WHERE key IS NOT NULL AND status IN ('queued', 'running')
DO NOTHING
RETURNING id;

-- name: schedule_ran
-- The job of a schedule's latest slot that ran, for `drainer schedules`.
UPDATE drainer_schedules
SET last_job = %(job)s
WHERE name = %(name)s AND (last_job IS NULL OR last_job < %(job)s);

-- name: schedules_list
-- `drainer schedules`: every stored schedule (withdrawn ones last), with its latest
-- run's job (in jobs, or the archive), that job's status and last error, and now().
SELECT now(), s.name, s.queue, s.cron, s.tz, s.catch_up, s.withdrawn, (:schedule_last_slot),
       s.last_job,
       coalesce(j.status, a.status), coalesce(j.last_error, a.last_error)
FROM drainer_schedules s
LEFT JOIN jobs j ON j.id = s.last_job
LEFT JOIN jobs_archive a ON a.id = s.last_job AND j.id IS NULL
ORDER BY s.withdrawn, s.name;
