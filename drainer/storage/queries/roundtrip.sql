-- The frame of the pipelined round trip (storage/roundtrip.py): a write-back and the
-- next claim sent as one transaction of their own.

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
