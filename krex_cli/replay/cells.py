"""Table cells of ``krex replay report``: a number, or "—" where there is none.

A statistic of no samples (a median of no warm start, a p95 of an empty
band) is NaN in ``metrics.json`` (written as null); in a table it is "—",
never ``nan``.
"""

from __future__ import annotations

import math
from typing import Any

NONE = "—"
"""The cell of a value that does not exist (no samples, not finite, absent)."""


def cell(x: Any, spec: str = ".2f", suffix: str = "") -> str:
    """``x`` formatted with ``spec`` and ``suffix``; :data:`NONE` unless a finite number."""
    if isinstance(x, bool) or not isinstance(x, int | float) or not math.isfinite(x):
        return NONE
    return f"{x:{spec}}{suffix}"
