"""Byte sizes as people write them: ``4G``, ``512M``, ``1.5GiB``, ``1048576``.

Units are binary whatever the spelling (``K`` = 2**10 … ``T`` = 2**40; ``G``,
``GiB`` and ``GB`` are the same), as for ``KREX_FAKE_MEM_BYTES`` and
``nvidia-smi``'s MiB.  Used by ``krex run --mem``, ``krexctl status`` and
krexd's ``[memory]`` configuration table: one definition for both sides.
Standard library only.
"""

from __future__ import annotations

import re

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_SIZE_RE = re.compile(r"(\d+(?:\.\d*)?|\.\d+)\s*([KMGT]?)(?:I?B)?", re.IGNORECASE)
MAX_BYTES = 1 << 60


def parse_size(value: str | int) -> int:
    """Bytes in ``value``: an int, or a string like ``"4G"``, ``"512MiB"``, ``"1.5g"``.

    Raises ``ValueError`` (naming the value) for anything else, negative or
    fractional byte counts, and sizes of 2**60 bytes or more.
    """
    if isinstance(value, bool):
        raise ValueError(f"not a size: {value!r}")
    if isinstance(value, int):
        n = value
    elif isinstance(value, str):
        m = _SIZE_RE.fullmatch(value.strip())
        if m is None:
            raise ValueError(
                f"not a size: {value!r} (want bytes, or a number with K, M, G or T, e.g. 4G)"
            )
        exact = float(m.group(1)) * _UNITS[m.group(2).upper()]
        if exact != int(exact) and m.group(2) == "":
            raise ValueError(f"not a whole number of bytes: {value!r}")
        n = int(exact)
    else:
        raise ValueError(f"not a size: {value!r}")
    if not 0 <= n < MAX_BYTES:
        raise ValueError(f"size out of range: {value!r}")
    return n


def format_size(n: int) -> str:
    """``n`` bytes for people: ``512 MiB``, ``4.0 GiB``, ``1.2 TiB``, ``300 B``."""
    if n < 1 << 10:
        return f"{n} B"
    for unit, shift in (("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            v = n / (1 << shift)
            return f"{v:.0f} {unit}" if unit in ("MiB", "KiB") else f"{v:.1f} {unit}"
    return f"{n} B"
