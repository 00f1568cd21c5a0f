"""Checkers of configuration values, and the core-list syntax of ``[cpu]``.

Each checker takes a value as ``tomllib`` parsed it and returns it converted,
or raises ``ValueError`` with the reason; ``krexd.config.config`` names the table and
key around it (``[cgroup] name: must match ...``).  Kept apart from the
tables and the loader so that ``krexd.config.config`` stays one page: the tables,
the schema mapping each key to its checker, and ``load``.
"""

from __future__ import annotations

import ipaddress
import os
import re
from collections.abc import Callable
from typing import Any

from krex_client.sizes import parse_size


def integer(lo: int, hi: int | None = None) -> Callable[[Any], int]:
    """Checker of an integer in [lo, hi] (no upper bound when ``hi`` is None); not a bool."""

    def check(v: Any) -> int:
        if not isinstance(v, int) or isinstance(v, bool):
            raise ValueError(f"must be an integer, got {type(v).__name__}")
        if v < lo or (hi is not None and v > hi):
            raise ValueError(f"must be in [{lo}, {hi if hi is not None else 'inf'}], got {v}")
        return v

    return check


def integer_or_auto(lo: int, hi: int) -> Callable[[Any], int | str]:
    """A checker for ``"auto"`` or an integer in [lo, hi] (raises ValueError otherwise)."""

    def check(v: Any) -> int | str:
        if v == "auto":
            return "auto"
        if isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi:
            return v
        raise ValueError(f'must be "auto" or an integer in [{lo}, {hi}], got {v!r}')

    return check


def float_nonneg(v: Any) -> float:
    """A number >= 0, as float."""
    if not isinstance(v, int | float) or isinstance(v, bool):
        raise ValueError(f"must be a number, got {type(v).__name__}")
    if not v >= 0:
        raise ValueError(f"must be >= 0, got {v}")
    return float(v)


def float_pos(v: Any) -> float:
    """A number > 0, as float."""
    if not isinstance(v, int | float) or isinstance(v, bool):
        raise ValueError(f"must be a number, got {type(v).__name__}")
    if not v > 0:
        raise ValueError(f"must be > 0, got {v}")
    return float(v)


def float_range(lo: float, hi: float) -> Callable[[Any], float]:
    """Checker of a number in [lo, hi], as float."""

    def check(v: Any) -> float:
        if not isinstance(v, int | float) or isinstance(v, bool):
            raise ValueError(f"must be a number, got {type(v).__name__}")
        if not lo <= v <= hi:
            raise ValueError(f"must be in [{lo:g}, {hi:g}], got {v}")
        return float(v)

    return check


def size(v: Any) -> int:
    """Bytes: an integer or a size string like ``"4G"`` (``krex_client.sizes``)."""
    if not isinstance(v, int | str) or isinstance(v, bool):
        raise ValueError(f'must be bytes or a size string like "4G", got {type(v).__name__}')
    return parse_size(v)


def boolean(v: Any) -> bool:
    """``true`` or ``false``."""
    if not isinstance(v, bool):
        raise ValueError(f"must be true or false, got {type(v).__name__}")
    return v


def string(v: Any) -> str:
    """Any string."""
    if not isinstance(v, str):
        raise ValueError(f"must be a string, got {type(v).__name__}")
    return v


def choice(*options: str) -> Callable[[Any], str]:
    """Checker of a string among ``options``."""

    def check(v: Any) -> str:
        if string(v) not in options:
            raise ValueError(f"must be one of {', '.join(options)}, got {v!r}")
        return str(v)

    return check


def abs_path_or_empty(v: Any) -> str:
    """An absolute path, or "" (meaning: the default)."""
    s = string(v)
    if s and not os.path.isabs(s):
        raise ValueError(f"must be an absolute path, got {s!r}")
    return s


def socket_path(v: Any) -> str:
    """A Unix socket path (made absolute) of at most 107 bytes."""
    s = string(v)
    if not s:
        raise ValueError("must not be empty")
    if len(os.fsencode(os.path.abspath(s))) > 107:
        raise ValueError("longer than the 107 bytes a Unix socket path may have")
    return os.path.abspath(s)


def octal_mode(v: Any) -> int:
    """A file mode as an octal string (``"0660"``)."""
    if isinstance(v, str) and re.fullmatch(r"0?[0-7]{3}", v):
        return int(v, 8)
    raise ValueError(f'must be an octal string like "0660", got {v!r}')


_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


def cgroup_name(v: Any) -> str:
    """A cgroup directory name that cannot collide with kernel files (no dots)."""
    s = string(v)
    # Names share a directory with kernel files (cgroup.*, cpuset.*, ...): refuse dots
    # at the start and anything that looks like "<controller>.<file>".
    if not _NAME_RE.fullmatch(s) or "." in s:
        raise ValueError(f"must match [A-Za-z0-9][A-Za-z0-9_-]* (no dots), got {s!r}")
    return s


def pattern_list(pattern: str, what: str, max_items: int = 256) -> Callable[[Any], tuple[str, ...]]:
    """Checker of a list of strings, each matching ``pattern`` (``what`` names one in errors)."""
    regex = re.compile(pattern)

    def check(v: Any) -> tuple[str, ...]:
        if not isinstance(v, list):
            raise ValueError(f"must be a list of {what}s, got {type(v).__name__}")
        if len(v) > max_items:
            raise ValueError(f"has more than {max_items} items")
        for item in v:
            if not isinstance(item, str) or not regex.fullmatch(item):
                raise ValueError(f"{item!r} is not a {what} (must match {pattern})")
        return tuple(v)

    return check


def parse_cores(v: Any) -> tuple[int, ...]:
    """Parse a core list: ``"0-3,8"`` or ``[0, 1, 2]`` -> sorted unique core ids."""
    cores: set[int] = set()
    if isinstance(v, str):
        for part in v.split(","):
            part = part.strip()
            m = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
            if not m:
                raise ValueError(f'bad core list {v!r} (want e.g. "0-3,8")')
            lo, hi = int(m.group(1)), int(m.group(2) or m.group(1))
            if hi < lo:
                raise ValueError(f"bad core range {part!r}")
            cores.update(range(lo, hi + 1))
    elif isinstance(v, list):
        for c in v:
            cores.add(integer(0)(c))
    else:
        raise ValueError(f"must be a core list string or array, got {type(v).__name__}")
    return tuple(sorted(cores))


def format_cores(cores: tuple[int, ...] | list[int] | set[int] | frozenset[int]) -> str:
    """Format core ids as a cpuset list string (``[0,1,2,5]`` -> ``"0-2,5"``)."""
    out: list[str] = []
    ordered = sorted(cores)
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        out.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(out)


def slices_table(v: Any) -> dict[int, tuple[int, ...]]:
    """``[cpu.slices]``: GPU index -> core list (:func:`parse_cores`)."""
    if not isinstance(v, dict):
        raise ValueError("must be a table of gpu index = core list")
    out: dict[int, tuple[int, ...]] = {}
    for k, cores in v.items():
        if not re.fullmatch(r"\d+", k):
            raise ValueError(f"key {k!r} is not a GPU index")
        try:
            out[int(k)] = parse_cores(cores)
        except ValueError as exc:
            raise ValueError(f"GPU {k}: {exc}") from None
    return out


def host(v: Any) -> str:
    """An IP address to bind (``127.0.0.1``, ``::1``, ``0.0.0.0``)."""
    if not isinstance(v, str):
        raise ValueError(f"must be an IP address string, got {type(v).__name__}")
    try:
        return str(ipaddress.ip_address(v))
    except ValueError:
        raise ValueError(f"not an IP address: {v!r}") from None
