"""The function as Lambda runs it: `python -m awslambdaric <Handler>` in its task
root, with the handler string and environment its template deploys, polling a
stand-in of the Lambda Runtime API (tests/aws/runtime_api.py) for its events and
posting its results there. Scheduler and Secrets Manager are a moto server the
process reaches over HTTP (AWS_ENDPOINT_URL); Lambda's Invoke, where continuations
and kicks go, is the stand-in (AWS_ENDPOINT_URL_LAMBDA), which records each one so
that its payload can be fed back as the next event. The database is the real
PostgreSQL, and every effect is read back from it.

The other tests call the handler with a fake context; these catch what only the
runtime shows: a handler string that does not resolve in the task root, an event or
result that does not go through JSON, a context without what the run reads, an
error that does not reach Lambda, state that breaks a warm process's next run."""

import importlib.util
import json
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import boto3
import pytest
from psycopg.conninfo import conninfo_to_dict
from samtranslator.yaml_helper import yaml_parse

from drainer import enqueue, enqueue_many
from drainer.aws import events, schedule
from drainer.aws.kick import Kicker
from drainer.wake import ceil_minute
from tests.aws.helpers import FUNCTION, FUNCTION_ARN, GROUP, REGION, ROLE_ARN, settled_sessions
from tests.aws.runtime_api import FunctionProcess, Outcome, RuntimeApi, lambda_env
from tests.helpers import ROOT, count, unavailable
from tests.templates import EXAMPLE_TEMPLATE, TEMPLATE, artifact_input, code_dir, the_function

TASKS = "tests.aws.tasks"  # infra's Tasks parameter here: queue "aws"

# What a classic EventBridge rule sends on its schedule.
SCHEDULED_EVENT = {"version": "0", "id": "53dc4d37-cffa-4f76-80c9-8b7d4a4d2eaa",
                   "detail-type": "Scheduled Event", "source": "aws.events",
                   "account": "123456789012", "time": "2026-12-02T12:00:00Z",
                   "region": REGION, "resources": ["arn:aws:events:::rule/backstop"],
                   "detail": {}}


@pytest.fixture(scope="module", autouse=True)
def runtime_client() -> None:
    """awslambdaric installed, or every test here skips (fails, when
    DRAINER_TEST_REQUIRE names awslambdaric)."""
    if importlib.util.find_spec("awslambdaric") is None:
        unavailable("awslambdaric", "awslambdaric (the dev extra) is not installed; the "
                                    "function did not run under AWS's runtime client")


@pytest.fixture(scope="module")
def moto_endpoint() -> Iterator[str]:
    """One moto server for the module, on a free port of 127.0.0.1; its state is
    moto's, which each test's mock_aws (tests/aws/conftest.py) starts afresh."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def aws_client(moto_endpoint: str) -> Callable[[str], object]:
    """boto3 clients of the moto server the function uses."""
    return lambda service: boto3.client(service, region_name=REGION, endpoint_url=moto_endpoint,
                                        aws_access_key_id="testing",
                                        aws_secret_access_key="testing")


@pytest.fixture(scope="module")
def infra_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """infra/template.yaml's CodeUri as infra/stage.py fills it: drainer/, handlers/,
    the task package and requirements.txt, copied out of this checkout."""
    out = tmp_path_factory.mktemp("infra") / "lambda"
    proc = subprocess.run([sys.executable, str(ROOT / "infra" / "stage.py"), TASKS, "--out",
                           str(out)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return out


@pytest.fixture(scope="module")
def example_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The example's artifact without its dependencies: what `sam build` copies from
    its CodeUri. drainer comes from the installed package, after the task root."""
    code = code_dir(EXAMPLE_TEMPLATE, the_function(yaml_parse(EXAMPLE_TEMPLATE.read_text())))
    root = tmp_path_factory.mktemp("example") / "task"
    for name in artifact_input(code):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(code / name, root / name)
    return root


def deployed(template: Path, **parameters: str) -> tuple[dict, Callable[[object], str]]:
    """The function's properties in `template`, and how a value of them resolves in
    a stack deployed with `parameters` (the others at their defaults), its wake-up
    group and Scheduler role as the tests name them."""
    doc = yaml_parse(template.read_text())
    values = {name: str(p.get("Default", "")) for name, p in doc["Parameters"].items()}
    values.update(parameters)
    made = {"WakeGroup": GROUP, "SchedulerRole.Arn": ROLE_ARN}

    def resolve(value: object) -> str:
        if not isinstance(value, dict):
            return str(value)
        [(function, arg)] = value.items()
        if function == "Ref":
            return values[arg] if arg in values else made[arg]
        if function == "Fn::GetAtt":
            return made[arg if isinstance(arg, str) else ".".join(arg)]
        raise AssertionError(f"{function} in the function's settings")

    return the_function(doc), resolve


@pytest.fixture
def start(tmp_path: Path, moto_endpoint: str,
          aws_client: Callable[[str], object]) -> Iterator[Callable[..., FunctionProcess]]:
    """Start a function of `template` in `task_root` under awslambdaric, with the
    environment a stack deployed with `parameters` gives it (plus `env`), in a
    wake-up group made for it; stopped, with its Runtime API, after the test."""
    started: list[FunctionProcess] = []

    def start_(template: Path, task_root: Path, *, handler: str | None = None,
               env: dict[str, str] | None = None, **parameters: str) -> FunctionProcess:
        props, resolve = deployed(template, **parameters)
        aws_client("scheduler").create_schedule_group(Name=GROUP)
        api = RuntimeApi(FUNCTION_ARN)
        handler = handler or props["Handler"]
        variables = {name: resolve(v) for name, v in props["Environment"]["Variables"].items()}
        process_env = lambda_env(api=api, function=FUNCTION, handler=handler,
                                 task_root=task_root, runtime=props["Runtime"],
                                 memory=int(resolve(props["MemorySize"])), region=REGION,
                                 aws_endpoint=moto_endpoint, **{**variables, **(env or {})})
        function = FunctionProcess(api, handler, task_root, process_env,
                                   tmp_path / f"stdout-{len(started)}.log",
                                   limit=float(resolve(props["Timeout"])))
        started.append(function)
        return function

    yield start_
    for function in started:
        function.stop()
        function.api.close()


def metric(outcome: Outcome) -> dict:
    """The run's one EMF line."""
    [line] = [r for r in outcome.records() if "_aws" in r]
    return line


def test_a_scheduled_run_then_a_producers_kick_in_the_same_warm_process(
        start, infra_root, db_url, conn, monkeypatch):
    function = start(TEMPLATE, infra_root, Tasks=TASKS, DatabaseUrl=db_url)
    for n in range(3):
        enqueue(conn, "aws", {"n": n})
    enqueue(conn, "aws", {"fail": "boom"}, max_attempts=1)
    first = function.call(SCHEDULED_EVENT)
    assert first.kind == "response", first.body
    assert (first.body["trigger"], first.body["claimed"], first.body["done"],
            first.body["failed"], first.body["next"]) == ("cron", 4, 3, 1, "none")
    assert (count(conn, "status = 'done'"), count(conn, "status = 'failed'")) == (3, 1)
    assert settled_sessions(conn) == 0
    records = first.records()  # every line of stdout is JSON
    assert {r["request_id"] for r in records if "_aws" not in r} == {function.api.served[0]}
    line = metric(first)
    assert (line["level"], line["FunctionName"], line["trigger"], line["done"],
            line["failed"]) == ("INFO", FUNCTION, "cron", 3, 1)

    # A producer enqueues and kicks; Lambda hands the kick to the warm process.
    monkeypatch.setenv("AWS_ENDPOINT_URL_LAMBDA", function.api.endpoint)
    with Kicker(FUNCTION_ARN).transaction(conn, "aws"):
        enqueue_many(conn, "aws", [{"n": 3}, {"n": 4}])
    [kick] = function.api.invokes
    assert (kick.function, kick.invocation_type, kick.payload) == (
        FUNCTION_ARN, "Event", events.kick("aws"))
    second = function.call(kick.payload)
    assert second.kind == "response", second.body
    assert (second.body["trigger"], second.body["done"], second.body["next"]) == (
        "enqueue", 2, "none")
    assert count(conn, "status = 'done'") == 5
    assert settled_sessions(conn) == 0
    assert function.proc.poll() is None and len(function.api.served) == 2  # one process
    records = second.records()
    assert {r["request_id"] for r in records if "_aws" not in r} == {function.api.served[1]}
    assert [r.get("event") for r in records].count("start") == 1  # one handler, not two
    assert metric(second)["done"] == 2


def test_a_run_cut_by_its_deadline_continues_through_lambda_invoke(start, infra_root, db_url,
                                                                   conn):
    function = start(TEMPLATE, infra_root, Tasks=TASKS, DatabaseUrl=db_url,
                     env={"DRAINER_SAFETY_MARGIN": "0.5"})
    # Warm: the cut run's 1.5 s then go to its jobs, not to the process's first imports.
    assert function.call({"source": "drainer.cron"}).body["next"] == "none"
    enqueue_many(conn, "aws", [{"sleep": 0.1}] * 20)
    cut = function.call({"source": "drainer.cron"}, seconds=1.5)
    assert cut.kind == "response", cut.body
    assert (cut.body["stopped"], cut.body["next"], cut.body["outcome"]) == (
        "deadline", "continue", "continued")
    [invoke] = function.api.invokes
    assert (invoke.function, invoke.invocation_type, invoke.payload) == (
        FUNCTION_ARN, "Event", events.continuation(1))  # the alias it was invoked by
    done = cut.body["done"]
    assert 0 < done < 20 and count(conn, "status = 'done'") == done
    assert count(conn, "status = 'running'") == 0  # nothing claimed that could not finish
    assert settled_sessions(conn) == 0

    rest = function.call(invoke.payload)  # Lambda runs the continuation
    assert rest.kind == "response", rest.body
    assert (rest.body["trigger"], rest.body["depth"], rest.body["done"], rest.body["next"]) == (
        "continue", 1, 20 - done, "none")
    assert count(conn, "status = 'done'") == 20
    assert len(function.api.invokes) == 1
    assert settled_sessions(conn) == 0


def test_a_job_due_later_arms_a_wake_up_whose_event_runs_it(start, infra_root, db_url, conn,
                                                            aws_client):
    function = start(TEMPLATE, infra_root, Tasks=TASKS, DatabaseUrl=db_url)
    job = enqueue(conn, "aws", {}, delay=300)
    run_at = conn.execute("SELECT run_at FROM jobs WHERE id = %s", [job]).fetchone()[0]
    at = ceil_minute(run_at)
    armed = function.call(SCHEDULED_EVENT)
    assert armed.kind == "response", armed.body
    assert (armed.body["claimed"], armed.body["next"], armed.body["outcome"],
            armed.body["at"]) == (0, "wake", "armed", at.isoformat())
    assert settled_sessions(conn) == 0
    scheduler = aws_client("scheduler")
    got = scheduler.get_schedule(GroupName=GROUP, Name=schedule.name_for(at))
    assert got["ScheduleExpression"] == f"at({at:%Y-%m-%dT%H:%M:00})"
    assert (got["Target"]["Arn"], got["Target"]["RoleArn"]) == (FUNCTION_ARN, ROLE_ARN)

    conn.execute("UPDATE jobs SET run_at = now() WHERE id = %s", [job])  # its minute came
    woken = function.call(json.loads(got["Target"]["Input"]))  # what Scheduler sends
    assert woken.kind == "response", woken.body
    assert (woken.body["trigger"], woken.body["done"], woken.body["next"]) == ("wake", 1, "none")
    assert count(conn, "status = 'done'") == 1
    assert settled_sessions(conn) == 0
    # The woken run armed its own lease wake-up and deleted it at its clean end; the
    # fired one-time schedule deletes itself in AWS, not in moto.
    names = {s["Name"] for s in scheduler.list_schedules(GroupName=GROUP)["Schedules"]}
    assert names == {schedule.name_for(at)}


def test_a_malformed_event_is_an_error_posted_to_lambda_and_the_process_serves_on(
        start, infra_root, db_url, conn):
    function = start(TEMPLATE, infra_root, Tasks=TASKS, DatabaseUrl=db_url)
    bad = function.call({"key1": "value1"})  # the console's test event
    assert bad.kind == "error"
    assert bad.body["errorType"] == "BadInput"
    assert bad.body["errorMessage"].startswith("unrecognised event (source None)")
    assert bad.body["requestId"] == function.api.served[0]
    # Raised by the staged code, which the task root put before the installed package.
    raised_in = str(infra_root / "drainer" / "aws" / "function.py")
    assert any(raised_in in frame for frame in bad.body["stackTrace"])
    logged = [json.loads(line) for line in bad.lines if line.startswith("{")]
    assert [(r["level"], r["event"], r["exit_code"]) for r in logged] == [("ERROR", "error", 2)]

    enqueue(conn, "aws", {})
    good = function.call({"source": "drainer.cron"})
    assert good.kind == "response", good.body
    assert good.body["done"] == 1 and count(conn, "status = 'done'") == 1
    assert settled_sessions(conn) == 0


def test_a_handler_string_that_does_not_resolve_is_an_init_error(start, infra_root):
    """The contrast that makes the template's handler string resolving mean something."""
    function = start(TEMPLATE, infra_root, handler="handlers/nope.handler", Tasks=TASKS)
    error = function.api.wait_init_error(30)
    assert error is not None
    assert error.body["errorType"] == error.error_type == "Runtime.ImportModuleError"
    assert "handlers/nope" in error.body["errorMessage"]
    assert function.proc.wait(30) == 1
    assert function.api.served == []


def test_the_application_log_level_lambda_sets_keeps_the_runs_info_lines_out(
        start, infra_root, db_url, conn):
    function = start(TEMPLATE, infra_root, Tasks=TASKS, DatabaseUrl=db_url,
                     env={"AWS_LAMBDA_LOG_FORMAT": "JSON", "AWS_LAMBDA_LOG_LEVEL": "WARN",
                          "DRAINER_SCHEDULER_ROLE_ARN": ""})  # a due job warns instead
    enqueue(conn, "aws", {})
    enqueue(conn, "aws", {}, delay=300)
    run = function.call({"source": "drainer.cron"})
    assert run.kind == "response", run.body
    assert (run.body["done"], run.body["next"], run.body["outcome"]) == (1, "wake", "not armed")
    assert count(conn, "status = 'done'") == 1
    assert [(r["level"], r["event"]) for r in run.records()] == [
        ("WARNING", "wake_unconfigured")]  # no INFO line, no metric line
    assert settled_sessions(conn) == 0


def test_the_example_app_runs_under_the_runtime_client_with_its_secret(
        start, example_root, db_url, conn, aws_client):
    info = conninfo_to_dict(db_url)
    arn = aws_client("secretsmanager").create_secret(Name="example-db", SecretString=json.dumps(
        {"username": info["user"], "password": info.get("password", ""), "host": info["host"],
         "port": int(info["port"]), "dbname": info["dbname"]}))["ARN"]
    function = start(EXAMPLE_TEMPLATE, example_root, DatabaseSecretArn=arn)
    props, _ = deployed(EXAMPLE_TEMPLATE)
    [backstop] = props["Events"].values()
    for n in range(3):
        enqueue(conn, "email", {"to": f"user{n}@example.com"})
    enqueue(conn, "email", {}, max_attempts=1)  # no address: the task raises
    first = function.call(json.loads(backstop["Properties"]["Input"]))
    assert first.kind == "response", first.body
    assert (first.body["trigger"], first.body["claimed"], first.body["done"],
            first.body["failed"], first.body["next"]) == ("cron", 4, 3, 1, "none")
    assert count(conn, "status = 'done'") == 3
    [error] = conn.execute("SELECT last_error FROM jobs WHERE status = 'failed'").fetchone()
    assert error.startswith("KeyError")
    assert settled_sessions(conn) == 0
    assert (metric(first)["level"], metric(first)["done"]) == ("INFO", 3)

    enqueue(conn, "email", {"to": "late@example.com"})
    second = function.call(events.kick("email"))  # warm, the secret cached
    assert second.kind == "response", second.body
    assert (second.body["trigger"], second.body["done"]) == ("enqueue", 1)
    assert count(conn, "status = 'done'") == 4
    assert settled_sessions(conn) == 0
    assert len(function.api.served) == 2 and function.proc.poll() is None
