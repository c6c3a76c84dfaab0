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
from drainer.settings import Drain

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
    is deleted."""

    def __init__(self, kernel: Kernel, invoke: Callable[[dict], None]) -> None:
        self.kernel, self.invoke = kernel, invoke
        self.armed: dict[str, object] = {}  # name -> the token of its firing
        self.fired: list[float] = []  # when each wake-up fired, on the virtual clock

    def create_schedule(self, *, Name: str, ScheduleExpression: str, Target: dict,  # noqa: N803
                        **_: object) -> None:
        if Name in self.armed:
            raise _error("ConflictException", "CreateSchedule")
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
    simulated thread, `invoke` seconds later."""

    def __init__(self, kernel: Kernel, settings: Settings, *, invoke: float,
                 timeout: float) -> None:
        self.kernel, self.settings = kernel, settings
        self.invoke_seconds, self.timeout = invoke, timeout
        self.scheduler = Scheduler(kernel, self.invoke)
        self.invocations = 0
        self.seconds = 0.0  # time runs took

    def invoke(self, event: dict) -> None:
        self.invocations += 1
        self.kernel.call_at(self.kernel.now + self.invoke_seconds,
                            lambda: self.kernel.spawn(self._run, event))

    def _run(self, event: dict) -> None:
        began = self.kernel.now
        try:
            function._drain(events.recognise(event), Context(began + self.timeout),
                            self.settings)
        finally:
            self.seconds += self.kernel.now - began

    @contextmanager
    def installed(self, connect: Callable[..., object]) -> Iterator[None]:
        """The AWS clients, and `connect` as the function's way to the database."""
        with (replaced(clients, get=lambda service: {"scheduler": self.scheduler}[service],
                       invoke_async=lambda _function, event: self.invoke(event)),
              replaced(cloud, connect=connect)):
            yield


def settings(*, queue: str, task_module: str, lease: float, concurrency: int,
             margin: float, max_depth: int) -> Settings:
    """The function's settings, as its environment would give them, with wake-ups on."""
    drain = Drain(tasks=[task_module], queues=[queue], lease=lease, concurrency=concurrency)
    return Settings(credentials=Credentials(url="postgresql:///simulated"), drain=drain,
                    margin=margin, max_depth=max_depth, schedule_group="drainer-wakeups",
                    scheduler_role_arn=f"arn:aws:iam::{ACCOUNT}:role/drainer-scheduler")
