"""``krex run`` after a GPU-wide fault under MPS: run casualties again, suspects alone.

By the ``gpu_fault`` role of krexd's ``release`` reply: a ``culprit``'s
exit code stands, a ``casualty`` runs again, a ``suspect`` runs again as a
shared tenant outside MPS (``mps: false``); after ``retries`` re-runs that
still end as casualties, exit 76.  docs/design/faults.md "Attribution".
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from krex_client.errors import ExitCode

#: Re-runs after GPU-wide faults (``krex run --fault-retries``).
DEFAULT_RETRIES = 2

#: CUresult names of the fatal errors krexd reports (cuda.h).
_ERRORS = {
    46: "CUDA_ERROR_DEVICE_UNAVAILABLE",
    700: "CUDA_ERROR_ILLEGAL_ADDRESS",
    702: "CUDA_ERROR_LAUNCH_TIMEOUT",
    714: "CUDA_ERROR_HARDWARE_STACK_ERROR",
    715: "CUDA_ERROR_ILLEGAL_INSTRUCTION",
    716: "CUDA_ERROR_MISALIGNED_ADDRESS",
    717: "CUDA_ERROR_INVALID_ADDRESS_SPACE",
    718: "CUDA_ERROR_INVALID_PC",
    719: "CUDA_ERROR_LAUNCH_FAILED",
    214: "CUDA_ERROR_ECC_UNCORRECTABLE",
    805: "CUDA_ERROR_MPS_CONNECTION_FAILED",
    806: "CUDA_ERROR_MPS_RPC_FAILURE",
    807: "CUDA_ERROR_MPS_SERVER_NOT_READY",
    810: "CUDA_ERROR_MPS_CLIENT_TERMINATED",
}


class Casualty(Exception):
    """CMD failed (exit ``code``) with a GPU-wide fault it may not have caused.

    Raised by ``krex_cli.run`` after ``release`` (the slot is already
    freed); ``role`` is ``casualty`` or ``suspect``; ``fault`` krexd's record.
    """

    def __init__(self, code: int, fault: dict[str, Any]) -> None:
        super().__init__(f"{fault.get('role')} of a GPU-wide fault (exit {code})")
        self.code = code
        self.fault = fault
        self.role = str(fault.get("role"))


#: Words of the stderr lines below that ``summary`` reads back (``krex replay``).
CULPRIT_MARK = "its own kernel faulted GPU"
RERUN_MARK = "under MPS: "
ISOLATED_MARK = "running it without MPS"


def summary(stderr: str, exit_code: int | None) -> dict[str, Any] | None:
    """What ``krex run``'s ``stderr`` says about GPU-wide faults; None when nothing.

    ``{"role": "culprit"|"casualty", "reruns": int}``: a culprit was named by
    krexd or, run again alone as a suspect, failed again (``exit_code``, the
    final one, neither 0 nor 76); every other command that was run again
    after a fault is a casualty.
    """
    lines = [ln for ln in stderr.splitlines() if ln.startswith("krex: ")]
    culprit = any(CULPRIT_MARK in ln for ln in lines)
    reruns = sum(1 for ln in lines if RERUN_MARK in ln and "running it" in ln)
    isolated = any(ISOLATED_MARK in ln for ln in lines)
    if not culprit and not reruns and not any(RERUN_MARK in ln for ln in lines):
        return None
    if isolated and exit_code not in (0, int(ExitCode.FAULT_CASUALTY)):
        culprit = True
    return {"role": "culprit" if culprit else "casualty", "reruns": reruns}


def _say(msg: str) -> None:
    print(f"krex: {msg}", file=sys.stderr, flush=True)


def error_name(fault: dict[str, Any]) -> str:
    """The fatal error of ``fault`` by name (``CUDA_ERROR_ILLEGAL_ADDRESS``), or
    ``an unrecorded error`` when krexd has no record of one (``error`` null)."""
    if fault.get("error") is None:
        return "an unrecorded error"
    code = int(fault["error"])
    return _ERRORS.get(code, f"CUDA error {code}")


def judge(argv: list[str], code: int, reply: dict[str, Any] | None) -> None:
    """Raise :class:`Casualty` when krexd's ``release`` reply says CMD's failure was not its own.

    Returns for a success, a kill by krexd, no GPU-wide fault, or a culprit
    (after one line saying the fault was CMD's own).
    """
    fault = (reply or {}).get("gpu_fault")
    if code == 0 or not isinstance(fault, dict) or (reply or {}).get("kill_reason"):
        return
    if fault.get("role") == "culprit":
        _say(
            f"{argv[0]} failed (exit {code}): {CULPRIT_MARK} {fault.get('gpu')} "
            f"({error_name(fault)}; {fault.get('why')})"
        )
        return
    if fault.get("role") in ("casualty", "suspect"):
        raise Casualty(code, fault)


def with_reruns(argv: list[str], attempt: Callable[[bool], int], retries: int) -> int:
    """Run ``attempt(without_mps)``; after each :class:`Casualty` run it again, ``retries`` times.

    The first run is as asked (``without_mps`` False); a suspect's re-runs
    are without MPS (shared, not a client of the server).  Returns the last
    run's exit code, or 76 when the last one was still a casualty.
    """
    without_mps = False
    for n in range(retries + 1):
        try:
            return attempt(without_mps)
        except Casualty as c:
            what = (
                "a co-tenant's kernel faulted the GPU"
                if c.role == "casualty"
                else "a kernel faulted the GPU and krexd cannot tell whose"
            )
            head = (
                f"{argv[0]} failed (exit {c.code}) with {error_name(c.fault)} on GPU "
                f"{c.fault.get('gpu')} {RERUN_MARK}{what} ({c.fault.get('why')})"
            )
            if n == retries:
                _say(
                    f"{head}; {retries} re-run(s) used up: exit "
                    f"{int(ExitCode.FAULT_CASUALTY)} (a co-tenant's fault, not the command's)"
                )
                return ExitCode.FAULT_CASUALTY
            without_mps = without_mps or c.role == "suspect"
            how = ISOLATED_MARK if without_mps else "running it again"
            _say(f"{head}; {how} (re-run {n + 1} of {retries})")
    return ExitCode.FAULT_CASUALTY  # not reached: the loop returns
