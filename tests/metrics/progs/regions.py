"""Enter N critical regions, each held HOLD_S seconds: ``regions.py N [HOLD_S]``."""

from __future__ import annotations

import sys
import time

from krex_client import region


def main() -> None:
    n = int(sys.argv[1])
    hold_s = float(sys.argv[2]) if len(sys.argv) > 2 else 0.0
    for _ in range(n):
        with region.critical():
            time.sleep(hold_s)


if __name__ == "__main__":
    main()
