"""The command trace: one benchmarking command per JSONL line.

A trace is the command stream a replay feeds to every mode (paper §6.1);
each line's fields: docs/design/replay.md "Trace (JSONL, input)".  Bad
input raises ``TraceError`` naming the file and line.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Kernel-duration bands by native time in ms, [lo, hi) (paper §6.4, Figure 9).
BANDS: tuple[tuple[str, float, float], ...] = (
    ("<0.1ms", 0.0, 0.1),
    ("0.1-1ms", 0.1, 1.0),
    ("1-10ms", 1.0, 10.0),
    (">=10ms", 10.0, math.inf),
)
BAND_NAMES: tuple[str, ...] = tuple(name for name, _, _ in BANDS)


class TraceError(ValueError):
    """A trace file or entry is malformed (the message names file and line)."""


def band_of(ms: float) -> str:
    """Name of the duration band holding a kernel time ``ms`` (milliseconds)."""
    for name, lo, hi in BANDS:
        if lo <= ms < hi:
            return name
    raise ValueError(f"kernel time {ms!r} ms is in no band (negative or NaN)")


@dataclass(frozen=True)
class TraceEntry:
    """One command of a trace.

    argv: the command line; task, candidate: what it measures; band: the
    expected kernel-duration band (``BAND_NAMES``), None when the trace does
    not say; extra: other keys.
    """

    argv: tuple[str, ...]
    task: str
    candidate: str
    band: str | None
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def key(self) -> tuple[str, str]:
        """(task, candidate): what makes two commands the same measurement."""
        return (self.task, self.candidate)

    def to_json(self) -> dict[str, Any]:
        """The entry as its JSONL object (``extra`` keys included)."""
        obj: dict[str, Any] = dict(self.extra)
        obj.update(argv=list(self.argv), task=self.task, candidate=self.candidate)
        if self.band is not None:
            obj["band"] = self.band
        return obj


def parse_entry(obj: Any, where: str = "entry") -> TraceEntry:
    """Validate one decoded JSON value as a trace entry.

    Args:
        obj: the decoded JSON value (must be an object).
        where: location used in error messages ("trace.jsonl:12").
    Raises:
        TraceError: a key is missing or has the wrong type or value.
    """
    if not isinstance(obj, dict):
        raise TraceError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    argv = obj.get("argv")
    if not isinstance(argv, list) or not argv or not all(isinstance(a, str) and a for a in argv):
        raise TraceError(f"{where}: 'argv' must be a non-empty list of non-empty strings")
    for key in ("task", "candidate"):
        value = obj.get(key)
        if not isinstance(value, str) or not value:
            raise TraceError(f"{where}: '{key}' must be a non-empty string")
    band = obj.get("band")
    if band is not None and band not in BAND_NAMES:
        raise TraceError(f"{where}: 'band' is {band!r}, expected one of {', '.join(BAND_NAMES)}")
    extra = {k: v for k, v in obj.items() if k not in ("argv", "task", "candidate", "band")}
    return TraceEntry(tuple(argv), obj["task"], obj["candidate"], band, extra)


def parse_lines(lines: Iterable[str], name: str = "<trace>") -> list[TraceEntry]:
    """Parse JSONL text lines into entries (blank lines skipped).

    Raises:
        TraceError: a line is not JSON or not a valid entry, or no entry at all.
    """
    entries: list[TraceEntry] = []
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{name}:{lineno}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise TraceError(f"{where}: not valid JSON ({exc.msg})") from None
        entries.append(parse_entry(obj, where))
    if not entries:
        raise TraceError(f"{name}: the trace holds no command")
    return entries


def load(path: str | Path) -> list[TraceEntry]:
    """Read a trace file (JSONL, UTF-8).

    Raises:
        TraceError: unreadable file or malformed content.
    """
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise TraceError(f"{p}: cannot read trace ({exc.strerror})") from None
    except UnicodeDecodeError:
        raise TraceError(f"{p}: trace is not UTF-8 text") from None
    return parse_lines(text.splitlines(), str(p))


def dump(entries: Sequence[TraceEntry], path: str | Path) -> None:
    """Write entries as JSONL (one compact object per line)."""
    with open(path, "w", encoding="utf-8") as f:
        for e in entries:
            f.write(json.dumps(e.to_json(), separators=(",", ":")) + "\n")
