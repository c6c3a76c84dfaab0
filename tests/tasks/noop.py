from drainer import task


@task("default")
def noop(job):
    pass
