-- The claim: the plain claim of a few queues or of many (claim_sql), by age or by
-- priority, and the claim of queues with limits (limited_sql), which takes at most what
-- their limits leave, under limits_lock. A statement may hold another as a subquery,
-- written (:name), from this file or another; storage/claim.py swaps some parts for
-- others. Every text these make is written out in the claims.*.generated.sql files.

-- name: claim
-- The classic SKIP LOCKED claim, for several queues at once: `next` picks the rows and
-- ranks them (claim_oldest on a table without priorities, claim_by_priority once
-- `migrate` added them: storage.claim.claim_sql swaps one for the other), rows locked but not
-- taken are released at once by the commit. claim_sql writes %(limit)s as a
-- literal (see there); the update finds the taken rows through the primary key
-- whatever the table's size, and they are returned in their rank. A row whose attempts
-- another producer left at the integer limit cannot count one more: it fails alone,
-- saying why, instead of failing the whole claim (a hand-made table may allow NULL
-- attempts: counted as 0).
WITH next AS (:claim_oldest), claimed AS (
  UPDATE jobs j
  SET status       = CASE WHEN coalesce(j.attempts, 0) < 2147483647
                          THEN 'running' ELSE 'failed' END,
      attempts     = CASE WHEN coalesce(j.attempts, 0) < 2147483647
                          THEN coalesce(j.attempts, 0) + 1 ELSE j.attempts END,
      locked_until = CASE WHEN coalesce(j.attempts, 0) < 2147483647
                          THEN coalesce(%(now)s, now()) + %(lease)s END,
      last_error   = CASE WHEN coalesce(j.attempts, 0) < 2147483647 THEN j.last_error
                          ELSE 'attempts is at the integer limit (2147483647): no attempt '
                               'can be counted; lower it to run this job again' END
  WHERE j.id = ANY(ARRAY(SELECT id FROM next))
  RETURNING j.id, j.queue, j.payload, j.attempts, j.max_attempts, j.status,
            (:claim_no_meta) AS meta
), started AS (:claim_no_starts)
SELECT c.id, c.queue, (:claim_payload), c.attempts, c.max_attempts, c.meta
FROM claimed c JOIN next n ON n.id = c.id
WHERE c.status = 'running'
ORDER BY n.rank;

-- name: claim_payload
-- (An expression.) `claim`'s payloads, whole; a limited claim's are bounded
-- (claim_payload_bounded).
c.payload

-- name: claim_payload_bounded
-- (An expression.) A limited claim's payloads as long as they come to 64 kB in all,
-- NULL past that (read once the claim committed: storage.roundtrip._withheld_read). The answer is
-- sent before the COMMIT, with the queues' limits locks held: one that does not fit in
-- the socket's buffers, read slowly (a slow link) or not at all (a client paused, by
-- SIGSTOP, a sleeping laptop), kept every other drainer's claim of those queues waiting.
-- The size is the text's, whatever the stored one: a big value is stored compressed,
-- and a small one may print far larger (a number is a numeric, '1e100000' a few stored
-- bytes and 100 kB of text).
CASE WHEN sum(octet_length(c.payload::text))
       OVER (ORDER BY n.rank ROWS UNBOUNDED PRECEDING) <= 65536
     THEN c.payload END

-- name: claimed_payloads
-- The payloads a limited claim's answer left out (claim_payload_bounded), once it
-- committed: the jobs are the drain's own.
SELECT id, payload FROM jobs WHERE id = ANY(%(ids)s::bigint[]);

-- name: claim_no_meta
-- (An expression.) `claim`'s meta on a table without the column: none (claim_sql swaps
-- in claim_meta once `migrate` added it).
NULL::jsonb

-- name: claim_meta
-- (An expression, not a subquery: `(SELECT j.meta)` ran as a subplan per row, 3% of
-- the claim's time.)
j.meta

-- name: claim_no_starts
-- `claim`'s record of the starts that rate limits count: none, but for a limited claim
-- (claim_starts). An unreferenced SELECT in a WITH is never run.
SELECT 1;

-- name: claim_starts
-- A limited claim's starts, one row each for the queues with a rate limit: the tokens
-- of their sliding window, taken for good (a job given back does not return its own).
INSERT INTO drainer_starts (queue, at)
SELECT c.queue, coalesce(%(now)s, now()) FROM claimed c
WHERE c.status = 'running' AND c.queue = ANY(%(rated)s::text[])
RETURNING 1;

-- name: limits_lock
-- Before a limited claim, in its transaction: one lock per limited queue, in the order
-- of their keys (no deadlock, even for two names of one key), held until the claim commits, so two drainers never count a limit's
-- room at once; the claim that follows is a new statement, whose snapshot sees every
-- claim committed before the lock was granted. The locks are the statement's rows
-- (a lock in a CTE nothing reads would never be taken); old starts are pruned on the way.
WITH l AS (
  SELECT * FROM jsonb_to_recordset(%(limits)s::jsonb) AS l(queue text, per_seconds float8)
), pruned AS (
  DELETE FROM drainer_starts s
  USING l
  WHERE s.queue = l.queue
    AND s.at <= coalesce(%(now)s, now()) - make_interval(secs => l.per_seconds)
)
SELECT pg_advisory_xact_lock(hashtext('drainer.limit'), hashtext(l.queue))
FROM l
ORDER BY hashtext(l.queue), l.queue;

-- name: limited_eligible
-- (An expression.) Whether queued job j of limited queue l may start as far as its
-- group goes: fewer than per_group jobs of its group are running or were enqueued
-- before it and still wait, so a group's jobs start in enqueue order (id), and one
-- waiting for its retry holds back those after it. Jobs without a group are free. Two
-- counts, each bounded: the group's running jobs (few), and its queued jobs before j
-- read in id order from jobs_group_idx, at most per_group of them (one count of both
-- together read the group's whole backlog for every job it looked at). Its jobs
-- cancelled while running count as running ones (group_cancelled_running).
l.per_group IS NULL OR NOT j.meta ? 'group' OR (
  (SELECT count(*) FROM jobs g
   WHERE g.queue = l.queue AND g.status = 'running' AND g.meta ? 'group'
     AND g.meta ->> 'group' = j.meta ->> 'group')
  + (:group_cancelled_running)
  + (SELECT count(*) FROM (
       SELECT FROM jobs g
       WHERE g.queue = l.queue AND g.meta ? 'group' AND g.meta ->> 'group' = j.meta ->> 'group'
         AND g.status IN ('queued', 'running') AND g.status = 'queued' AND g.id < j.id
       ORDER BY g.id
       LIMIT l.per_group) AS ahead)) < l.per_group;

-- name: limit_running
-- (A subquery.) Limited queue l's running jobs, a crashed worker's until reaped, and
-- those cancelled while running (limit_cancelled_running). Two counts, not
-- one with OR: that one is a bitmap scan, which cannot skip the index entries of rows
-- a drain has finished with (thousands, until vacuum), and took 0.8 ms a claim of 50
-- against 0.5.
SELECT (SELECT count(*) FROM jobs r WHERE r.queue = l.queue AND r.status = 'running')
     + (:limit_cancelled_running);

-- name: cancelled_running
-- (A condition on a row of jobs, at the statement's time.) The fifth state: a job
-- cancelled while running, whose handler may still run in its worker. It is `failed`
-- (no other status exists) and keeps its places under its queue's and group's limits
-- until cancelled_running_until (migration 11), which cancel sets to the claim's lease
-- end, the worker's heartbeat pushes on (extend_cancelled), and end_cancelled clears once the
-- handler ended. Also in the form releases before migration 11 write, read for this
-- release only: `failed` with the claim's lease kept (cancelled_running_before_11).
-- NULL where its columns are: negate it with IS NOT TRUE. Found by
-- jobs_cancelled_running_idx, which holds both forms (jobs_held_idx before migration 11).
status = 'failed' AND (cancelled_running_until > coalesce(%(now)s, now())
                       OR (:cancelled_running_before_11));

-- name: cancelled_running_before_11
-- (A condition.) cancelled_running in the form a release before migration 11 writes,
-- and the only one a schema without the column has: a failed job whose lease is kept
-- and live (no other failed job has a lease).
(:lease_live);

-- name: cancelled_running_unmigrated
-- (A condition.) cancelled_running on a schema without migration 11 (storage.limits.swaps).
status = 'failed' AND (:cancelled_running_before_11);

-- name: lease_live
-- (A condition on a row of jobs.) Its lease has not ended: a running job's is its
-- claim's; one no time ends (another producer's, past year 9998) is none.
locked_until > coalesce(%(now)s, now()) AND locked_until < '9999-01-01';

-- name: cancelled_running_end
-- (An expression on a row that is cancelled_running.) When it leaves that state at the
-- latest: the later end of its two forms (an ended lease counts as none).
greatest(cancelled_running_until, CASE WHEN (:lease_live) THEN locked_until END);

-- name: cancelled_running_end_unmigrated
-- (An expression.) cancelled_running_end on a schema without migration 11.
locked_until;

-- name: limit_cancelled_running
-- (A subquery.) Limited queue l's jobs cancelled while running. Before migration 10,
-- limited_sql, due and stats swap in cancelled_running_none (storage.limits.swaps).
SELECT count(*) FROM jobs h WHERE h.queue = l.queue AND (:cancelled_running);

-- name: group_cancelled_running
-- (A subquery.) limit_cancelled_running for queued job j's group.
SELECT count(*) FROM jobs h
WHERE h.queue = l.queue AND (:cancelled_running)
  AND h.meta ? 'group' AND h.meta ->> 'group' = j.meta ->> 'group';

-- name: limit_cancelled_running_until
-- (A subquery.) When the first of limit_cancelled_running's jobs leaves that state.
SELECT min((:cancelled_running_end)) FROM jobs h WHERE h.queue = l.queue AND (:cancelled_running);

-- name: cancelled_running_none
-- (A subquery.) limit_cancelled_running and group_cancelled_running on a schema before
-- migration 10: none (counting them would read every failed job at each claim).
SELECT 0;

-- name: cancelled_running_until_none
-- (A subquery.) limit_cancelled_running_until on a schema before migration 10: never.
SELECT NULL::timestamptz;

-- name: limit_window_starts
-- (A subquery.) Rate-limited queue l's starts in its window, which ends at t.now.
SELECT count(*) FROM drainer_starts s
WHERE s.queue = l.queue AND s.at > t.now - make_interval(secs => l.per_seconds);

-- name: limited_ready
-- (A subquery.) The first 500 ready jobs of per-group queue l in claim order: where
-- its claim looks first for jobs their group lets start, cheaply, before group_heads.
SELECT id FROM jobs WHERE queue = l.queue AND status = 'queued' AND run_at <= t.now
ORDER BY priority DESC, run_at LIMIT 500;

-- name: more_ready
-- (A condition.) Per-group queue l has more ready jobs than limited_ready's first 500:
-- only then may group_heads find one those left out (one read of the ready index).
EXISTS (SELECT FROM jobs WHERE queue = l.queue AND status = 'queued' AND run_at <= t.now
        ORDER BY priority DESC, run_at OFFSET 500);

-- name: group_heads
-- (A subquery.) Each group's first per_group queued or running jobs of per-group queue
-- l, in id order: the only ones FIFO can let start, one loose-scan probe of
-- jobs_group_idx per group. Read only when the first ready jobs (limited_ready) left
-- room and more are ready: a claim that read every ready job instead took seconds at
-- 200,000 jobs in 5 groups, all held back behind their running heads. Its cost grows
-- with the groups (20,000 groups: 400 ms a claim, when every head waits for a retry).
WITH RECURSIVE g(name) AS (
  (SELECT meta ->> 'group' FROM jobs
   WHERE queue = l.queue AND meta ? 'group' AND status IN ('queued', 'running')
   ORDER BY meta ->> 'group' LIMIT 1)
  UNION ALL
  SELECT (SELECT meta ->> 'group' FROM jobs
          WHERE queue = l.queue AND meta ? 'group' AND status IN ('queued', 'running')
            AND meta ->> 'group' > g.name
          ORDER BY meta ->> 'group' LIMIT 1)
  FROM g WHERE g.name IS NOT NULL
)
SELECT h.id FROM g CROSS JOIN LATERAL (
  SELECT id FROM jobs
  WHERE queue = l.queue AND meta ? 'group' AND status IN ('queued', 'running')
    AND meta ->> 'group' = g.name
  ORDER BY id LIMIT l.per_group) AS h;

-- name: limited_startable
-- (A condition on job j of limited queue l.) Ready, and its group lets it start.
j.queue = l.queue AND j.status = 'queued' AND j.run_at <= t.now AND (:limited_eligible);

-- name: claim_limited
-- `claim`'s rows for queues with limits (%(limits)s: one object per queue, with how
-- many it may take): each queue takes at most the room its limits leave, counted
-- under limits_lock: its concurrency less its running jobs (a crashed worker's count
-- until they are reaped), its rate less the starts in its window; then its ready
-- jobs that their group lets start (limited_arms); and all queues together no more
-- than %(take)s, the process's free handler slots; a paused queue takes none. limited_sql() has the time read
-- when the statement starts, after the locks. `take` is a bigint: --concurrency goes
-- past the int.
SELECT * FROM (
SELECT c.id, row_number() OVER (ORDER BY c.priority DESC, c.run_at, c.id) AS rank
FROM jsonb_to_recordset(%(limits)s::jsonb)
     AS l(queue text, concurrency int, per_group int, rate int, per_seconds float8,
        take bigint)
CROSS JOIN (SELECT coalesce(%(now)s, now()) AS now) AS t
CROSS JOIN LATERAL (
  SELECT greatest(0, least(l.take, l.concurrency - (:limit_running),
                           l.rate - (:limit_window_starts))) AS room
) AS n
CROSS JOIN LATERAL (:limited_arms) AS c
WHERE l.queue <> ALL(:none_paused)
) AS ranked
WHERE ranked.rank <= %(take)s;

-- name: limited_arms
-- (A subquery of claim_limited, per queue l.) Its ready jobs, highest priority then
-- oldest run_at first, at most n.room of them; one arm runs per queue. A queue
-- without per_group takes them from the free arm; one with per_group looks among its
-- first ready jobs that their group lets start, then only if they left room and more
-- are ready, among its groups' heads: the best ready jobs it can start are either
-- among the first or, failing those, among the heads.
SELECT * FROM (:limited_free) AS free
UNION ALL
SELECT * FROM (
  WITH first AS (
    SELECT j.id, j.priority, j.run_at FROM jobs j
    WHERE l.per_group IS NOT NULL AND j.id = ANY(ARRAY(:limited_ready))
      AND (:limited_startable)
    ORDER BY j.priority DESC, j.run_at
    LIMIT n.room
    FOR UPDATE SKIP LOCKED)
  SELECT * FROM first
  UNION ALL
  SELECT * FROM (
    SELECT j.id, j.priority, j.run_at FROM jobs j
    WHERE (SELECT count(*) FROM first) < n.room AND l.per_group IS NOT NULL
      AND (:more_ready)
      AND j.id = ANY(ARRAY(:group_heads)) AND j.id <> ALL(ARRAY(SELECT id FROM first))
      AND (:limited_startable)
    ORDER BY j.priority DESC, j.run_at
    LIMIT n.room - (SELECT count(*) FROM first)
    FOR UPDATE SKIP LOCKED) AS heads
) AS grouped;

-- name: limited_free
-- (A subquery of claim_limited, per queue l.) The free arm alone: what limited_arms
-- is when no queue of the claim has per_group, whose arm then costs the claim about
-- a fifth of its time for nothing.
SELECT j.id, j.priority, j.run_at FROM jobs j
WHERE l.per_group IS NULL
  AND j.queue = l.queue AND j.status = 'queued' AND j.run_at <= t.now
ORDER BY j.priority DESC, j.run_at
LIMIT n.room
FOR UPDATE SKIP LOCKED;

-- name: queues
-- The queues of a claim, one row each, as q(name). The planner cannot see
-- how many names an array parameter holds and guesses 10; the no-op LIMIT makes it
-- guess 1 (a tenth), or the plan it prepares looks ten times dearer than a fresh one
-- on a big table, and every claim is planned again.
SELECT unnest(%(queues)s::text[]) LIMIT cardinality(%(queues)s::text[]);

-- name: claim_oldest
-- `claim`'s rows on a table without priorities: each queue's oldest ready rows come
-- from jobs_ready_idx (queue, run_at) (Limit > LockRows > Index Scan), then the
-- oldest overall are taken. Each queue locks at most claim_each of them.
SELECT c.id, row_number() OVER (ORDER BY c.run_at, c.id) AS rank
FROM (:queues) AS q(name)
CROSS JOIN LATERAL (
  (:oldest_ready)
  LIMIT (:claim_each)
  FOR UPDATE SKIP LOCKED
) AS c
ORDER BY c.run_at, c.id
LIMIT %(limit)s;

-- name: oldest_ready
-- (A subquery, per queue q.name.) Its ready rows, oldest first.
SELECT id, run_at FROM jobs
WHERE queue = q.name AND status = 'queued' AND run_at <= coalesce(%(now)s, now())
ORDER BY run_at;

-- name: claim_each
-- (An expression.) The most rows a claim locks in each queue: the whole batch, in a
-- claim of a few queues; in a claim of many (storage.claim.MANY_QUEUES), claim_share.
%(limit)s

-- name: claim_share
-- (An expression.) A claim of many queues locks in each only its share of the batch
-- (claim_shares: q.take).
q.take

-- name: claim_shares
-- (A subquery, as q(name, take), for a claim of many queues.) How many of the
-- batch each queue holds, by a first look at their ready rows that locks none
-- (claim_look, one queue at a time, in the claim's order); each then locks only its
-- share, passing over rows another claim has locked, as a claim of one queue does.
-- Each locking its first %(limit)s rows instead, the rows left out of the batch
-- included, a claim of 50 from 1,000 queues of 20 jobs locked all 20,000 of them.
SELECT s.name, count(*) AS take
FROM (SELECT q.name FROM (:queues) AS q(name)
      CROSS JOIN LATERAL (:claim_look) AS c
      ORDER BY c.priority DESC, c.run_at, c.id
      LIMIT %(limit)s) AS s
GROUP BY s.name;

-- name: claim_look
-- (A subquery, per queue q.name.) claim_shares' look at a queue of a table without
-- priorities: its first %(limit)s ready rows (the id orders those enqueued together,
-- as in the claim's rank).
SELECT 0 AS priority, r.run_at, r.id FROM ((:oldest_ready) LIMIT %(limit)s) AS r;

-- name: queue_priorities
-- The distinct priorities of queue q.name's queued jobs, highest first (a part of
-- statements that name their queue q): a loose index scan, one probe of
-- jobs_priority_idx (queue, priority DESC, run_at) per priority, read lazily, so a
-- claim that fills its batch from the highest priorities never looks at the others.
WITH RECURSIVE p(priority) AS (
  (SELECT priority FROM jobs
   WHERE queue = q.name AND status = 'queued'
   ORDER BY priority DESC LIMIT 1)
  UNION ALL
  SELECT (SELECT j.priority FROM jobs j
          WHERE j.queue = q.name AND j.status = 'queued' AND j.priority < p.priority
          ORDER BY j.priority DESC LIMIT 1)
  FROM p WHERE p.priority IS NOT NULL
)
SELECT priority FROM p WHERE priority IS NOT NULL;

-- name: claim_by_priority
-- `claim`'s rows once `migrate` added priorities: each queue's ready rows, highest
-- priority first, then oldest run_at; then the best overall are taken. Per queue and
-- priority the scan is Limit > LockRows > Index Scan on jobs_priority_idx and stops
-- at the first run_at in the future (while every job has priority 0 the planner may
-- take jobs_ready_idx instead: the same rows, in the same order), so jobs due later at a high priority cost one probe,
-- where one scan ordered by (priority, run_at) would step over each of them at every
-- claim (PostgreSQL 18's skip scan avoids that, older servers do not). Each queue
-- locks at most claim_each rows.
SELECT c.id, row_number() OVER (ORDER BY c.priority DESC, c.run_at, c.id) AS rank
FROM (:queues) AS q(name)
CROSS JOIN LATERAL (
  SELECT p.priority, r.id, r.run_at
  FROM (:queue_priorities) AS p
  CROSS JOIN LATERAL (
    (:priority_ready)
    LIMIT (:claim_each)
    FOR UPDATE SKIP LOCKED
  ) AS r
  LIMIT (:claim_each)
) AS c
ORDER BY c.priority DESC, c.run_at, c.id
LIMIT %(limit)s;

-- name: priority_ready
-- (A subquery, per queue q.name and priority p.priority.) Its ready rows at that
-- priority, oldest first.
SELECT id, run_at FROM jobs
WHERE queue = q.name AND status = 'queued' AND priority = p.priority
  AND run_at <= coalesce(%(now)s, now())
ORDER BY run_at;

-- name: look_by_priority
-- (A subquery, per queue q.name.) claim_look once `migrate` added priorities: its
-- first %(limit)s ready rows, one priority at a time, as claim_by_priority walks them.
SELECT p.priority, r.run_at, r.id
FROM (:queue_priorities) AS p
CROSS JOIN LATERAL ((:priority_ready) LIMIT %(limit)s) AS r
LIMIT %(limit)s;
