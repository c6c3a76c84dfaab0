"""A virtualenv per competitor, installed from PyPI on first use and kept in a
git-ignored cache, so each runs with its own dependencies and none of ours."""

import subprocess
import venv
from pathlib import Path

CACHE = Path(__file__).resolve().parent.parent / ".cache"


class Unavailable(Exception):
    """The competitor cannot be installed or run here; the message says why."""


def ensure(name: str, requirements: list[str]) -> Path:
    """The virtualenv's bin directory, with `requirements` installed."""
    root = CACHE / name
    marker = root / "installed.txt"
    wanted = "\n".join(requirements)
    if marker.exists() and marker.read_text() == wanted:
        return root / "bin"
    try:
        venv.create(root, clear=True, with_pip=True)
        subprocess.run([str(root / "bin" / "python"), "-m", "pip", "install", "-q",
                        "--disable-pip-version-check", *requirements],
                       check=True, capture_output=True, text=True, timeout=600)
    except subprocess.CalledProcessError as exc:
        lines = [line for line in exc.stderr.splitlines() if "ERROR" in line] or ["pip failed"]
        raise Unavailable(f"pip install {' '.join(requirements)}: {lines[-1].strip()}") from None
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise Unavailable(f"could not create its virtualenv: {exc}") from None
    marker.write_text(wanted)
    return root / "bin"

