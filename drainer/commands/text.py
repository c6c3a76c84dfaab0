"""Text helpers the inspection commands share (`failed`, `show`, `stats`)."""


def one_line(error: str | None) -> str:
    """An error's text on one line (whitespace runs, newlines included, as one space)."""
    return "-" if error is None else " ".join(error.split())


def age(seconds: float | None) -> str:
    """A duration for a person: 42.0s, 3.5m, 2.0h, 1.2d."""
    if seconds is None:
        return "-"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f}{unit}"
    return f"{seconds:.1f}s"
