"""`manage.py drainer VERB [OPTIONS]`: the drainer command (`drainer --help`) on the
project's database, with its Django tasks registered: one command of Django's, so
drainer's `migrate` never shadows Django's own."""

import argparse
import os
import sys
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from drainer.commands import cli
from drainer.settings import TASKS

# The options every manage.py command takes, which manage.py itself has applied.
DJANGOS = ("--settings", "--pythonpath")


class Command(BaseCommand):  # type: ignore[misc]
    help = ("drainer's command on this project's database: `manage.py drainer drain`, "
            "`work`, `stats`, `failed`, `show`, `requeue`, `cancel`, `schedules`, "
            "`doctor`, `migrate`... (`manage.py drainer --help`)")

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("args", nargs=argparse.REMAINDER,
                            help="a drainer command and its options")

    def create_parser(self, prog_name: str, subcommand: str, **kwargs: Any) -> Any:
        """call_command's parser: drainer's options before its verb (a drain's, the
        default command) go to drainer too, as manage.py passes them."""
        parser = super().create_parser(prog_name, subcommand, **kwargs)

        def parse_args(args: Any = None, namespace: Any = None) -> Any:
            known, leading = parser.parse_known_args(args, namespace)
            known.args = [*leading, *known.args]
            return known

        parser.parse_args = parse_args
        return parser

    def print_help(self, prog_name: str, subcommand: str) -> None:
        cli.main(["--help"])

    def run_from_argv(self, argv: list[str]) -> None:
        """What manage.py runs: drainer's own options and exit code, untouched by
        Django's parsing (but for the options manage.py applied already)."""
        sys.exit(_main(_without_djangos(argv[2:])))

    def handle(self, *args: str, **options: Any) -> None:
        """call_command("drainer", VERB, ...)."""
        code = _main(list(args))
        if code:
            raise CommandError(f"drainer {' '.join(args)} exited {code}", returncode=code)


def _main(argv: list[str]) -> int:
    """The command line, with the project's Django tasks as the task module unless one
    is named: the members `--processes` starts (plain `python -m drainer` processes
    with this environment) register them too."""
    os.environ.setdefault(TASKS.env, "drainer.contrib.django")
    return cli.main(argv)


def _without_djangos(args: list[str]) -> list[str]:
    """`args` less Django's own options (`--settings X`, `--pythonpath=X`)."""
    kept: list[str] = []
    rest = iter(args)
    for arg in rest:
        if arg in DJANGOS:
            next(rest, None)  # its value
        elif not arg.startswith(tuple(f"{name}=" for name in DJANGOS)):
            kept.append(arg)
    return kept
