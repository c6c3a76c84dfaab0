-- Every statement drainer sends at run time, named. Loaded once by drainer/storage/sql.py.
-- A statement may hold another as a subquery, written (:name).
-- Writes after the claim are all guarded by id AND status = 'running' AND attempts,
-- so a worker can only change a job it still owns. Times come from now(); durations
-- arrive as intervals.
--
-- The batch writes (settle: complete, fail, release; extend) find their rows through the
-- primary key (j.id = ANY(ids)) and compare status with a value that travels with each id
-- (t.status, filled with 'running') instead of the constant: the statistics seldom see
-- a running row, so with `j.status = 'running'` the planner expects one row and joins
-- every running row with every id of the batch, 20 ms instead of 2 for a batch of 500.

-- name: migrate_lock
-- Serialises concurrent `migrate` runs; released at commit.
SELECT pg_advisory_xact_lock(hashtext('drainer.migrate'));

-- name: migrate_version_table
CREATE TABLE IF NOT EXISTS drainer_schema (
  version    int         PRIMARY KEY,
  applied_at timestamptz NOT NULL DEFAULT now()
);

-- name: schema_version
SELECT coalesce(max(version), 0) FROM drainer_schema;

-- name: record_version
INSERT INTO drainer_schema (version) VALUES (%(version)s) ON CONFLICT DO NOTHING;

-- name: features
-- The schema's optional parts (only `jobs` is required): the version table, the
-- archive table (else archiving deletes), migration 5's done_at column,
-- migration 6's priority column and unique keys (the key column and its index), and
-- migration 7's result column, migration 6's meta column, migration 8's schedules
-- table, migration 9's flow control (its table of starts), migration 10's index of
-- jobs cancelled while running, and whether it ever held a row (by the statistics, which may lag a moment: a
-- drain with no schedule declared reads the table only then, so a database that never
-- used schedules pays no statement for them).
SELECT to_regclass('drainer_schema') IS NOT NULL,
       to_regclass('jobs_archive') IS NOT NULL,
       'done_at' = ANY (c.names),
       'priority' = ANY (c.names),
       'key' = ANY (c.names) AND to_regclass('jobs_key_idx') IS NOT NULL,
       'result' = ANY (c.names),
       'meta' = ANY (c.names),
       to_regclass('drainer_schedules') IS NOT NULL,
       to_regclass('drainer_starts') IS NOT NULL,
       to_regclass('jobs_held_idx') IS NOT NULL,
       coalesce((SELECT n_tup_ins + n_live_tup > 0 FROM pg_stat_user_tables
                 WHERE relid = to_regclass('drainer_schedules')), false)
FROM (SELECT coalesce(array_agg(attname::text), '{}') AS names FROM pg_attribute
      WHERE attrelid = to_regclass('jobs') AND attnum > 0 AND NOT attisdropped) AS c;

-- name: start
-- One statement at the start of a drain: reap every queue's expired leases (a
-- serverless deployment may have no other reaper), and read the `features` columns
-- (read again at each drain: a `migrate` may have added the archive table since).
-- Fails with undefined_table when `jobs` is missing. A running row with no lease at
-- all (another producer's) has none to wait for. A hand-made table may allow a NULL
-- max_attempts: the column default stands in. A job failed for good gets run_at now,
-- when it failed, as `settle` gives it.
WITH reaped AS (
  UPDATE jobs
  SET status       = CASE WHEN attempts >= coalesce(max_attempts, 5)
                          THEN 'failed' ELSE 'queued' END,
      run_at       = CASE WHEN attempts >= coalesce(max_attempts, 5)
                          THEN coalesce(%(now)s, now()) ELSE run_at END,
      locked_until = NULL,
      last_error   = coalesce(last_error, 'lease expired')
  WHERE status = 'running'
    AND (locked_until < coalesce(%(now)s, now()) OR locked_until IS NULL)
  RETURNING 1
)
SELECT (SELECT count(*) FROM reaped), schema.*
FROM (:features) AS schema;

-- name: claim
-- The classic SKIP LOCKED claim, for several queues at once: `next` picks the rows and
-- ranks them (claim_oldest on a table without priorities, claim_by_priority once
-- `migrate` added them: queue.claim() swaps one for the other), rows locked but not
-- taken are released at once by the commit. queue.claim() writes %(limit)s as a
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
-- NULL past that (read once the claim committed: queue._withheld_read). The answer is
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
-- `claim`'s meta on a table without the column: none (queue.claim() swaps in claim_meta
-- once `migrate` added it).
SELECT NULL::jsonb;

-- name: claim_meta
SELECT j.meta;

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

-- name: begin_read_committed
-- A write-back's transaction with its claim, whatever the database's or role's default:
-- a limited claim must see the jobs other drainers started while it waited for
-- limits_lock, which a repeatable read snapshot, taken at the transaction's first
-- statement, would not; and a claim under repeatable read fails on a row another
-- drainer changed meanwhile instead of skipping it.
BEGIN ISOLATION LEVEL READ COMMITTED;

-- name: commit
COMMIT;

-- name: no_jit
-- In a transaction of limited claims, claims of many queues or next_due: no JIT
-- compiling. The planner sees the limits' rows as 100 and their queues' lateral scans
-- as a whole table's, so on a server with JIT (the default where PostgreSQL has LLVM)
-- a claim of 20,000 jobs was compiled each time (120 ms, under the queues' locks),
-- though it reads a few rows; a claim's plan for 1,000 queues (each a lateral scan)
-- looks as dear, and compiling it took most of a drain of 20,000 jobs from them.
SET LOCAL jit = off;

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
-- cancelled while running count as running ones until their lease ends (group_held).
l.per_group IS NULL OR NOT j.meta ? 'group' OR (
  (SELECT count(*) FROM jobs g
   WHERE g.queue = l.queue AND g.status = 'running' AND g.meta ? 'group'
     AND g.meta ->> 'group' = j.meta ->> 'group')
  + (:group_held)
  + (SELECT count(*) FROM (
       SELECT FROM jobs g
       WHERE g.queue = l.queue AND g.meta ? 'group' AND g.meta ->> 'group' = j.meta ->> 'group'
         AND g.status IN ('queued', 'running') AND g.status = 'queued' AND g.id < j.id
       ORDER BY g.id
       LIMIT l.per_group) AS ahead)) < l.per_group;

-- name: limit_running
-- (A subquery.) Limited queue l's running jobs, a crashed worker's until reaped, and
-- those cancelled while running until their lease ends (limit_held). Two counts, not
-- one with OR: that one is a bitmap scan, which cannot skip the index entries of rows
-- a drain has finished with (thousands, until vacuum), and took 0.8 ms a claim of 50
-- against 0.5.
SELECT (SELECT count(*) FROM jobs r WHERE r.queue = l.queue AND r.status = 'running')
     + (:limit_held);

-- name: held
-- (An expression.) Whether job h of limited queue l was cancelled while running and
-- its lease has not ended: cancel keeps it (locked_until) as the mark of a handler
-- that may run on, until its worker lets it go (let_go). Found by jobs_held_idx
-- (migration 10); no other failed job has a lease (one no time ends is none).
h.queue = l.queue AND h.status = 'failed' AND h.locked_until > t.now
  AND h.locked_until < '9999-01-01';

-- name: limit_held
-- (A subquery.) Limited queue l's held jobs. Before migration 10, limited_sql, due and
-- stats swap in held_none (limits.held_swaps).
SELECT count(*) FROM jobs h WHERE (:held);

-- name: group_held
-- (A subquery.) limit_held for queued job j's group.
SELECT count(*) FROM jobs h
WHERE (:held) AND h.meta ? 'group' AND h.meta ->> 'group' = j.meta ->> 'group';

-- name: limit_held_until
-- (A subquery.) When limit_held's first lease ends.
SELECT min(h.locked_until) FROM jobs h WHERE (:held);

-- name: held_none
-- (A subquery.) limit_held and group_held on a schema before migration 10: none.
SELECT 0;

-- name: held_until_none
-- (A subquery.) limit_held_until on a schema before migration 10: never.
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
-- than %(take)s, the process's free handler slots. limited_sql() has the time read
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

-- name: due_limited
-- `next_due`'s sources for queues with limits: the earliest moment a queued job may
-- start (now when one is ready and its limits have room; else the earliest future
-- run_at; never before the rate's next token, when the window is full), and the
-- earliest lease end of a running job (whose end, or its holder's death, frees a
-- place). A drain that met only throttled jobs thus arms a wake-up instead of going on.
WITH t(now) AS (SELECT coalesce(%(now)s, now())), l AS (
  SELECT * FROM jsonb_to_recordset(%(limits)s::jsonb)
         AS l(queue text, concurrency int, per_group int, rate int, per_seconds float8)
), s AS MATERIALIZED (
  SELECT l.*, t.now,
    -- a start dated past year 9998 by hand (or by a clock set wrong), 'infinity' too,
    -- holds its token for good: never, not a time Python cannot hold (nor an overflow)
    (SELECT CASE WHEN st.at < '9998-01-01' THEN st.at + make_interval(secs => l.per_seconds)
                 ELSE 'infinity' END FROM drainer_starts st
     WHERE st.queue = l.queue AND st.at > t.now - make_interval(secs => l.per_seconds)
     ORDER BY st.at DESC OFFSET greatest(l.rate - 1, 0) LIMIT 1) AS token,
    coalesce((:limit_running) >= l.concurrency, false) AS full,
    (SELECT min(run_at) FROM jobs WHERE queue = l.queue AND status = 'queued'
       AND run_at > t.now AND run_at < '9999-01-01') AS later,
    least((SELECT min(locked_until) FROM jobs WHERE queue = l.queue AND status = 'running'
             AND locked_until < '9999-01-01'),
          (:limit_held_until)) AS leased
  FROM l, t
)
SELECT min(CASE WHEN s.token >= '9999-01-01' THEN NULL
                WHEN NOT s.full AND CASE
                  WHEN s.per_group IS NULL THEN EXISTS (
                    SELECT FROM jobs j
                    WHERE j.queue = s.queue AND j.status = 'queued' AND j.run_at <= s.now)
                  ELSE EXISTS (SELECT FROM l, t, jobs j WHERE l.queue = s.queue
                                 AND j.id = ANY(ARRAY(:limited_ready)) AND (:limited_startable))
                    OR EXISTS (SELECT FROM l, t, jobs j WHERE l.queue = s.queue
                                 AND (:more_ready)
                                 AND j.id = ANY(ARRAY(:group_heads)) AND (:limited_startable))
                  END
                THEN greatest(s.now, s.token)
                WHEN s.later IS NOT NULL THEN greatest(s.later, s.token) END),
       -- before year 2 ('-infinity' too, another producer's): now, as in next_due
       min(CASE WHEN s.leased < '0002-01-01' THEN s.now ELSE s.leased END)
FROM s;

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
-- claim of a few queues; in a claim of many (queue.MANY_QUEUES), claim_share.
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
-- it: a job that waited past the failed retention must not leave as it fails). The
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

-- name: hold
-- The heartbeat of claims cancelled while running whose handler still runs in this
-- worker: the lease cancel kept for them (the mark that their limits count them) is
-- extended, as a running job's is, so their places stay held while the handler runs.
-- Guarded by the claim's token and by the mark; a lease no time ends is none.
UPDATE jobs j
SET locked_until = coalesce(%(now)s, now()) + %(lease)s
FROM unnest(%(ids)s::bigint[], %(attempts)s::int[]) AS t(id, attempts)
WHERE j.id = ANY(%(ids)s::bigint[]) AND j.id = t.id AND j.attempts = t.attempts
  AND j.status = 'failed' AND j.locked_until IS NOT NULL
  AND j.locked_until < '9999-01-01';

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

-- name: archive_old
-- The ids of at most %(limit)s rows old enough to archive: done rows created more than
-- %(older_than)s ago, and failed rows (cancelled ones too) that failed more than
-- %(failed_older_than)s ago (by run_at, which the statements that fail a job set). Two
-- LIMITed arms rather than one OR: each keeps its partial index (jobs_done_idx,
-- jobs_failed_idx; a table without them is scanned) and stops at the limit, and the
-- failed arm runs only when done rows do not fill the batch. With an OR the planner
-- keeps a BitmapOr of the two indexes while few rows are old, but once many are it
-- takes a Seq Scan under the Limit, which reads the table from its first block again
-- at each batch: 320,000 old rows scattered among 420,000 took 1.3 s to delete that
-- way, 0.65 s with two arms (stored in the order they came, old rows first, 0.40 s
-- and 0.53 s; moving them to the archive costs 8 s either way).
(SELECT id FROM jobs
 WHERE status = 'done' AND created_at < coalesce(%(now)s, now()) - %(older_than)s
 LIMIT %(limit)s)
UNION ALL
(SELECT id FROM jobs
 WHERE status = 'failed' AND run_at < coalesce(%(now)s, now()) - %(failed_older_than)s
   AND (locked_until IS NULL OR locked_until <= coalesce(%(now)s, now())
        OR locked_until >= '9999-01-01')
 LIMIT %(limit)s)
LIMIT %(limit)s;

-- name: archive_aged
-- Whether a row of `jobs` is old enough to archive, as `archive_old` chose them: an
-- expression, not a statement, for the WHERE of the statements that include it.
CASE status WHEN 'done' THEN created_at < coalesce(%(now)s, now()) - %(older_than)s
            WHEN 'failed' THEN run_at < coalesce(%(now)s, now()) - %(failed_older_than)s
                               AND (locked_until IS NULL
                                    OR locked_until <= coalesce(%(now)s, now())
                                    OR locked_until >= '9999-01-01')
            ELSE false END;

-- name: archive_move
-- A batch of `archive_old` leaves `jobs` for the archive, with every column the
-- archive has (through jsonb, matched by name), so the statement stays the same
-- whichever migrations added columns to both tables. The rows are found by = ANY of an
-- array, through the primary key: with IN (subquery) the planner hash-joined a Seq Scan
-- of the whole table at each batch (48 ms a batch of 10,000 among 200,000 rows, 13 ms
-- by the primary key). The row's age is checked again on the row the delete locks
-- (`archive_aged`): a failed job requeued after `archive_old` read it (the requeue
-- committed while the delete waited for the row) is queued, or failed again just now,
-- and stays.
WITH moved AS (
  DELETE FROM jobs
  WHERE id = ANY(ARRAY(:archive_old)) AND (:archive_aged)
  RETURNING *
)
INSERT INTO jobs_archive
SELECT a.*
FROM moved m
CROSS JOIN LATERAL jsonb_populate_record(
  NULL::jobs_archive, to_jsonb(m) || jsonb_build_object('archived_at', now())) AS a
ON CONFLICT (id) DO NOTHING;

-- name: archive_delete
-- The plain batched delete of `archive_old` (its age checked again, as in
-- `archive_move`), when `migrate` has not created the archive table.
DELETE FROM jobs
WHERE id = ANY(ARRAY(:archive_old)) AND (:archive_aged);

-- name: next_due
-- The earliest moment more work of these queues becomes ready: a queued job's
-- run_at or a running job's lease end, clamped to now() when work is ready already,
-- NULL when nothing is left; then its two sources, the earliest queued run_at and the
-- earliest lease end (a lease end matters only if its holder died: the wake-ups tell
-- them apart), the database clock's now() they were judged at, and the queues with
-- ready jobs that none of %(known)s names (none when it is NULL). Another producer
-- may write times Python cannot hold: past year 9998 ('infinity' too) a job is
-- parked, never due; before year 2 ('-infinity' too) it is ready, due now. The
-- sources are computed once (MATERIALIZED), however often the answer names them.
WITH RECURSIVE t(now) AS (SELECT coalesce(%(now)s, now())),
d AS MATERIALIZED (SELECT
  (SELECT min(r.run_at)
   FROM unnest(%(queues)s::text[]) AS q(name)
   CROSS JOIN LATERAL (
     SELECT run_at FROM jobs
     WHERE queue = q.name AND status = 'queued' AND run_at < '9999-01-01'
     ORDER BY run_at LIMIT 1
   ) AS r) AS queued,
  (SELECT min(locked_until) FROM jobs
   WHERE status = 'running' AND queue = ANY(%(queues)s::text[])
     AND locked_until < '9999-01-01') AS leased),
-- The first 1,000 queues (by name) that have queued jobs, one index descent apiece
-- (a loose index scan of the ready index), read only as far as the answer's last
-- column needs: up to 20 of them with a ready job that none of %(known)s names (a
-- misspelled queue, a task module not loaded): jobs no task of the drain will run.
-- NOT IN (subquery) is a hashed lookup: the names it scans are never all read first.
listed(queue, n) AS (
  (SELECT queue, 1 FROM jobs WHERE status = 'queued' AND %(known)s::text[] IS NOT NULL
   ORDER BY queue LIMIT 1)
  UNION ALL
  SELECT (SELECT j.queue FROM jobs j WHERE j.status = 'queued' AND j.queue > q.queue
          ORDER BY j.queue LIMIT 1), q.n + 1
  FROM listed q WHERE q.queue IS NOT NULL AND q.n < 1000
)
SELECT CASE WHEN least(queued, leased) IS NULL THEN NULL
            ELSE greatest(least(queued, leased), t.now) END,
       CASE WHEN queued < '0002-01-01' THEN t.now ELSE queued END,
       CASE WHEN leased < '0002-01-01' THEN t.now ELSE leased END,
       t.now,
       ARRAY(SELECT q.queue FROM listed q
             WHERE q.queue NOT IN (SELECT unnest(%(known)s::text[]))
               AND EXISTS (SELECT FROM jobs j WHERE j.queue = q.queue
                             AND j.status = 'queued' AND j.run_at <= t.now)
             LIMIT 20)
FROM d, t;

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
-- statement's snapshot, which cannot see it: queue.enqueue() asks again. ON CONFLICT
-- DO NOTHING locks no row; the replacing UPDATE locks only a row it sees queued, but if
-- a claim takes it meanwhile, the recheck leaves the running row locked until the
-- caller commits (the worker's writes would wait): queue.enqueue() sends this in a
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
-- Around an enqueue that may replace a holder (queue.enqueue()), in the caller's transaction.
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
-- statement fail on the unique index, and queue.enqueue_many() undoes it to a savepoint
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

-- name: requeue
-- Failed jobs (these ids, or the queue's, less those in %(skip)s) back to queued with a
-- fresh budget: max_attempts rises by as many as it allowed (at least one more), and
-- attempts is never lowered, so no claim's token (id, attempts) is ever issued twice
-- and a stale worker still holding an old one can change nothing. The old error goes
-- with the old budget. A queue's requeue leaves cancelled jobs alone; by id they come back.
-- A job cancelled while running stays failed while its lease runs (see cancel): its old
-- handler may run until then, and a job must not run twice at once, nor leave its place
-- under its limits (a queued job holds none) while that handler runs (requeue_waiting).
UPDATE jobs
SET status = 'queued', run_at = now(), locked_until = NULL, last_error = NULL,
    max_attempts = least(2147483647, attempts::bigint + greatest(max_attempts, 1))::int
WHERE status = 'failed'
  AND (id = ANY(%(ids)s::bigint[])
       OR (queue = %(queue)s AND last_error IS DISTINCT FROM 'cancelled'))
  AND id <> ALL(%(skip)s::bigint[])
  AND (locked_until IS NULL OR locked_until <= now() OR locked_until >= '9999-01-01')
RETURNING id;

-- name: requeue_waiting
-- The jobs of these ids `requeue` left failed as their place is still held (cancelled
-- while running, their lease not ended), with when their lease ends.
SELECT id, locked_until FROM jobs
WHERE id = ANY(%(ids)s::bigint[]) AND status = 'failed' AND locked_until > now()
  AND locked_until < '9999-01-01'
ORDER BY id;

-- name: requeue_held
-- The failed jobs `requeue` would bring back whose key is held, each with the job
-- that holds it: a queued or running job, else the newest of those failed jobs with
-- the same key (which comes back; two cannot).
WITH failed AS (
  SELECT id, queue, key FROM jobs
  WHERE status = 'failed' AND key IS NOT NULL
    AND (id = ANY(%(ids)s::bigint[])
         OR (queue = %(queue)s AND last_error IS DISTINCT FROM 'cancelled'))
)
SELECT id, holder
FROM (SELECT f.id, coalesce(
               (SELECT h.id FROM jobs h WHERE h.queue = f.queue AND h.key = f.key
                  AND h.status IN ('queued', 'running')),
               (SELECT max(o.id) FROM failed o WHERE o.queue = f.queue AND o.key = f.key))
             AS holder
      FROM failed f) AS held
WHERE holder <> id
ORDER BY id;

-- name: cancel
-- Withdraw a queued or running job; the four statuses (queued, running, done, failed) stay the only ones.
-- attempts stays as it is: a running job's worker then finds it no longer its own
-- (its heartbeat, completion or failure changes nothing), and a later requeue's
-- claim gets a token that worker never held. run_at becomes now, when it was cancelled:
-- archiving judges a failed job's age by it. A running job keeps its lease
-- (locked_until): its handler may run on until its worker sees the cancel and the
-- handler ends (let_go); while it runs, the worker's heartbeats go on extending that
-- lease (hold), and if the worker is gone, the lease runs out. Until then its limits
-- count it (limit_held) and neither requeue nor archiving takes it. A lease that ended
-- already, or one no time ends (another producer's), is not kept, nor counted.
UPDATE jobs
SET status = 'failed', last_error = 'cancelled', run_at = now(),
    locked_until = CASE WHEN status = 'running' AND locked_until > now()
                             AND locked_until < '9999-01-01' THEN locked_until END
WHERE status IN ('queued', 'running') AND id = ANY(%(ids)s::bigint[])
RETURNING id;

-- name: let_go
-- Claims cancelled while running (they keep their lease: see cancel) whose handler has
-- ended in their worker, or never began: their limits' places free now. Only a job
-- failed since that claim, with its lease kept, changes.
UPDATE jobs j
SET locked_until = NULL
FROM unnest(%(ids)s::bigint[], %(attempts)s::int[]) AS t(id, attempts)
WHERE j.id = ANY(%(ids)s::bigint[]) AND j.id = t.id AND j.attempts = t.attempts
  AND j.status = 'failed' AND j.locked_until IS NOT NULL;

-- name: age_since
-- (A lateral subquery.) The time job j's age counts from in `stats` and `doctor`: its
-- time a.at, or, when that is infinite (another producer's '-infinity': an infinite
-- age is not JSON), its creation, or now.
SELECT CASE WHEN isfinite(a.at) THEN a.at WHEN isfinite(j.created_at) THEN j.created_at
            ELSE now() END;

-- name: stats
SELECT j.queue, j.status, count(*) AS jobs,
       extract(epoch FROM now() - min(s.since) FILTER (
         WHERE j.status = 'queued' AND j.run_at <= now())) AS oldest_ready_seconds,
       count(*) FILTER (WHERE j.status = 'running' AND j.locked_until < now()) AS expired_leases
FROM jobs j
CROSS JOIN LATERAL (SELECT j.run_at) AS a(at)
CROSS JOIN LATERAL (:age_since) AS s(since)
GROUP BY j.queue, j.status
ORDER BY j.queue, j.status;

-- name: stats_priorities
-- `stats`: jobs queued, running and failed by queue and priority, for the queues where
-- one of them has a priority other than 0 (migration 6).
SELECT queue, priority, status, count(*)
FROM jobs
WHERE status IN ('queued', 'running', 'failed')
  AND queue IN (SELECT queue FROM jobs
                WHERE priority <> 0 AND status IN ('queued', 'running', 'failed'))
GROUP BY queue, priority, status
ORDER BY queue, priority DESC, status;

-- name: top_errors
-- `stats`: each queue's most frequent errors among the jobs that failed for good or
-- wait to retry (done jobs, which recovered, and cancelled ones left out), with how
-- many jobs hold each and the newest of them, for `drainer show`; ties go to the
-- error seen most recently.
SELECT queue, last_error, jobs, latest
FROM (SELECT queue, last_error, count(*) AS jobs, max(id) AS latest,
             row_number() OVER (PARTITION BY queue
                                ORDER BY count(*) DESC, max(id) DESC) AS rank
      FROM jobs
      WHERE status IN ('queued', 'running', 'failed') AND last_error IS NOT NULL
        AND last_error <> 'cancelled'
      GROUP BY queue, last_error) AS e
WHERE rank <= %(top)s
ORDER BY queue, rank;

-- name: failed_jobs
-- `drainer failed`: failed jobs of one queue or all, newest first (by id: no column
-- records when a job failed). Times as the database writes them, JSON text, so that
-- one Python cannot hold (year 10000, infinity) is shown, not fatal.
SELECT id, queue, attempts, max_attempts, to_json(created_at) #>> '{}', last_error
FROM jobs
WHERE status = 'failed' AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)
ORDER BY id DESC
LIMIT %(limit)s;

-- name: show_job
-- `drainer show`: one job's row, every column the table has (done_at when migration 5
-- added it), in column order, as JSON text (times as the database writes them); and
-- the seconds its lease has left by the database clock (negative once it ran out; NULL
-- without one, or for another producer's that no time ends).
SELECT row_to_json(j)::text,
       CASE WHEN isfinite(j.locked_until) AND j.locked_until < '9999-01-01'
            THEN extract(epoch FROM j.locked_until - now())::float8 END
FROM jobs j WHERE j.id = %(id)s;

-- name: show_archived_job
-- `drainer show` of a job no longer in `jobs`, when `migrate` created the archive
-- (it holds no lease).
SELECT row_to_json(a)::text, NULL::float8 FROM jobs_archive a WHERE a.id = %(id)s;

-- name: job_statuses
-- `drainer cancel` of ids it could not withdraw: which of them are jobs, and their status
-- ('cancelled' for a job withdrawn already).
SELECT id, CASE WHEN status = 'failed' AND last_error = 'cancelled' THEN 'cancelled'
                ELSE status END
FROM jobs WHERE id = ANY(%(ids)s::bigint[]);

-- name: archived_job_statuses
-- The same, in the archive, when `migrate` created it.
SELECT id, CASE WHEN status = 'failed' AND last_error = 'cancelled' THEN 'cancelled'
                ELSE status END
FROM jobs_archive WHERE id = ANY(%(ids)s::bigint[]);

-- name: job_result
-- `drainer.result`: a job's status, its kept return value (JSON text; NULL when none
-- was kept) and last error, from jobs.
SELECT status, result::text, last_error FROM jobs WHERE id = %(id)s;

-- name: archived_job_result
-- `drainer.result` of a job no longer in `jobs`, when `migrate` created the archive.
SELECT status, result::text, last_error FROM jobs_archive WHERE id = %(id)s;

-- name: table_health
SELECT n_live_tup, n_dead_tup, last_autovacuum, last_vacuum
FROM pg_stat_user_tables
WHERE relid = to_regclass('jobs');

-- name: listen
-- The always-on worker's wake-up channel (migration 4's trigger sends the queue name).
LISTEN jobs;

-- name: seconds_until
-- How long the always-on worker may wait for a drain's next_due, by the database clock.
SELECT greatest(0, extract(epoch FROM %(at)s::timestamptz - now()))::float8;

-- name: doctor_sessions
-- `doctor`: the other client sessions of this database (the xmin horizon that holds
-- back vacuum is per database), with how long they have been connected, in their
-- state, and in their transaction.
SELECT pid, usename, application_name, state,
       extract(epoch FROM now() - backend_start)::float8 AS connected_seconds,
       extract(epoch FROM now() - state_change)::float8 AS state_seconds,
       extract(epoch FROM now() - xact_start)::float8 AS transaction_seconds,
       left(query, 200) AS query
FROM pg_stat_activity
WHERE datname = current_database() AND backend_type = 'client backend'
  AND pid <> pg_backend_pid()
ORDER BY xact_start NULLS LAST, state_change DESC;

-- name: doctor_sees_all_sessions
-- Without pg_read_all_stats, other roles' sessions show no state or query.
SELECT pg_has_role(current_user, 'pg_read_all_stats', 'member');

-- name: doctor_jobs
-- `doctor`: expired leases (no reaper has run), the oldest ready job, and the queues
-- that have queued jobs (to EXPLAIN the claim with). A running job's age counts from
-- its lease's end, a queued one's from its run_at.
SELECT count(*) FILTER (WHERE j.status = 'running' AND j.locked_until < now()) AS expired,
       extract(epoch FROM now() - min(s.since) FILTER (
         WHERE j.status = 'running' AND j.locked_until < now()))::float8 AS expired_seconds,
       extract(epoch FROM now() - min(s.since) FILTER (
         WHERE j.status = 'queued' AND j.run_at <= now()))::float8 AS oldest_ready_seconds,
       coalesce(array_agg(DISTINCT j.queue) FILTER (WHERE j.status = 'queued'), '{}') AS queues
FROM jobs j
CROSS JOIN LATERAL (SELECT CASE WHEN j.status = 'running' THEN j.locked_until
                                ELSE j.run_at END) AS a(at)
CROSS JOIN LATERAL (:age_since) AS s(since)
WHERE j.status IN ('queued', 'running');

-- name: doctor_ready_index
-- Whether a ready index (jobs_ready_idx, jobs_priority_idx) exists and is valid (NULL:
-- missing), and the planner's row estimate of jobs (-1 before the first ANALYZE).
SELECT (SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass(%(index)s)),
       (SELECT reltuples FROM pg_class WHERE oid = to_regclass('jobs'))::float8;

-- name: explain
-- Prefixed to a named query (the claim) so `doctor` sees the plan of the real statement.
EXPLAIN (FORMAT JSON)

-- name: done_last_hour
-- Jobs done in the last hour per queue, by done_at (migration 5); rows archived
-- within the hour are no longer counted.
SELECT queue, count(*)
FROM jobs
WHERE status = 'done' AND done_at > now() - interval '1 hour'
GROUP BY queue
ORDER BY queue;

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

-- name: limits_record
-- The limits the drain's code declares for its queues (%(limits)s), for `stats` and
-- `doctor`, written only where they changed; the queues of %(unlimited)s (drained, with
-- a task and no limits now) lose theirs. One drainer at a time (`serial`, read before
-- any row is written, its lock held to the end): each locks several rows, in the order
-- of its --queue options, and two that name the same queues in another order, or move
-- a limit from one queue to another, deadlocked. A queue named twice is one row.
WITH serial AS MATERIALIZED (
  SELECT pg_advisory_xact_lock(hashtext('drainer.limits_record')) AS locked
), l AS (
  SELECT * FROM jsonb_to_recordset(%(limits)s::jsonb)
         AS l(queue text, concurrency int, per_group int, rate int, per_seconds float8)
), gone AS (
  DELETE FROM drainer_limits WHERE queue = ANY(%(unlimited)s::text[])
    AND EXISTS (SELECT FROM serial)
)
INSERT INTO drainer_limits AS d (queue, concurrency, per_group, rate, per_seconds)
SELECT DISTINCT ON (l.queue) l.queue, l.concurrency, l.per_group, l.rate, l.per_seconds
FROM serial, l
ORDER BY l.queue
ON CONFLICT (queue) DO UPDATE
SET concurrency = excluded.concurrency, per_group = excluded.per_group,
    rate = excluded.rate, per_seconds = excluded.per_seconds, updated_at = now()
WHERE (d.concurrency, d.per_group, d.rate, d.per_seconds) IS DISTINCT FROM
      (excluded.concurrency, excluded.per_group, excluded.rate, excluded.per_seconds);

-- name: stats_limits
-- `stats` and `doctor`: each limited queue's limits as the latest drain declared them,
-- its running jobs, its starts in the rate's window, its ready jobs, and those of them
-- their group holds back.
SELECT l.queue, l.concurrency, l.per_group, l.rate, l.per_seconds,
       (:limit_running), (:limit_window_starts),
       (SELECT count(*) FROM jobs j WHERE j.queue = l.queue AND j.status = 'queued'
          AND j.run_at <= now()),
       (SELECT count(*) FROM jobs j WHERE j.queue = l.queue AND j.status = 'queued'
          AND j.run_at <= now() AND NOT (:limited_eligible))
FROM (SELECT queue, concurrency, per_group, rate,
             -- a row edited by hand: a window no interval holds is no window
             CASE WHEN per_seconds > 0 AND per_seconds <= 31536000 THEN per_seconds END
               AS per_seconds
      FROM drainer_limits) AS l, (SELECT now() AS now) AS t
ORDER BY l.queue;

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

-- name: testing_queued
-- drainer.testing.enqueued(): the queued jobs (of one queue, or all), with every
-- column but the payload as one JSON object: a table made by hand may lack the key,
-- priority and meta columns.
SELECT j.id, j.queue, j.payload, j.run_at, j.attempts, j.max_attempts, to_jsonb(j) - 'payload'
FROM jobs j
WHERE j.status = 'queued' AND (%(queue)s::text IS NULL OR j.queue = %(queue)s::text)
ORDER BY j.queue, j.id;
