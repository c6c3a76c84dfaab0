-- The database's ceiling for the drain's two statements, driven by pgbench (a C
-- client): claim :size jobs (the seed's claim), then complete them in one guarded
-- UPDATE. Run with -D size=N; \gset hands the claimed ids to the second statement.
WITH next AS (
  SELECT id FROM jobs
  WHERE queue = 'bench_noop' AND status = 'queued' AND run_at <= now()
  ORDER BY run_at LIMIT :size
  FOR UPDATE SKIP LOCKED
), claimed AS (
  UPDATE jobs j
  SET status = 'running', attempts = j.attempts + 1,
      locked_until = now() + interval '5 minutes'
  FROM next WHERE j.id = next.id
  RETURNING j.id, j.attempts
)
SELECT coalesce(string_agg(id::text, ','), '0') AS ids,
       coalesce(string_agg(attempts::text, ','), '0') AS attempts
FROM claimed \gset
UPDATE jobs j SET status = 'done', locked_until = NULL
FROM unnest(ARRAY[:ids]::bigint[], ARRAY[:attempts]::int[]) AS t(id, attempts)
WHERE j.id = t.id AND j.status = 'running' AND j.attempts = t.attempts;
