"""Test tasks with schedules: a task whose jobs come from its own schedule, and a
schedule declared apart for another task's queue."""

import drainer
from drainer import task


@task("report", cron="0 3 * * *", tz="Europe/Paris")
def report(job):
    return job.scheduled_for.isoformat()


drainer.schedule("tick", "ticks", "*/5 * * * *", payload={"kind": "tick"})


@task("ticks")
def tick(job):
    assert job.payload == {"kind": "tick"}
