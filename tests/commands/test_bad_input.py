"""Generated bad input (hypothesis): payloads of every shape, queue names with quotes,
SQL and unicode, option values out of range, malformed URLs, bad bytes on stdin.

Each example ends in a stored job that reads back equal, or in exit code 2 with one
line on stderr and nothing stored (never a partial bulk insert), and never shows the
URL's password. Examples go through the library and the CLI's in-process
`drainer.commands.cli.main`; a handful go through real processes. The default profile runs
a few examples per test, CI's soak step 1,000 (`--hypothesis-profile=soak`).
"""

import contextlib
import io
import itertools
import json
import math
import os
import signal
import sys
import urllib.parse
from datetime import datetime, timedelta, timezone

import psycopg
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

import drainer
from drainer.commands import cli
from drainer.settings import MAX_DAYS, MAX_SECONDS, MIN_LEASE, MIN_MAX_RUNTIME, env_name
from tests.cluster import free_port
from tests.helpers import ROOT, count, run_cli

SECRET = "pw-Xk3-never-shown"
DEPTH_OK = 300  # stored for sure; past the recursion limit, refused for sure
_queues = itertools.count()

# --- strategies -----------------------------------------------------------------------

SURROGATES = st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF)
TRICKY = st.sampled_from(["\x00", "'", '"', "\\", "\\u0000", ";", "--", "\u2028", "\ufeff",
                          "\U0001f389", "é", "\r\n", "%", "$$", "\x1b[31m"])
CHARS = st.characters() | SURROGATES | st.sampled_from("\x00'\"\\;%\u2028\ufeff\U0001f389\x1b")
TEXT = st.text(CHARS, max_size=20) | st.lists(TRICKY, max_size=5).map("".join)
HUGE = st.builds(lambda c, n: c * n, st.sampled_from(["x", "é", "'", "\\", "\U0001f389"]),
                 st.integers(100_000, 1_000_000))
NUMBERS = (st.integers(-(2**70), 2**70) | st.floats()
           | st.sampled_from([10**300, -(10**4299), 1e308, 5e-324, -0.0])
           | st.builds(pow, st.just(10), st.integers(4300, 5000)))  # too long to print
LEAVES = st.none() | st.booleans() | NUMBERS | TEXT | HUGE
PAYLOADS = st.recursive(
    LEAVES, lambda kids: st.lists(kids, max_size=4) | st.dictionaries(TEXT, kids, max_size=4),
    max_leaves=12)
SQLISH = st.sampled_from(["'; DROP TABLE jobs; --", 'q"uote', "a'b", "Robert'); DELETE FROM "
                          "jobs;--", "\\", "$1", "%(queue)s", "{}", "jobs_notify", "x" * 200,
                          "x" * 201, "é" * 100, "é" * 101, " ", "default"])
QUEUES = SQLISH | st.text(CHARS, max_size=40)


def storable_text(text: str) -> bool:
    """What jsonb and a NOTIFY can carry: no NUL, valid Unicode (no lone surrogate)."""
    return "\x00" not in text and not any(0xD800 <= ord(c) <= 0xDFFF for c in text)


def storable(payload: object) -> bool:
    """Whether the payload must be stored: an oracle written apart from the code."""
    stack = [payload]
    while stack:
        value = stack.pop()
        if isinstance(value, float) and not math.isfinite(value):
            return False
        if isinstance(value, int) and abs(value) >= 10**4300:  # Python prints no longer int
            return False
        if isinstance(value, str) and not storable_text(value):
            return False
        if isinstance(value, dict):
            stack.extend(value)
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)
    return True


def good_queue(name: str) -> bool:
    return bool(name) and storable_text(name) and len(name.encode()) <= 200


def same(stored: object, given: object) -> bool:
    """Read-back equality; a float may come back as the int its decimal spells."""
    if isinstance(given, bool) or given is None:
        return stored is given
    if isinstance(given, float):
        return type(stored) in (int, float) and float(stored) == given
    if isinstance(given, int):
        return type(stored) is int and stored == given
    if isinstance(given, list):
        return (isinstance(stored, list) and len(stored) == len(given)
                and all(map(same, stored, given)))
    if isinstance(given, dict):
        return (isinstance(stored, dict) and stored.keys() == given.keys()
                and all(same(stored[k], given[k]) for k in given))
    return stored == given


def nest(depth: int, kind: str) -> tuple[object, str]:
    """A payload nested `depth` deep, and the jsonb text it must read back as."""
    value: object = 1
    for _ in range(depth):
        value = [value] if kind == "list" else {"k": value}
    if kind == "list":
        return value, "[" * depth + "1" + "]" * depth
    return value, '{"k": ' * depth + "1" + "}" * depth


# --- helpers --------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def in_process_setup(monkeypatch):
    """What a subprocess gets from clean_env(): no DRAINER_*, PG* or DATABASE_URL,
    and the test task modules importable."""
    for name in list(os.environ):
        if name.startswith(("DRAINER_", "PG")) or name == "DATABASE_URL":
            monkeypatch.delenv(name)
    monkeypatch.syspath_prepend(str(ROOT / "tests" / "tasks"))


def in_process(*argv: str, stdin: bytes = b"") -> tuple[int, str, str]:
    """`drainer ARGV` through cli.main in this process: (exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    saved_stdin, sys.stdin = sys.stdin, io.TextIOWrapper(io.BytesIO(stdin))
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = cli.main(list(argv))
    finally:
        sys.stdin = saved_stdin
        for sig, handler in handlers.items():  # a drain installs its own
            signal.signal(sig, handler)
    return code, out.getvalue(), err.getvalue()


def refused(code: int, out: str, err: str) -> str:
    """Exit 2, nothing on stdout, one `drainer: error:` line and no traceback."""
    lines = err.rstrip("\n").split("\n")  # not splitlines(): \u2028 and \x1e are no newline
    assert (code, out) == (2, ""), (code, out, err)
    assert len(lines) == 1 and lines[0].startswith("drainer: error: "), err
    assert SECRET not in err
    return lines[0]


def fresh_queue() -> str:
    return f"gen-{next(_queues)}"


def argv_safe(*texts: str) -> bool:
    return all("\x00" not in t for t in texts)  # a real argv cannot carry a NUL


# --- payloads and queue names ---------------------------------------------------------


@given(payload=PAYLOADS, queue=QUEUES)
def test_enqueue_stores_the_job_or_refuses_it(conn, payload, queue):
    before = count(conn)
    if storable(payload) and good_queue(queue):
        job = drainer.enqueue(conn, queue, payload)
        stored = conn.execute("SELECT queue, payload FROM jobs WHERE id = %s", (job,)).fetchone()
        assert stored[0] == queue and same(stored[1], payload)
    else:
        with pytest.raises(drainer.BadInput) as info:
            drainer.enqueue(conn, queue, payload)
        assert "\n" not in str(info.value)
        assert count(conn) == before


@given(payload=PAYLOADS, queue=QUEUES, ascii_only=st.booleans())
def test_cli_enqueue_stores_the_job_or_exits_2(db_url, conn, payload, queue, ascii_only):
    try:
        text = json.dumps(payload, ensure_ascii=ascii_only)  # NaN and Infinity included
    except ValueError:
        assume(False)  # an int too long for Python to print: the library test has it
    assume(argv_safe(queue, text))
    before = count(conn)
    code, out, err = in_process("enqueue", "--database-url", db_url, "--", queue, text)
    if storable(payload) and good_queue(queue):
        assert code == 0, err
        job = json.loads(out)["id"]
        stored = conn.execute("SELECT queue, payload FROM jobs WHERE id = %s", (job,)).fetchone()
        assert stored[0] == queue and same(stored[1], payload)
    else:
        refused(code, out, err)
        assert count(conn) == before


@given(text=st.text(CHARS, max_size=30))
def test_cli_enqueue_of_text_that_may_not_be_json(db_url, conn, text):
    assume(argv_safe(text) and text != "--")  # argparse drops a second "--": stdin mode
    try:
        payload, valid = json.loads(text), True
    except (ValueError, RecursionError):
        payload, valid = None, False
    valid = valid and storable(payload)
    queue = fresh_queue()
    code, out, err = in_process("enqueue", "--database-url", db_url, "--", queue, text)
    if valid:
        assert code == 0, err
        assert same(conn.execute("SELECT payload FROM jobs WHERE queue = %s", (queue,)
                                 ).fetchone()[0], payload)
    else:
        refused(code, out, err)
        assert count(conn, f"queue = '{queue}'") == 0


LINE = (PAYLOADS.map(lambda p: ("payload", p))
        | st.binary(max_size=12).map(lambda b: ("bytes", b))
        | st.sampled_from([b"", b"\xff\xfe", b"{\"a\": \"\xc3\x28\"}", b"\xed\xa0\x80",
                           b"[1,", b"{} {}", b"\x00"]).map(lambda b: ("bytes", b)))


def line_bytes(line: tuple[str, object]) -> bytes:
    kind, value = line
    if kind == "bytes":
        return value.replace(b"\n", b" ")
    return json.dumps(value, ensure_ascii=False).encode("utf-8", "surrogatepass")


def line_payload(raw: bytes) -> tuple[bool, object]:
    """(valid, payload) for one stdin line, decided apart from the code."""
    try:
        payload = json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        return False, None
    return storable(payload), payload


@given(lines=st.lists(LINE, max_size=6), trailing_newline=st.booleans())
def test_bulk_enqueue_from_stdin_is_all_or_nothing(db_url, conn, lines, trailing_newline):
    try:
        raws = [line_bytes(line) for line in lines]
    except ValueError:
        assume(False)  # an int too long to print
    data = b"\n".join(raws) + (b"\n" if trailing_newline and raws else b"")
    pieces = data.split(b"\n")
    if pieces[-1] == b"":
        pieces.pop()  # what iterating over the stream yields
    # Blank lines carry no job and are skipped; line numbers still count them.
    numbered = [(n, line_payload(raw)) for n, raw in enumerate(pieces, 1) if raw.strip()]
    verdicts = [verdict for _, verdict in numbered]
    queue = fresh_queue()

    code, out, err = in_process("enqueue", queue, "--database-url", db_url, stdin=data)

    if all(valid for valid, _ in verdicts):
        assert code == 0, err
        assert json.loads(out) == {"enqueued": len(verdicts)}
        stored = [row[0] for row in conn.execute(
            "SELECT payload FROM jobs WHERE queue = %s ORDER BY id", (queue,))]
        assert len(stored) == len(verdicts)
        assert all(same(s, p) for s, (_, p) in zip(stored, verdicts, strict=True))
    else:
        first_bad = next(n for n, (valid, _) in numbered if not valid)
        assert f"stdin line {first_bad} " in refused(code, out, err)
        assert count(conn, f"queue = '{queue}'") == 0


@given(depth=st.integers(1, 6000), kind=st.sampled_from(["list", "dict"]))
def test_deep_nesting_is_stored_exactly_or_refused(conn, depth, kind):
    payload, text = nest(depth, kind)
    try:
        job = drainer.enqueue(conn, "deep", payload)
    except drainer.BadInput:
        assert depth > DEPTH_OK
        return
    assert depth < sys.getrecursionlimit()
    # Compared in SQL: reading a payload this deep back into Python would need the
    # recursion it is testing.
    assert conn.execute("SELECT payload = %s::jsonb FROM jobs WHERE id = %s",
                        (text, job)).fetchone() == (True,)


def test_a_payload_python_cannot_load_fails_its_job_and_the_batch_goes_on(conn):
    """Another producer (psql, another language) may store what Python's json cannot
    load: nested 5,000 deep, or a 5,000-digit number. Once claimed, such a job fails
    with a clear error and every other job of its batch still runs."""
    conn.execute("INSERT INTO jobs (payload) VALUES (%s::jsonb), (%s::jsonb)",
                 ("[" * 5000 + "]" * 5000, "1" * 5000))
    drainer.enqueue_many(conn, "default", [{"fine": i} for i in range(3)])
    summary = drainer.drain(conn, {"default": lambda job: None},
                            drainer.Options(queues=["default"], batch_size=10))
    assert (summary.claimed, summary.done, summary.retried) == (5, 3, 2)
    errors = [row[0] for row in conn.execute(
        "SELECT last_error FROM jobs WHERE status = 'queued' ORDER BY id")]
    assert errors[0].startswith("the payload cannot be loaded: RecursionError")
    assert errors[1].startswith("the payload cannot be loaded: ValueError")


# --- option values --------------------------------------------------------------------

DRAIN_OPTIONS = {  # option: (parse, in range)
    "--lease": (float, lambda v: MIN_LEASE <= v <= MAX_SECONDS),
    "--max-runtime": (float, lambda v: MIN_MAX_RUNTIME <= v <= MAX_SECONDS),
    "--archive-after": (float, lambda v: 0 <= v <= MAX_DAYS),
    "--batch-size": (int, lambda v: 1 <= v < 2**63),  # PostgreSQL's bigint
    "--concurrency": (int, lambda v: 1 <= v < 2**63),
}
VALUES = (st.floats().map(repr) | st.integers(-(10**25), 10**25).map(str)
          | st.sampled_from(["0", "-0", "1e-300", "0.0001", "0.999", "1", "1e300", "nan",
                             "inf", "-1", "", " 5 ",
                             "3155760000", "3155760001", "36525", "36526", "1_000", "٣",
                             str(2**63), str(2**63 - 1)])
          | st.integers(4301, 5000).map(lambda n: "9" * n)
          | st.text(CHARS, max_size=6))


def in_range(option: str, text: str) -> bool:
    parse, ok = DRAIN_OPTIONS[option]
    try:
        return ok(parse(text))
    except ValueError:
        return False


@given(option=st.sampled_from(sorted(DRAIN_OPTIONS)), text=VALUES, via_env=st.booleans())
def test_drain_options_in_range_run_and_out_of_range_exit_2(db_url, monkeypatch, option,
                                                           text, via_env):
    assume(argv_safe(text) and not (via_env and not text.strip()))  # empty variable: unset
    args = ["drain", "--database-url", db_url, "--tasks", "behave"]
    with monkeypatch.context() as env:  # this example's variable only
        if via_env:
            assume(storable_text(text))  # the environment holds no lone surrogate
            env.setenv(env_name(option), text)
        else:
            args += [f"{option}={text}"]
        code, out, err = in_process(*args)
    if in_range(option, text):
        assert code == 0, err
        assert json.loads(out.splitlines()[-1])["stopped"] in ("empty", "deadline")
    else:
        line = refused(code, out, err)
        if via_env:
            assert env_name(option) in line


OFFSETS = st.integers(-23 * 60 - 59, 23 * 60 + 59).map(lambda m: timezone(timedelta(minutes=m)))
MOMENTS = st.datetimes(min_value=datetime(2, 1, 1), max_value=datetime(9998, 12, 31),
                       timezones=OFFSETS)


@given(moment=MOMENTS | st.datetimes().map(datetime.isoformat) | VALUES)
def test_enqueue_run_at_is_stored_or_exits_2(db_url, conn, moment):
    text = moment.isoformat() if isinstance(moment, datetime) else moment
    assume(argv_safe(text))
    queue = fresh_queue()
    code, out, err = in_process("enqueue", queue, "{}", "--run-at", text,
                                "--database-url", db_url)
    if isinstance(moment, datetime):
        assert code == 0, err
        assert conn.execute("SELECT run_at FROM jobs WHERE queue = %s", (queue,)
                            ).fetchone() == (moment,)
    else:
        try:  # other text: some of it is a valid ISO time with a zone
            valid = datetime.fromisoformat(text).tzinfo is not None
        except ValueError:
            valid = False
        assert code == (0 if valid else 2), err
        if not valid:
            refused(code, out, err)


@given(option=st.sampled_from(["--delay", "--max-attempts"]), text=VALUES)
def test_enqueue_delay_and_max_attempts_in_range_or_exit_2(db_url, conn, option, text):
    assume(argv_safe(text))
    parse, ok = ((float, lambda v: 0 <= v <= MAX_SECONDS) if option == "--delay"
                 else (int, lambda v: 1 <= v < 2**31))  # max_attempts is an int column
    try:
        valid = ok(parse(text))
    except ValueError:
        valid = False
    queue = fresh_queue()
    code, out, err = in_process("enqueue", queue, "{}", f"{option}={text}",
                                "--database-url", db_url)
    if valid:
        assert code == 0, err
        wait, attempts = conn.execute("SELECT run_at - created_at, max_attempts FROM jobs "
                                      "WHERE queue = %s", (queue,)).fetchone()
        if option == "--delay":
            assert abs(wait.total_seconds() - float(text)) < max(1, float(text) * 1e-9)
        else:
            assert attempts == int(text)
    else:
        refused(code, out, err)
        assert count(conn, f"queue = '{queue}'") == 0


# --- malformed URLs -------------------------------------------------------------------

KEYWORDS = {d.keyword.decode() for d in psycopg.pq.Conninfo.get_defaults()}
CHOICES = {"sslmode": {"disable", "allow", "prefer", "require", "verify-ca", "verify-full"},
           "target_session_attrs": {"any", "read-write", "read-only", "primary", "standby",
                                    "prefer-standby"},
           "channel_binding": {"disable", "prefer", "require"},
           "gssencmode": {"disable", "prefer", "require"}}
PORT = free_port()  # nothing listens there: anything that slips through fails, locally
BASE = f"postgresql://drainer:{SECRET}@127.0.0.1:{PORT}/db"


def url_with(damage: str, part: str) -> str:
    if damage == "port":
        return f"postgresql://drainer:{SECRET}@127.0.0.1:{part}/db"
    if damage == "query":
        return f"{BASE}?{part}"
    if damage == "percent":
        return f"postgresql://drainer:{SECRET}@127.0.0.1:{PORT}/{part}"
    return f"{part} password={SECRET}" if damage == "garbage" else f"{BASE}{part}"


def bad_port(text: str) -> bool:
    # libpq ignores spaces around a port, and reads a blank one as the default.
    text = text.strip()
    return text != "" and not (text.isascii() and text.isdigit() and 0 < int(text) < 65536)


MALFORMED = st.one_of(
    st.tuples(st.just("port"), st.text("0123456789-+x ²٣", min_size=1, max_size=7)
              .filter(bad_port) | st.integers(65536, 10**9).map(str) | st.just("0")),
    st.tuples(st.just("query"), st.from_regex(r"[a-z_]{1,15}", fullmatch=True)
              .filter(lambda k: k not in KEYWORDS).map(lambda k: f"{k}=1")),
    st.tuples(st.just("query"), st.sampled_from(sorted(CHOICES)).flatmap(
        lambda k: st.text(CHARS, min_size=1, max_size=8).filter(
            lambda v, k=k: v not in CHOICES[k] and storable_text(v))
        .map(lambda v, k=k: f"{k}={urllib.parse.quote(v)}"))),
    st.tuples(st.just("query"), st.sampled_from(["keepalives", "keepalives_idle"]).map(
        lambda k: f"{k}=not-a-number")),
    st.tuples(st.just("percent"), st.sampled_from(["%zz", "d%", "d%4", "%00", "%e9%"])),
    st.tuples(st.just("suffix"), st.sampled_from(["\x00", "\udcff", "/x\x00y"])),
    st.tuples(st.just("garbage"), st.text(CHARS, min_size=1, max_size=20).filter(
        lambda t: t.strip() and "=" not in t and "://" not in t and "\x00" not in t)),
)


@given(malformed=MALFORMED, command=st.sampled_from(["enqueue", "drain", "stats", "migrate"]))
def test_malformed_urls_exit_2_without_showing_the_password(malformed, command):
    url = url_with(*malformed)
    args = {"enqueue": ["enqueue", "q", "{}"], "drain": ["drain", "--tasks", "behave"],
            "stats": ["stats"], "migrate": ["migrate"]}[command]
    line = refused(*in_process(*args, "--database-url", url))
    assert "URL" in line


# --- a handful through real processes -------------------------------------------------


def test_real_processes_refuse_bad_input_and_store_odd_names(db_url, conn):
    bulk = run_cli("enqueue", "q", "--database-url", db_url, input=b'{"a": 1}\n\xff\n{}\n')
    assert bulk.returncode == 2 and "stdin line 2 is not UTF-8" in bulk.stderr
    # Bytes that are not UTF-8 reach argv as lone surrogates (surrogateescape).
    surrogate = run_cli("enqueue", "q", '"\udcff"', "--database-url", db_url)
    assert surrogate.returncode == 2 and "surrogate" in surrogate.stderr
    bad_url = run_cli("enqueue", "q", "{}", "--database-url",
                      f"postgresql://u:{SECRET}@127.0.0.1:99999/db")
    assert bad_url.returncode == 2 and SECRET not in bad_url.stderr + bad_url.stdout
    out_of_range = run_cli("drain", "--database-url", db_url, "--tasks", "behave",
                           "--lease", "1e300")
    assert out_of_range.returncode == 2 and "--lease" in out_of_range.stderr
    assert count(conn) == 0
    name = "'; DROP TABLE jobs; -- \"é\U0001f389"
    stored = run_cli("enqueue", name, '{"s": "\\u00e9 \'x\'"}', "--database-url", db_url)
    assert stored.returncode == 0, stored.stderr
    assert conn.execute("SELECT queue, payload FROM jobs").fetchone() == (name, {"s": "é 'x'"})
