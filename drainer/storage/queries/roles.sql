-- A role that can drain and enqueue, and nothing more: what a worker's or an
-- application's login needs on the queue's tables, no DDL. Run it as the owner of
-- the tables, after `drainer migrate` (which keeps running as the owner), in the
-- database that holds them, e.g. `psql "$OWNER_URL" -f drainer/storage/queries/roles.sql`; then
-- give the role to each login: `GRANT drainer_worker TO app_login;`.
-- It is idempotent: run it again after a migration that adds a table.
--
-- The drain needs: jobs SELECT (reading rows to claim, reap, and for next_due),
-- UPDATE (claim with FOR UPDATE, complete, fail, extend, release, reap, requeue,
-- cancel), INSERT (enqueue, COPY), DELETE (archiving); jobs_archive INSERT and
-- SELECT (the move's ON CONFLICT (id) DO NOTHING reads the id); drainer_schedules
-- SELECT, INSERT, UPDATE (every drain of a queue with a schedule reads, stores and
-- moves it; once the table holds a row, drains of other queues read it too);
-- drainer_starts SELECT, INSERT, DELETE and drainer_limits SELECT, INSERT, UPDATE,
-- DELETE (a drain of a queue with limits counts, records and prunes its starts, and
-- records its limits for `stats`); drainer_signatures SELECT, INSERT, DELETE (the
-- HTTP entry point remembers signed requests, and prunes them); drainer_pauses SELECT
-- (every claim reads the paused queues; pausing and resuming are the owner's, or a
-- role granted INSERT and DELETE on it); drainer_fleets SELECT, INSERT, UPDATE (a drain
-- that widens, and its members, keep their fleet's row). No sequence grant: an identity column needs
-- none. No TRUNCATE, REFERENCES or TRIGGER, no CREATE on
-- the schema, and no ownership, so no ALTER, DROP or index builds.
-- PostgreSQL 14 and older let every role create tables in `public`; there, also run
-- `REVOKE CREATE ON SCHEMA public FROM PUBLIC;` (15 and later do so already).

DO $$
BEGIN
  CREATE ROLE drainer_worker NOLOGIN;
EXCEPTION WHEN duplicate_object THEN
  NULL;  -- made by an earlier run, or in another database of the cluster
END
$$;

GRANT USAGE ON SCHEMA public TO drainer_worker;
GRANT SELECT, INSERT, UPDATE, DELETE ON jobs TO drainer_worker;

-- The archive table exists once `migrate` has run; without it the drain deletes.
DO $$
BEGIN
  IF to_regclass('jobs_archive') IS NOT NULL THEN
    GRANT SELECT, INSERT ON jobs_archive TO drainer_worker;
  END IF;
END
$$;

-- The schedules table (migration 8), the flow control tables (migration 9) and the
-- signed HTTP requests seen (the HTTP entry point's), the paused queues, the fleets.
DO $$
BEGIN
  IF to_regclass('drainer_schedules') IS NOT NULL THEN
    GRANT SELECT, INSERT, UPDATE ON drainer_schedules TO drainer_worker;
  END IF;
  IF to_regclass('drainer_starts') IS NOT NULL THEN
    GRANT SELECT, INSERT, DELETE ON drainer_starts TO drainer_worker;
    GRANT SELECT, INSERT, UPDATE, DELETE ON drainer_limits TO drainer_worker;
  END IF;
  IF to_regclass('drainer_signatures') IS NOT NULL THEN
    GRANT SELECT, INSERT, DELETE ON drainer_signatures TO drainer_worker;
  END IF;
  IF to_regclass('drainer_pauses') IS NOT NULL THEN
    GRANT SELECT ON drainer_pauses TO drainer_worker;
  END IF;
  IF to_regclass('drainer_fleets') IS NOT NULL THEN
    GRANT SELECT, INSERT, UPDATE ON drainer_fleets TO drainer_worker;
  END IF;
END
$$;
