"""A day of jobs against a scale-to-zero database compute, drained by drainer's own
code on a real PostgreSQL, on virtual time.

`python -m bench.simulate` runs it. The pieces: `kernel` (virtual time for real
threads, behind `drainer.clock`), `compute` (when the compute is awake, and what
each connection's statements cost it), `database` (the PostgreSQL the replays
drain), `aws` (Lambda and Scheduler), `faults` (lost kicks, dead runs, failed
wake-ups, restarts), `work` (the jobs' task module), `day` (the
workload file), `strategies` (ways of waiting for work), `metrics` (what a replay
of the day cost, and the ideal), `widening` (a backlog of a million jobs widened,
drainer's fleet against SQS's ramp, modelled).
"""
