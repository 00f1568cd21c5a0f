"""The stand-in GPU's SM clock, shared by the stand-in ``pynvml`` and ``amdsmi`` here.

It reads ``STANDIN_SMI_COLD_MHZ`` (default 990) for the first
``STANDIN_SMI_COLD_READS`` reads of this process (default: every read),
then :data:`MAX_MHZ`, the maximum.
"""

from __future__ import annotations

import os

MAX_MHZ = 1980
_reads = 0


def sm_clock() -> int:
    """The SM clock of this read, counting it."""
    global _reads
    _reads += 1
    cold = os.environ.get("STANDIN_SMI_COLD_READS", "")
    if cold and _reads > int(cold):
        return MAX_MHZ
    return int(os.environ.get("STANDIN_SMI_COLD_MHZ", "990"))
