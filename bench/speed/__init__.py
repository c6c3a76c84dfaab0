"""The speed bench: drainer, the hand-written psycopg loop, PgQueuer and procrastinate
draining the same jobs on one throwaway PostgreSQL. `python -m bench.speed`; the
method is in bench/README.md."""
