"""A command for the region-record tests: three regions over the fake driver.

Usage: region_record.py

Under ``KREX_TEST_GPU_API=hip`` the same over the fake HIP runtime
(fakegpu.init): HIP events (hipEventRecord, hipEventElapsedTime), HIP streams.

1. Times a kernel with events outside any region (cuEventElapsedTime).
2. Region 1: times a 1 ms kernel on the legacy stream with events and leaves
   a 30 ms kernel running on a side stream (work left on another stream).
3. Region 2, in a child process of this command (the log is shared).
4. Region 3: the same timing as 1, inside; the side stream idle.

Prints ``{"pid", "child"}``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "fakecuda"))

import fakegpu  # noqa: E402

from krex_client import region  # noqa: E402


def timed(gpu: fakegpu.FakeGpu, ns: int) -> float:
    start, end = gpu.event_create(), gpu.event_create()
    gpu.event_record(start)
    gpu.launch(ns)
    gpu.event_record(end)
    gpu.event_synchronize(end)
    return gpu.event_elapsed_ms(start, end)


def main() -> None:
    if sys.argv[1:] == ["child"]:
        gpu = fakegpu.init()
        with region.critical():
            gpu.launch(200_000)
            gpu.synchronize()
        return
    gpu = fakegpu.init()
    side = gpu.stream_create(nonblocking=True)
    timed(gpu, 200_000)  # outside any region
    with region.critical():
        timed(gpu, 1_000_000)
        gpu.launch(30_000_000, side)  # not covered by the timing
    child = subprocess.run([sys.executable, __file__, "child"], check=True)
    with region.critical():
        timed(gpu, 1_000_000)
    print(json.dumps({"pid": os.getpid(), "child": child.returncode}))


if __name__ == "__main__":
    main()
