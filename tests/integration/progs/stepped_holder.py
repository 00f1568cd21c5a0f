"""Holder that enters one region per line it reads on stdin, for tests that look between regions.

Usage: stepped_holder.py

Initializes the fake GPU, then for each line on stdin enters
``region.critical()``, launches one 100 µs kernel and synchronizes inside
it, leaves, and prints ``done N`` (N from 1).  Ends at end of input.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "fakecuda"))

import fakegpu  # noqa: E402

from krex_client import region  # noqa: E402


def main() -> None:
    gpu = fakegpu.init()
    print("ready", flush=True)
    for n, _line in enumerate(sys.stdin, 1):
        with region.critical():
            gpu.launch(100_000)
            gpu.synchronize()
        print(f"done {n}", flush=True)


if __name__ == "__main__":
    main()
