-- The database's session budget, and the fleets of drains that widen to work off a
-- backlog together (storage/budget.py, storage/fleets.py).

-- name: session_budget
-- Read once, when a drain decides to widen: the client sessions the server takes
-- (max_connections less the slots reserved for superusers and, on PostgreSQL 16 and
-- later, for pg_use_reserved_connections), the login role's and the database's own
-- limits (-1: none; a superuser is held to neither), and the client sessions open in
-- all, for this role and for this database. pg_stat_activity shows every session's
-- role and database to any role, but another role's backend_type only to a privileged
-- one: a session with a role that is not a client backend (a parallel worker, a
-- walsender) may count too, which only errs on the safe side.
SELECT current_setting('max_connections')::int
         - current_setting('superuser_reserved_connections')::int
         - coalesce(current_setting('reserved_connections', true), '0')::int,
       CASE WHEN r.rolsuper THEN -1 ELSE r.rolconnlimit END,
       CASE WHEN r.rolsuper THEN -1 ELSE d.datconnlimit END,
       count(*),
       count(*) FILTER (WHERE a.usesysid = r.oid),
       count(*) FILTER (WHERE a.datid = d.oid)
FROM pg_roles r, pg_database d, pg_stat_activity a
WHERE r.rolname = session_user AND d.datname = current_database()
  AND a.usesysid IS NOT NULL AND coalesce(a.backend_type, 'client backend') = 'client backend'
GROUP BY r.rolsuper, r.rolconnlimit, d.datconnlimit;

-- name: fleet_make
-- A queue set's fleet, made on first use.
INSERT INTO drainer_fleets (fleet) VALUES (%(fleet)s) ON CONFLICT (fleet) DO NOTHING;

-- name: fleet_read
-- A fleet as it is, with the database's clock (epoch seconds) its leases are on.
SELECT version, target, members, tickets, peak, extract(epoch FROM now())::float8
FROM drainer_fleets WHERE fleet = %(fleet)s;

-- name: fleet_write
-- Compare-and-set: the fleet's new state, only if no one changed it since it was read
-- (no row: read it again and decide again).
UPDATE drainer_fleets
SET version = version + 1, target = %(target)s, members = %(members)s,
    tickets = %(tickets)s, peak = %(peak)s, updated_at = now()
WHERE fleet = %(fleet)s AND version = %(version)s
RETURNING version;

-- name: fleets
-- Every fleet, for `stats`.
SELECT fleet, version, target, members, tickets, peak, extract(epoch FROM now())::float8
FROM drainer_fleets ORDER BY fleet;

-- name: has_fleets
-- Whether the schema has the fleets table (migration 14).
SELECT to_regclass('drainer_fleets') IS NOT NULL;
