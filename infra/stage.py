"""Stage this checkout's function code for infra/template.yaml.

`sam build` packages a function's CodeUri directory whole, less a fixed list of
caches and virtualenvs (no `.samignore`): with the repository root as CodeUri the
artifact took the embedded database under .drainer/, tests/ and whatever else lay
there. So the template's CodeUri is build/lambda, and this script fills it with
what the function runs and nothing more: drainer/, handlers/, the packages of the
task modules it is given, and requirements.txt (which `sam build` installs).

    python infra/stage.py myapp.tasks      # then: cd infra && sam build

An app of your own needs none of this: it installs drainer from PyPI and names
the packaged `drainer.aws.lambda_handler.handler` (see examples/aws-app/).
"""

import argparse
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "build" / "lambda"
ALWAYS = ("drainer", "handlers")  # the package, and the entry point the template names
MARK = Path("handlers", "aws_lambda.py")  # present in every directory this script made
_CACHES = shutil.ignore_patterns("__pycache__", "*.pyc")


class StageError(Exception):
    """A name or directory that cannot be staged; exit 2 with the message."""


def _source(root: Path, module: str) -> Path:
    """The package directory or module file at `root` that `module` lives in."""
    if not all(part.isidentifier() for part in module.split(".")):
        raise StageError(f"{module!r} is not a module name (like myapp.tasks)")
    top = module.split(".")[0]
    for path in (root / top, root / f"{top}.py"):
        if path.exists():
            return path
    raise StageError(f"{module!r}: no package {top}/ or module {top}.py at {root}")


def stage(modules: list[str], out: Path = OUT, root: Path = ROOT) -> list[str]:
    """Replace `out` with the function's code; returns its top-level names. Every
    name is checked before anything is removed, and a directory this script did
    not make is never removed."""
    sources = list(dict.fromkeys(_source(root, m) for m in [*ALWAYS, *modules]))
    if out.exists():
        if any(out.iterdir()) and not (out / MARK).is_file():
            raise StageError(f"{out} is not empty and was not made by stage.py; "
                             "not removing it (choose another --out)")
        shutil.rmtree(out)
    out.mkdir(parents=True)
    for path in sources:
        if path.is_dir():
            shutil.copytree(path, out / path.name, ignore=_CACHES)
        else:
            shutil.copy2(path, out / path.name)
    shutil.copy2(root / "requirements.txt", out / "requirements.txt")
    return sorted(p.name for p in out.iterdir())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Stage the function's code (drainer/, handlers/, your task modules' "
                    "packages, requirements.txt) into the CodeUri of infra/template.yaml.")
    parser.add_argument("modules", nargs="+", metavar="MODULE",
                        help="the task modules, as in the Tasks parameter (myapp.tasks)")
    parser.add_argument("--out", type=Path, default=OUT,
                        help=f"where to stage (default {OUT.relative_to(ROOT)}, the CodeUri)")
    args = parser.parse_args(argv)
    try:
        names = stage(args.modules, args.out.resolve())
    except StageError as exc:
        print(f"stage.py: {exc}", file=sys.stderr)
        return 2
    print(f"staged {', '.join(names)} in {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
