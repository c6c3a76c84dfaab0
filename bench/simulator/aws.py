"""What ours runs on, modelled: Lambda (an asynchronous invoke starts a run of the
shipped function `invoke` seconds later, with no limit on concurrent runs) and
EventBridge Scheduler (one-time schedules by name in one group, each invoking the
function at its minute unless deleted first). `installed()` puts them where
`drainer.aws.clients` would give boto3's clients.
"""

import json
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime

from botocore.exceptions import ClientError

from drainer import clock, cloud
from drainer.aws import clients, events, function
from drainer.aws.credentials import Credentials
from drainer.aws.settings import Settings
from drainer.errors import DrainerError
from drainer.settings import Drain

from .faults import Draws
from .kernel import Kernel, replaced

ACCOUNT = "123456789012"
FUNCTION_ARN = f"arn:aws:lambda:us-east-1:{ACCOUNT}:function:drainer"
AT = re.compile(r"at\((.+)\)")


def _error(code: str, operation: str) -> ClientError:
    return ClientError({"Error": {"Code": code, "Message": code}}, operation)


@dataclass
class Context:
    """The Lambda context: the function's ARN and the time it has left."""

    ends: float  # on the virtual clock
    function_name: str = "drainer"
    invoked_function_arn: str = FUNCTION_ARN
    aws_request_id: str = "simulated"

    def get_remaining_time_in_millis(self) -> int:
        return int((self.ends - clock.monotonic()) * 1000)


class Scheduler:
    """One schedule group's one-time schedules; a name arms once until it fires or
    is deleted. A create struck by a fault is refused (ThrottlingException)."""

    def __init__(self, kernel: Kernel, invoke: Callable[[dict], None], draws: Draws) -> None:
        self.kernel, self.invoke, self.draws = kernel, invoke, draws
        self.armed: dict[str, object] = {}  # name -> the token of its firing
        self.fired: list[float] = []  # when each wake-up fired, on the virtual clock

    def create_schedule(self, *, Name: str, ScheduleExpression: str, Target: dict,  # noqa: N803
                        **_: object) -> None:
        if Name in self.armed:
            raise _error("ConflictException", "CreateSchedule")
        if self.draws.hit("failed_arms"):
            raise _error("ThrottlingException", "CreateSchedule")
        token = self.armed[Name] = object()
        at = datetime.fromisoformat(AT.fullmatch(ScheduleExpression)[1]).replace(tzinfo=UTC)
        event = json.loads(Target["Input"])

        def fire() -> None:
            if self.armed.get(Name) is token:
                del self.armed[Name]
                self.fired.append(self.kernel.now)
                self.invoke(event)

        self.kernel.call_at((at - self.kernel.start).total_seconds(), fire)

    def delete_schedule(self, *, Name: str, **_: object) -> None:  # noqa: N803
        if self.armed.pop(Name, None) is None:
            raise _error("ResourceNotFoundException", "DeleteSchedule")

    def get_paginator(self, operation: str) -> "Scheduler":
        assert operation == "list_schedules"
        return self

    def paginate(self, *, NamePrefix: str = "", **_: object) -> list[dict]:  # noqa: N803
        return [{"Schedules": [{"Name": n} for n in self.armed if n.startswith(NamePrefix)]}]


class Lambda:
    """The function: each invoke is a run of `drainer.aws.function` on its own
    simulated thread (and the threads it starts, its group), `invoke` seconds later.
    A kick struck by a fault never arrives; a run struck by one dies at its first
    job (`before_job`)."""

    def __init__(self, kernel: Kernel, settings: Settings, *, invoke: float,
                 timeout: float, draws: Draws) -> None:
        self.kernel, self.settings, self.draws = kernel, settings, draws
        self.invoke_seconds, self.timeout = invoke, timeout
        self.scheduler = Scheduler(kernel, self.invoke, draws)
        self.invocations = 0
        self.fanouts = 0  # invocations of members started to widen a fleet
        self.failed = 0  # runs that ended with an error (the database gone too long)
        self.seconds = 0.0  # time runs took
        self.doomed: dict[int, float] = {}  # group -> when its run began

    def invoke(self, event: dict) -> None:
        if event.get("source") == events.ENQUEUE and self.draws.hit("lost_kicks"):
            return
        self.invocations += 1
        self.fanouts += event.get("source") == events.FANOUT
        self.kernel.call_at(self.kernel.now + self.invoke_seconds,
                            lambda: self.kernel.spawn(self._run, event))

    def _run(self, event: dict) -> None:
        began = self.kernel.now
        if self.draws.hit("dead_runs"):
            self.doomed[self.kernel.group()] = began
        try:
            function._drain(events.recognise(event), Context(began + self.timeout),
                            self.settings)
        except DrainerError:
            self.failed += 1  # a failed invocation; the jobs are in the table
        finally:
            self.seconds += self.kernel.now - began

    def before_job(self) -> None:
        """Where a doomed run dies: its first job, once it holds the batch."""
        began = self.doomed.pop(self.kernel.group(), None)
        if began is not None:
            self.seconds += self.kernel.now - began
            self.kernel.kill()

    @contextmanager
    def installed(self, connect: Callable[..., object]) -> Iterator[None]:
        """The AWS clients, and `connect` as the function's way to the database."""
        with (replaced(clients, get=lambda service: {"scheduler": self.scheduler}[service],
                       invoke_async=lambda _function, event: self.invoke(event)),
              replaced(cloud, connect=connect)):
            yield


def settings(*, queue: str, task_module: str, lease: float, concurrency: int,
             margin: float, max_depth: int, max_width: int | None = None) -> Settings:
    """The function's settings, as its environment would give them, with wake-ups on;
    `max_width` None: the default cap of its fleet."""
    drain = Drain(tasks=[task_module], queues=[queue], lease=lease, concurrency=concurrency)
    return Settings(credentials=Credentials(url="postgresql:///simulated"), drain=drain,
                    margin=margin, max_depth=max_depth, schedule_group="drainer-wakeups",
                    scheduler_role_arn=f"arn:aws:iam::{ACCOUNT}:role/drainer-scheduler",
                    **({} if max_width is None else {"max_width": max_width}))
