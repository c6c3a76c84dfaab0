-- The database's ceiling for the drain's two statements, driven by pgbench (a C
-- client, -M prepared): drainer's claim of :size jobs, then their batch complete in
-- drainer's form, done_at set as drainer's write-back sets it (see
-- drainer/storage/queries/claim.sql and writeback.sql). \gset hands the claimed ids on.
WITH next AS (
  SELECT id FROM jobs
  WHERE queue = 'bench_noop' AND status = 'queued' AND run_at <= now()
  ORDER BY run_at LIMIT :size
  FOR UPDATE SKIP LOCKED
), claimed AS (
  UPDATE jobs j
  SET status = 'running', attempts = j.attempts + 1,
      locked_until = now() + interval '5 minutes'
  WHERE j.id = ANY(ARRAY(SELECT id FROM next))
  RETURNING j.id, j.attempts
)
SELECT '{' || coalesce(string_agg(id::text, ','), '') || '}' AS ids,
       '{' || coalesce(string_agg(attempts::text, ','), '') || '}' AS attempts
FROM claimed \gset
UPDATE jobs j SET status = 'done', locked_until = NULL, done_at = now()
FROM unnest(:ids::bigint[], :attempts::int[],
            array_fill('running'::text, ARRAY[cardinality(:ids::bigint[])]))
     AS t(id, attempts, status)
WHERE j.id = ANY(:ids::bigint[])
  AND j.id = t.id AND j.status = t.status AND j.attempts = t.attempts;
