"""Test tasks with a schedule whose payload holds an emoji, which a LATIN1 database
cannot store, beside a plain schedule and a queue with no schedule."""

import drainer
from drainer import task

drainer.schedule("smile", "smiles", "@hourly", payload={"face": "\N{GRINNING FACE}"})
drainer.schedule("plain", "plain", "@hourly")


@task("smiles")
def smile(job):
    pass


@task("plain")
def plain(job):
    pass


@task("unrelated")
def unrelated(job):
    pass
