"""A holder command for region tests: enters critical regions and watches siblings.

Usage: holder.py SHM_FILE NSLOTS [--cycles N] [--hold-s S] [--die-in-region]
                 [--ready-file F] [--sleep-in-region S]

For each cycle: read every sibling counter, enter ``region.critical()``, read
them again at the start and end of the region (``--hold-s`` apart), leave,
wait ``--hold-s``, read them once more.  Prints one JSON line per cycle:
``{"cycle", "epoch_ok", "in_region_advanced": [slot...], "after_exit_advanced": [...],
"enter_t", "exit_t", "stats"}`` (times: CLOCK_MONOTONIC s).  With
``--die-in-region`` it kills itself with SIGKILL inside the first region,
after writing ``in-region`` to --ready-file.
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import signal
import struct
import sys
import time

from krex_client import region


def counters(mem: mmap.mmap, n: int) -> list[int]:
    return [struct.unpack_from("<Q", mem, 8 * i)[0] for i in range(n)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("shm")
    ap.add_argument("nslots", type=int)
    ap.add_argument("--cycles", type=int, default=1)
    ap.add_argument("--hold-s", type=float, default=0.2)
    ap.add_argument("--die-in-region", action="store_true")
    ap.add_argument("--ready-file", default="")
    ap.add_argument("--sleep-in-region", type=float, default=0.0)
    args = ap.parse_args()
    with open(args.shm, "r+b") as f:
        mem = mmap.mmap(f.fileno(), 0)
    for cycle in range(args.cycles):
        with region.critical():
            enter_t = time.monotonic()
            if args.ready_file:
                with open(args.ready_file, "a") as rf:
                    rf.write(f"in-region {enter_t}\n")
            if args.die_in_region:
                os.kill(os.getpid(), signal.SIGKILL)
            if args.sleep_in_region:
                time.sleep(args.sleep_in_region)
            before = counters(mem, args.nslots)
            time.sleep(args.hold_s)
            during = counters(mem, args.nslots)
            exit_t = time.monotonic()
        time.sleep(args.hold_s)
        after = counters(mem, args.nslots)
        print(
            json.dumps(
                {
                    "cycle": cycle,
                    "in_region_advanced": [i for i in range(args.nslots) if during[i] != before[i]],
                    "after_exit_advanced": [i for i in range(args.nslots) if after[i] != during[i]],
                    "enter_t": enter_t,
                    "exit_t": exit_t,
                    "stats": region.stats(),
                }
            ),
            flush=True,
        )
    sys.exit(0)


if __name__ == "__main__":
    main()
