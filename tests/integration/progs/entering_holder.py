"""Holder that tries one region per line it reads on stdin and reports how each went.

Usage: entering_holder.py

Prints ``ready``, then for each line on stdin enters ``region.critical()``
(leaving at once) and prints ``{"ok": true, "granted_ns": ...}`` or, when
the entry fails, ``{"ok": false, "error": "..."}`` (CLOCK_MONOTONIC ns).
Ends at end of input.
"""

from __future__ import annotations

import json
import time

from krex_client import region


def main() -> None:
    print("ready", flush=True)
    while input_line():
        try:
            with region.critical():
                granted = time.monotonic_ns()
        except region.RegionError as exc:
            print(json.dumps({"ok": False, "error": str(exc)}), flush=True)
            continue
        print(json.dumps({"ok": True, "granted_ns": granted}), flush=True)


def input_line() -> bool:
    try:
        input()
    except EOFError:
        return False
    return True


if __name__ == "__main__":
    main()
