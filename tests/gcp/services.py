"""Cloud Tasks and Secret Manager as fake gRPC services on the loopback, answered by
the official client libraries through their own gRPC transport: the requests are
the libraries' messages, serialized as on the wire, and a refusal is a gRPC status
the libraries turn into their exceptions (AlreadyExists, NotFound, ...), as with
Google's. Nothing here reaches the network beyond 127.0.0.1."""

from collections.abc import Callable, Iterator
from concurrent import futures
from contextlib import contextmanager
from dataclasses import dataclass, field

import grpc
from google.cloud import secretmanager, tasks_v2
from google.cloud.secretmanager_v1.services.secret_manager_service.transports import (
    SecretManagerServiceGrpcTransport,
)
from google.cloud.tasks_v2.services.cloud_tasks.transports import CloudTasksGrpcTransport
from google.protobuf import empty_pb2

TASKS = "google.cloud.tasks.v2.CloudTasks"
SECRETS = "google.cloud.secretmanager.v1.SecretManagerService"


@dataclass
class Service:
    """Calls seen, and refusals to make: `refuse[method]` is a gRPC status code the
    next call of `method` gets instead of its answer."""

    calls: list[tuple[str, object]] = field(default_factory=list)
    refuse: dict[str, grpc.StatusCode] = field(default_factory=dict)

    def _check(self, method: str, request: object, context: grpc.ServicerContext) -> None:
        self.calls.append((method, request))
        code = self.refuse.pop(method, None)
        if code is not None:
            context.abort(code, f"{method} refused by the test")


@dataclass
class Tasks(Service):
    """One project's queues: task name -> task."""

    tasks: dict[str, tasks_v2.Task] = field(default_factory=dict)

    def create_task(self, request: tasks_v2.CreateTaskRequest, context) -> tasks_v2.Task:
        self._check("CreateTask", request, context)
        task = tasks_v2.Task(request.task)
        if task.name in self.tasks:
            context.abort(grpc.StatusCode.ALREADY_EXISTS, f"{task.name} exists")
        if not task.name:
            task.name = f"{request.parent}/tasks/{len(self.calls)}"
        self.tasks[task.name] = task
        return task

    def list_tasks(self, request: tasks_v2.ListTasksRequest, context) -> tasks_v2.ListTasksResponse:
        self._check("ListTasks", request, context)
        mine = [t for n, t in self.tasks.items() if n.startswith(request.parent + "/")]
        return tasks_v2.ListTasksResponse(tasks=mine)

    def delete_task(self, request: tasks_v2.DeleteTaskRequest, context) -> empty_pb2.Empty:
        self._check("DeleteTask", request, context)
        if self.tasks.pop(request.name, None) is None:
            context.abort(grpc.StatusCode.NOT_FOUND, f"{request.name} not found")
        return empty_pb2.Empty()

    def named(self, prefix: str) -> list[tasks_v2.Task]:
        return [t for n, t in sorted(self.tasks.items()) if n.rpartition("/")[2].startswith(
            prefix)]

    def handlers(self) -> grpc.GenericRpcHandler:
        return grpc.method_handlers_generic_handler(TASKS, {
            "CreateTask": _unary(self.create_task, tasks_v2.CreateTaskRequest, tasks_v2.Task),
            "ListTasks": _unary(self.list_tasks, tasks_v2.ListTasksRequest,
                                tasks_v2.ListTasksResponse),
            "DeleteTask": grpc.unary_unary_rpc_method_handler(
                self.delete_task, request_deserializer=tasks_v2.DeleteTaskRequest.deserialize,
                response_serializer=empty_pb2.Empty.SerializeToString)})


@dataclass
class Secrets(Service):
    """Secret versions by name (".../versions/latest" is one name like any other)."""

    versions: dict[str, bytes] = field(default_factory=dict)

    def access(self, request: secretmanager.AccessSecretVersionRequest, context
               ) -> secretmanager.AccessSecretVersionResponse:
        self._check("AccessSecretVersion", request, context)
        if request.name not in self.versions:
            context.abort(grpc.StatusCode.NOT_FOUND, f"{request.name} not found")
        return secretmanager.AccessSecretVersionResponse(
            name=request.name, payload={"data": self.versions[request.name]})

    def handlers(self) -> grpc.GenericRpcHandler:
        return grpc.method_handlers_generic_handler(SECRETS, {
            "AccessSecretVersion": _unary(self.access, secretmanager.AccessSecretVersionRequest,
                                          secretmanager.AccessSecretVersionResponse)})


def _unary(method: Callable, request: type, response: type) -> grpc.RpcMethodHandler:
    return grpc.unary_unary_rpc_method_handler(
        method, request_deserializer=request.deserialize, response_serializer=response.serialize)


@contextmanager
def serving(*services: Service) -> Iterator[str]:
    """The services on a loopback port, for as long as inside; the address."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    for service in services:
        server.add_generic_rpc_handlers((service.handlers(),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.stop(grace=None)


def tasks_client(address: str) -> tasks_v2.CloudTasksClient:
    """The official client, through its gRPC transport on a channel to `address`."""
    channel = grpc.insecure_channel(address)
    return tasks_v2.CloudTasksClient(transport=CloudTasksGrpcTransport(channel=channel))


def secrets_client(address: str) -> secretmanager.SecretManagerServiceClient:
    channel = grpc.insecure_channel(address)
    return secretmanager.SecretManagerServiceClient(
        transport=SecretManagerServiceGrpcTransport(channel=channel))
