-- Paused queues (their own migration): `drainer pause` and `resume`, and the parts that leave
-- a paused queue out of the claims, next_due and the wake-ups (storage/pauses.py swaps
-- them in where the schema has the table).

-- name: pause
-- Pause a queue; its row is returned only when it was not paused already.
INSERT INTO drainer_pauses (queue) VALUES (%(queue)s)
ON CONFLICT (queue) DO NOTHING
RETURNING queue;

-- name: resume
-- Resume a queue; its row is returned only when it was paused. The NOTIFY (sent at
-- commit, as an enqueue's) wakes every `drainer work` that drains the queue.
DELETE FROM drainer_pauses WHERE queue = %(queue)s
RETURNING pg_notify('jobs', queue);

-- name: paused
-- The paused queues, with when and by which role each was paused, and its ready jobs
-- (counted up to %(cap)s: more than that less one, beyond).
SELECT p.queue, p.paused_at, p.paused_by,
       (SELECT count(*) FROM (SELECT FROM jobs j
                              WHERE j.queue = p.queue AND j.status = 'queued'
                                AND j.run_at <= now()
                              LIMIT %(cap)s) AS r)
FROM drainer_pauses p
ORDER BY p.queue;

-- name: none_paused
-- (An array.) The paused queues on a schema without the table: none. Swapped for
-- paused_queues where it is (storage.pauses.swaps).
'{}'::text[];

-- name: paused_queues
-- (An array, read once per statement.) The paused queues.
ARRAY(SELECT queue FROM drainer_pauses);

-- name: queues_unpaused
-- The queues of a claim (the part it wraps) less the paused ones, as q(name): read
-- once per claim, not per job, so a claim pays one look at a table of no rows.
SELECT q.name FROM (:queues) AS q(name) WHERE q.name <> ALL(:paused_queues);
