"""What became of a handler's run and of a batch, and how a failure is told:
`describe` (the one bounded line kept as last_error) and `trace` (--verbose).

Low in the stack on purpose: hooks and tracing import it without the batch.
"""

import inspect
import traceback
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from .. import db
from ..errors import DrainerError, redact
from ..model import Job, Setback, Token
from ..storage.enqueue import encode_payload

MAX_ERROR = 2000  # characters of last_error kept per failure
MAX_TRACEBACK = 20_000  # characters of a traceback shown by --verbose


def _bounded(text: str) -> str:
    return text if len(text) <= MAX_ERROR else text[: MAX_ERROR - 1] + "…"


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


def describe(exc: BaseException) -> str:
    """`Type: message`, bounded, storable in a text column (no NUL, valid UTF-8) and
    with URL passwords masked.

    It never raises: a handler's exception may have a `__str__` that fails, or a
    message with lone surrogates, and either would otherwise kill the handler thread
    or the statement that records the failure.
    """
    try:
        message = str(exc)
    except BaseException:  # noqa: BLE001 - whatever a broken __str__ raises
        message = "<the exception's message could not be read>"
    # Cut first (messages may be huge), with room left so a URL at the cut is still
    # seen whole by redact (a connection string in a handler's error, say).
    text = f"{type(exc).__name__}: {message}"[: 2 * MAX_ERROR]
    text = text.replace("\x00", "\\0").encode("utf-8", "backslashreplace").decode()
    return _bounded(redact(text))


def trace(exc: BaseException) -> str:
    """The exception's traceback, for `--verbose` logs only: last_error keeps to
    `describe`'s one bounded line, so the table never holds frames or source lines.
    Printable, URL passwords masked and bounded as `describe` does; cut at its end,
    where a huge message would be, so the frames survive. The first frame, the one
    that caught it (drainer's own), is left out when the handler's frames follow."""
    frames = exc.__traceback__
    if frames is not None and frames.tb_next is not None:
        frames = frames.tb_next
    try:
        text = "".join(traceback.format_exception(type(exc), exc, frames)).rstrip()
    except BaseException:  # noqa: BLE001 - never lose the failure for its traceback
        return describe(exc)
    text = text[: MAX_TRACEBACK + MAX_ERROR].replace("\x00", "\\0")
    text = redact(text.encode("utf-8", "backslashreplace").decode())
    return text if len(text) <= MAX_TRACEBACK else text[: MAX_TRACEBACK - 1] + "…"


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

