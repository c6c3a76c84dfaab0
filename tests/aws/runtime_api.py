"""A stand-in for the Lambda service around one function process: the Runtime API
that AWS's runtime interface client (awslambdaric) polls for events and posts
results to, and Lambda's Invoke (asynchronous only), where the function's own
continuations and producers' kicks land (AWS_ENDPOINT_URL_LAMBDA).

Lambda runs a Python function as `python -m awslambdaric <Handler>` in its task
root, with AWS_LAMBDA_RUNTIME_API naming the Runtime API; `FunctionProcess` does
the same against `RuntimeApi`, so the handler string, the context, the event and
the result all go through the code that runs in Lambda instead of a direct call.

Several processes may poll one `RuntimeApi`, as Lambda runs one execution
environment per invocation at once; with `deliver`, each asynchronous Invoke is
queued as an event for them (`repeat` times: a delivery more than once), as Lambda
does, and `peak` is the most invocations that ran at once.
"""

import json
import os
import queue
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote

RUNTIME = "/2018-06-01/runtime"
INVOKE = "/2015-03-31/functions/"  # Lambda's Invoke: .../functions/{name}/invocations


@dataclass
class Outcome:
    """What the runtime posted for one invocation (or for its init): "response" or
    "error", the JSON body, its Lambda-Runtime-Function-Error-Type header (which
    awslambdaric sends with an init error only), and the stdout lines the process
    wrote during the invocation."""

    kind: str
    body: object
    error_type: str | None = None
    lines: list[str] = field(default_factory=list)

    def records(self) -> list[dict]:
        """The stdout lines as JSON objects; a line that is not JSON fails the test."""
        return [json.loads(line) for line in self.lines]


@dataclass(frozen=True)
class Invoke:
    """One Lambda Invoke request the function made."""

    function: str
    invocation_type: str | None
    payload: object


@dataclass(frozen=True)
class _Event:
    request_id: str
    body: bytes
    seconds: float  # the invocation's time limit, counted from when /next serves it


class RuntimeApi:
    """The Runtime API on 127.0.0.1, served from a thread. `invoke` queues an event
    for the next `GET .../invocation/next` (which blocks, as Lambda's does, until
    there is one); results, errors, init errors and Invoke requests are recorded."""

    def __init__(self, function_arn: str, *, deliver: bool = False, repeat: int = 1,
                 seconds: float = 60):
        self.function_arn = function_arn
        self.deliver, self.repeat, self.seconds = deliver, repeat, seconds
        self.peak = 0  # the most invocations served and not answered at once
        self.served: list[str] = []  # request ids, in the order /next handed them out
        self.invokes: list[Invoke] = []
        self.init_errors: list[Outcome] = []
        self._events: queue.Queue[_Event | None] = queue.Queue()
        self._outcomes: dict[str, Outcome] = {}
        self._changed = threading.Condition()
        self._server = _Server(("127.0.0.1", 0), _handler_for(self))
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def address(self) -> str:
        """host:port, as AWS_LAMBDA_RUNTIME_API gives it."""
        host, port = self._server.server_address[:2]
        return f"{host}:{port}"

    @property
    def endpoint(self) -> str:
        """The URL of Lambda's Invoke here, for AWS_ENDPOINT_URL_LAMBDA."""
        return f"http://{self.address}"

    def invoke(self, event: object, seconds: float = 60) -> str:
        """Queue `event` for the function, with `seconds` to run; its request id."""
        request_id = str(uuid.uuid4())
        self._events.put(_Event(request_id, json.dumps(event).encode(), seconds))
        return request_id

    def outcome(self, request_id: str, timeout: float) -> Outcome | None:
        """The outcome posted for `request_id`, waiting up to `timeout` seconds."""
        with self._changed:
            self._changed.wait_for(lambda: request_id in self._outcomes, timeout)
            return self._outcomes.get(request_id)

    def wait_init_error(self, timeout: float) -> Outcome | None:
        """The first init error posted (the handler could not be loaded), waiting up
        to `timeout` seconds."""
        with self._changed:
            self._changed.wait_for(lambda: self.init_errors, timeout)
            return self.init_errors[0] if self.init_errors else None

    def running(self) -> int:
        """Invocations served and not answered yet."""
        return len(self.served) - len(self._outcomes)

    def outcomes(self) -> list[Outcome]:
        """Every outcome posted, in the order the invocations were served."""
        with self._changed:
            return [self._outcomes[r] for r in self.served if r in self._outcomes]

    def wait_idle(self, timeout: float) -> bool:
        """Whether, within `timeout` seconds, no event waits and every invocation
        served has its outcome (an invocation invokes before it answers, so nothing
        more will come)."""
        until = time.monotonic() + timeout
        with self._changed:
            while not (self._events.empty() and self.running() == 0):
                if time.monotonic() > until:
                    return False
                self._changed.wait(0.05)
            return True

    def close(self) -> None:
        self._events.put(None)  # releases a waiting /next
        self._server.shutdown()
        self._server.server_close()

    # The handler's side.

    def _next(self) -> _Event | None:
        event = self._events.get()
        if event is None:
            self._events.put(None)  # for any other waiter
            return None
        with self._changed:
            self.served.append(event.request_id)
            self.peak = max(self.peak, self.running())
        return event

    def _record(self, request_id: str | None, outcome: Outcome) -> None:
        with self._changed:
            if request_id is None:
                self.init_errors.append(outcome)
            else:
                self._outcomes[request_id] = outcome
            self._changed.notify_all()


class _Server(ThreadingHTTPServer):
    daemon_threads = True  # a /next still waiting must not hold up close()

    def handle_error(self, request: object, client_address: object) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError):  # a killed function's
            super().handle_error(request, client_address)


def _handler_for(api: RuntimeApi) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as the runtime client's libcurl expects

        def log_message(self, format: str, *args: object) -> None:
            pass  # the test's output is the function's, not an access log

        def _reply(self, status: HTTPStatus, body: bytes = b"",
                   headers: dict[str, str] | None = None) -> None:
            self.send_response(status)
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _body(self) -> bytes:
            return self.rfile.read(int(self.headers.get("Content-Length") or 0))

        def do_GET(self) -> None:
            if self.path != f"{RUNTIME}/invocation/next":
                return self._reply(HTTPStatus.NOT_FOUND)
            event = api._next()
            if event is None:
                return self._reply(HTTPStatus.GONE)
            deadline = int((time.time() + event.seconds) * 1000)
            self._reply(HTTPStatus.OK, event.body, {
                "Content-Type": "application/json",
                "Lambda-Runtime-Aws-Request-Id": event.request_id,
                "Lambda-Runtime-Deadline-Ms": str(deadline),
                "Lambda-Runtime-Invoked-Function-Arn": api.function_arn,
                "Lambda-Runtime-Trace-Id": f"Root=1-{int(time.time()):08x}-"
                                           f"{uuid.uuid4().hex[:24]};Sampled=0"})

        def do_POST(self) -> None:
            body = self._body()
            path = self.path
            if path.startswith(INVOKE) and path.endswith("/invocations"):
                invoke = Invoke(unquote(path[len(INVOKE):-len("/invocations")]),
                                self.headers.get("X-Amz-Invocation-Type"), json.loads(body))
                api.invokes.append(invoke)
                if invoke.invocation_type != "Event":  # drainer never waits for a run
                    return self._reply(HTTPStatus.BAD_REQUEST, json.dumps(
                        {"Type": "User", "message": "only Event invokes here"}).encode(),
                        {"x-amzn-ErrorType": "InvalidParameterValueException"})
                if api.deliver:
                    for _ in range(api.repeat):
                        api.invoke(invoke.payload, api.seconds)
                return self._reply(HTTPStatus.ACCEPTED)  # queued: nothing to say
            error_type = self.headers.get("Lambda-Runtime-Function-Error-Type")
            if path == f"{RUNTIME}/init/error":
                api._record(None, Outcome("error", json.loads(body), error_type))
                return self._reply(HTTPStatus.ACCEPTED, b'{"status": "OK"}')
            prefix = f"{RUNTIME}/invocation/"
            request_id, _, kind = path.removeprefix(prefix).partition("/")
            if not path.startswith(prefix) or kind not in ("response", "error"):
                return self._reply(HTTPStatus.NOT_FOUND)
            api._record(request_id, Outcome(kind, json.loads(body) if body else None,
                                            error_type))
            self._reply(HTTPStatus.ACCEPTED, b'{"status": "OK"}')

    return Handler


class FunctionProcess:
    """`python -m awslambdaric <handler>` in `task_root`, as Lambda starts a Python
    function, against `api`; stdout goes to a file read back per invocation. Each
    invocation has `limit` seconds (the function's timeout) unless it says otherwise."""

    def __init__(self, api: RuntimeApi, handler: str, task_root: Path, env: dict[str, str],
                 stdout: Path, limit: float = 60):
        self.api = api
        self.limit = limit
        self._stdout = stdout
        self._read = 0
        with stdout.open("wb") as out:
            self.proc = subprocess.Popen([sys.executable, "-m", "awslambdaric", handler],
                                         cwd=task_root, env=env, stdout=out,
                                         stderr=subprocess.STDOUT)

    def call(self, event: object, seconds: float | None = None, timeout: float = 30) -> Outcome:
        """Invoke the function with `event` and wait for what it posts; fails the
        test if the process exits or nothing comes within `timeout` seconds."""
        request_id = self.api.invoke(event, self.limit if seconds is None else seconds)
        until = time.monotonic() + timeout
        while (outcome := self.api.outcome(request_id, 0.05)) is None:
            if self.proc.poll() is not None or time.monotonic() > until:
                raise AssertionError(f"no outcome for {event!r} (exit code "
                                     f"{self.proc.poll()}):\n" + "\n".join(self.new_lines()))
        outcome.lines = self.new_lines()
        return outcome

    def new_lines(self) -> list[str]:
        """The lines of stdout written since the last call."""
        data = self._stdout.read_bytes()
        end = data.rfind(b"\n", self._read) + 1
        text, self._read = data[self._read:end], max(self._read, end)
        return text.decode().splitlines()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)


def lambda_env(*, api: RuntimeApi, function: str, handler: str, task_root: Path,
               runtime: str, memory: int, region: str, aws_endpoint: str,
               **extra: str) -> dict[str, str]:
    """The environment Lambda gives a function process (its reserved variables),
    with AWS calls sent to `aws_endpoint` and Lambda's own to `api`, and nothing
    inherited from the test run but PATH."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "LANG": "C.UTF-8",
        "TZ": ":UTC",
        "PYTHONDONTWRITEBYTECODE": "1",  # /var/task is read-only
        "_HANDLER": handler,
        "LAMBDA_TASK_ROOT": str(task_root),
        "AWS_EXECUTION_ENV": f"AWS_Lambda_{runtime}",
        "AWS_LAMBDA_RUNTIME_API": api.address,
        "AWS_LAMBDA_FUNCTION_NAME": function,
        "AWS_LAMBDA_FUNCTION_VERSION": "1",
        "AWS_LAMBDA_FUNCTION_MEMORY_SIZE": str(memory),
        "AWS_LAMBDA_LOG_GROUP_NAME": f"/aws/lambda/{function}",
        "AWS_LAMBDA_LOG_STREAM_NAME": "2026/01/01/[1]0123456789abcdef",
        "AWS_LAMBDA_INITIALIZATION_TYPE": "on-demand",
        "AWS_REGION": region,
        "AWS_DEFAULT_REGION": region,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_SESSION_TOKEN": "testing",
        "AWS_CONFIG_FILE": os.devnull,
        "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
        "AWS_ENDPOINT_URL": aws_endpoint,
        "AWS_ENDPOINT_URL_LAMBDA": api.endpoint,
    }
    env.update(extra)
    return env

