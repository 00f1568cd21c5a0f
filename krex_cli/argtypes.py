"""Range-checked numbers for the command-line flags of ``krex``, ``krexctl`` and ``krex replay``.

Every numeric flag takes its value through :func:`integer` or :func:`seconds`
(or a type built on them), so a value out of range — negative, zero where it
must be positive, too large for the code that uses it, ``inf`` or ``nan`` —
is refused by argparse with one line naming the flag and the range, and
exit 2, never a traceback later.  The limits are the constants below.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

MAX_SECONDS = 1_000_000.0
"""The largest duration a flag takes (about 11.6 days): every wait built on one stays
within what ``poll(2)`` and the timers take (2**31 - 1 ms, about 24.8 days)."""

MAX_GPU = 65535
"""The largest GPU index (krexd's ``admit`` takes indices below 2**16)."""

MAX_PID = 1 << 22
"""The largest process id Linux gives (``pid_max`` at most 2**22)."""

MAX_COUNT = 1_000_000
"""The largest repetition, iteration or GPU count a flag takes."""


def _range(low: float, high: float, low_open: bool) -> str:
    left = "(" if low_open else "["
    return f"{left}{_shown(low)}, {_shown(high)}]"


def _shown(v: float) -> str:
    """``v`` as a flag's user writes it: ``1000000``, ``0.1``."""
    return str(int(v)) if float(v).is_integer() else f"{v:g}"


def integer(low: int, high: int, what: str = "an integer") -> Callable[[str], int]:
    """An argparse type: an integer in ``[low, high]``.

    ``what`` names the expected value in the message when the text is not an
    integer at all (e.g. ``"a GPU index"``).  Raises ``ArgumentTypeError``.
    """

    def conv(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be in {_range(low, high, False)}, got {text!r}")
        return value

    return conv


def seconds(
    low: float = 0.0, high: float = MAX_SECONDS, *, low_open: bool = True
) -> Callable[[str], float]:
    """An argparse type: a finite number of seconds in ``(low, high]`` (``[low, high]``
    when ``low_open`` is False).  ``inf``, ``nan`` and anything outside raise
    ``ArgumentTypeError``."""

    def conv(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
        inside = (value > low if low_open else value >= low) and value <= high
        if not math.isfinite(value) or not inside:
            raise argparse.ArgumentTypeError(
                f"must be seconds in {_range(low, high, low_open)}, got {text!r}"
            )
        return value

    return conv
