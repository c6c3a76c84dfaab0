"""One settings model: the command line and the cloud function read the same
variables into the same drain options; the command line wins over a variable."""

from datetime import timedelta

import pytest

from drainer.aws.settings import Settings
from drainer.commands import cli, common
from drainer.errors import ConfigError
from drainer.settings import LEASE, Drain

ENV = {"DRAINER_BATCH_SIZE": "7", "DRAINER_LEASE": "42", "DRAINER_CONCURRENCY": "3",
       "DRAINER_ARCHIVE_AFTER": "2.5", "DRAINER_ARCHIVE_FAILED_AFTER": "12",
       "DRAINER_VERBOSE": "yes", "DRAINER_TASKS": "a,b", "DRAINER_EVENT_LOOP": "asyncio",
       "DRAINER_QUEUES": "q1, q2", "DRAINER_CONNECT_TIMEOUT": "25", "DATABASE_URL": "postgresql://app@db.example/app"}


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in ENV.items():
        monkeypatch.setenv(name, value)


def cli_options(*argv: str):
    args = cli.build_parser().parse_args(["drain", *argv])
    cli.resolve(args)
    return args, common.options_of(args, args.queue)


def test_the_command_line_and_the_function_read_the_same_drain_options(env):
    args, from_cli = cli_options()
    function = Settings.from_env()
    assert function.options(function.queues, None) == from_cli
    assert (args.tasks, args.queue) == (function.tasks, function.queues) == (["a", "b"],
                                                                             ["q1", "q2"])
    assert from_cli.batch_size == 7 and from_cli.concurrency == 3 and from_cli.verbose
    assert from_cli.lease == timedelta(seconds=42) and from_cli.archive_after == timedelta(days=2.5)
    assert from_cli.archive_failed_after == timedelta(days=12)
    assert from_cli.event_loop == "asyncio"
    assert args.connect_timeout == function.connect_timeout == 25


def test_the_command_line_wins_over_the_variable(env):
    args, options = cli_options("--lease", "9", "--queue", "only")
    assert options.lease.total_seconds() == 9 and args.queue == ["only"]


def test_a_bad_variable_is_named_alike_from_both(env, monkeypatch):
    monkeypatch.setenv("DRAINER_LEASE", "0.5")
    with pytest.raises(ConfigError) as from_cli:
        cli_options()
    with pytest.raises(ConfigError) as from_function:
        Settings.from_env()
    assert str(from_cli.value) == str(from_function.value)
    assert str(from_cli.value).startswith("DRAINER_LEASE='0.5': ")


def test_unset_settings_take_their_defaults(monkeypatch):
    for name in ENV:
        monkeypatch.delenv(name, raising=False)
    assert Drain.resolve() == Drain() and Drain().lease == LEASE.default == 300


def test_statement_timeout_message_is_unchanged(monkeypatch):
    """The function's settings say what they refuse in the words they always used."""
    monkeypatch.setenv("DATABASE_URL", "postgresql://u@h/d")
    monkeypatch.setenv("DRAINER_STATEMENT_TIMEOUT", "0")
    with pytest.raises(ConfigError) as raised:
        Settings.from_env()
    assert str(raised.value) == ("DRAINER_STATEMENT_TIMEOUT='0': '0' must be a number of "
                                 "seconds above 0 (at most a century)")
