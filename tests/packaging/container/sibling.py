"""Sibling tenant of the package test: a CPU loop that shows whether it runs.

Usage: ``python3 sibling.py FILE``. Every 5 ms it replaces FILE with one
line ``<pid> <count>``; the count stops while the process is frozen.
"""

from __future__ import annotations

import os
import sys
import time


def main() -> int:
    """Loop until killed, publishing the loop count."""
    path = sys.argv[1]
    tmp = f"{path}.tmp"
    count = 0
    while True:
        count += 1
        with open(tmp, "w") as f:
            f.write(f"{os.getpid()} {count}\n")
        os.replace(tmp, path)
        time.sleep(0.005)


if __name__ == "__main__":
    sys.exit(main())
