"""Sibling for drain tests: registered with the shim, launches one kernel per line of stdin.

Usage: launch_on_demand.py

Initializes the fake GPU and runs one short kernel to the end (so the shim
has registered the process and its drainer runs), prints ``{"pid": ...}``,
then for each line ``N`` on stdin launches one N ns kernel without waiting
for it and prints ``launched``: the process's next drain synchronizes with
that kernel, so it acknowledges only after the kernel ended.  Ends at end
of input.
"""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "fakecuda"))

import fakegpu  # noqa: E402


def main() -> None:
    gpu = fakegpu.init()
    gpu.launch(10_000)
    gpu.synchronize()
    print(json.dumps({"pid": os.getpid()}), flush=True)
    for line in sys.stdin:
        gpu.launch(int(line))
        print("launched", flush=True)


if __name__ == "__main__":
    main()
