"""A discrete-event model of a day of jobs against a scale-to-zero database compute.

`python -m bench.simulate` runs it. The pieces: `engine` (time and processes),
`compute` (when the compute is awake), `table` (the jobs table's semantics),
`day` (the workload file), `strategies` (ways of waiting for work, ours driven by
`drainer.wake` and `drainer.run.Sizer`), `metrics` (what a run of the day cost).
"""
