"""A sibling command for region tests: increments counters in a shared file.

Usage: counter.py SHM_FILE INDEX [--fork]

Slot INDEX (a little-endian uint64 at offset 8*INDEX) counts up about once
per millisecond for as long as the process runs.  With --fork, a forked
grandchild counts in slot INDEX+1 too, so a test can check that freezing a
tenant catches its whole process tree.  Never talks to krexd and never calls
the GPU: a tenant the shim has not seen.
"""

from __future__ import annotations

import mmap
import os
import struct
import sys
import time


def count(path: str, index: int) -> None:
    with open(path, "r+b") as f:
        mem = mmap.mmap(f.fileno(), 0)
    n = 0
    while True:
        n += 1
        struct.pack_into("<Q", mem, 8 * index, n)
        time.sleep(0.001)


def main() -> None:
    path, index = sys.argv[1], int(sys.argv[2])
    if "--fork" in sys.argv[3:] and os.fork() == 0:
        count(path, index + 1)
    count(path, index)


if __name__ == "__main__":
    main()
