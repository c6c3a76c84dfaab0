"""What became of a handler's run and of a batch: how each handler ended, what the
batch's write-back must say, and a kept result checked before it is sent."""

import inspect
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from .. import db
from ..errors import DrainerError
from ..model import Job, Setback, Token
from ..storage.enqueue import encode_payload


def close_unrun(awaitable: Awaitable[Any]) -> None:
    """Close a coroutine that will never run: no "never awaited" warning."""
    if inspect.iscoroutine(awaitable):
        awaitable.close()


def unawaited(result: object) -> Setback | None:
    """A failure when a handler returned an async generator (an `async def` that
    yields): it is no work drainer can run to an end, and the job must not be marked
    done."""
    if inspect.isasyncgen(result):
        result.aclose().close()  # no "never awaited" warning: the failure says it instead
        return Setback("TypeError: the handler returned an async generator (an `async def` "
                       "with yield); make it return, or return a value")
    return None


def kept(result: object, codecs: Sequence[str] = ()) -> str | Setback:
    """The return value of a task that keeps results, as JSON text; a value that is
    not JSON, or holds a character the database cannot store (`codecs`: what the text
    must encode to, see db.codecs), fails the job for good (running it again would
    return the same), and only that job: its batch's write-back would fail whole."""
    try:
        text = encode_payload(result)
    except DrainerError as exc:
        return _unkept("TypeError", str(exc).removeprefix("the payload "))
    unfit = db.unfit(text, codecs) if codecs else None
    return text if unfit is None else _unkept("ValueError", unfit)


def _unkept(kind: str, why: str) -> Setback:
    return Setback(f"{kind}: the return value cannot be kept as the job's result "
                   f"(keep_result=True): {why}", "failed")


class Ended(NamedTuple):
    """How one handler's run ended: a setback (None: it returned), its kept result
    (JSON text, for a task that keeps results) and its traceback (`--verbose`)."""

    setback: Setback | None = None
    kept: str | None = None
    traced: str | None = None


RETURNED = Ended()  # a handler that returned, with nothing to keep


@dataclass
class Outcome:
    """What became of a batch, before it is written back."""

    succeeded: list[Job] = field(default_factory=list)
    failed: list[tuple[Job, Setback]] = field(default_factory=list)
    results: dict[Token, str] = field(default_factory=dict)  # kept return values, as JSON
    unstarted: list[Job] = field(default_factory=list)
    # Claims (Job.token) found taken over, never recorded above.
    lost: set[Token] = field(default_factory=set)
    # Those of them whose handler has ended since, or never began (see drain.ended_lost).
    ended_lost: list[Job] = field(default_factory=list)
    abandoned: list[Job] = field(default_factory=list)  # still running at the bound
    tracebacks: dict[Token, str] = field(default_factory=dict)  # failed claim -> trace()


# A batch's refill: given what finished so far (to be written back), a function that
# hands the batch the jobs claimed to go on with (called as soon as they are, before
# anything that may fail or wait) and how many handler slots are free as it is sent
# (a limited queue's claim takes no more), whether the batch may refill again (not
# when too few were ready, nor at a stop or the deadline).
Land = Callable[[list[Job]], None]
Refill = Callable[[Outcome, Land, int], bool]

