"""Numeric error codes of the control plane and the exit codes of the CLIs.

The *names* are the contract (docs/design/interfaces.md); the numbers are
stable once released.  krexd raises ``krexd.system.errors.KrexError(Code.X,
"message")`` and its server turns it into an error reply ``{"code", "name",
"message"}``; ``krex`` and ``krexctl`` read the name back and map it to an exit
code here.  One definition for both sides; standard library
only (no pyzmq, no GPU).
"""

from __future__ import annotations

from enum import IntEnum


class Code(IntEnum):
    """Error codes carried in error replies."""

    BAD_FRAME = 1  # not msgpack, not a map, too large
    BAD_VERSION = 2  # missing or unsupported protocol version
    UNKNOWN_OP = 3  # op not in krexd's control.OPS
    BAD_FIELD = 4  # a field is missing, of the wrong type or out of range
    AUTH = 5  # tenant id / token missing or wrong
    NOT_HOLDER = 6  # region_exit from a tenant that does not hold the region
    NESTED_REGION = 7  # region_enter while already holding
    DRAIN_TIMEOUT = 8  # siblings did not drain in time
    FREEZE_TIMEOUT = 9  # siblings did not freeze in time
    NO_SUCH_GPU = 10  # --gpu N names a GPU krexd does not have
    SHUTTING_DOWN = 11  # krexd is stopping
    INTERNAL = 12  # a bug or an unexpected OS error; see krexd's log
    REGION_ABORTED = 13  # the region was ended by recovery
    CANCELLED = 14  # the request was withdrawn (e.g. its launcher died while parked)
    REGION_NO_MEMORY = 15  # a region's expected memory can never fit beside its siblings
    FOREIGN_GPU_USER = 16  # a process outside krex uses the GPU ([region] foreign = "refuse")
    TOO_MANY = 17  # a per-uid or global cap (connections, requests in progress) is reached


class ExitCode(IntEnum):
    """Exit codes of ``krex`` and ``krexd`` (sysexits.h / coreutils ``timeout``)."""

    OK = 0
    FAILURE = 1
    USAGE = 2  # argparse's own
    DATAERR = 65  # EX_DATAERR: krexd refused the request (bad field, no such GPU…)
    NOPERM = 77  # EX_NOPERM: authentication refused
    UNAVAILABLE = 69  # EX_UNAVAILABLE: krexd unreachable
    SOFTWARE = 70  # EX_SOFTWARE: internal error in krexd
    CONFIG = 78  # EX_CONFIG: krexd's configuration is invalid
    TEMPFAIL = 75  # EX_TEMPFAIL: CMD failed on GPU memory its co-tenants held; run it again
    FAULT_CASUALTY = 76  # CMD failed only because a co-tenant's kernel faulted the GPU (MPS)
    #                      and its re-runs (krex run --fault-retries) were used up
    UNPROTECTABLE = 79  # krexd ended CMD: it used the GPU where krex cannot drain it,
    # or tampered with its gate registrations (the message names the process and cause)
    WRONG_GPU = 83  # CMD tried to create a context on another GPU than its own (the shim ends it)
    TIMEOUT = 124  # krex run --timeout expired (as coreutils timeout)
    CANNOT_EXEC = 126  # CMD found but not executable
    NOT_FOUND = 127  # CMD not found


class StatusExit(IntEnum):
    """``krexctl status`` exit codes, LSB ``status`` convention."""

    RUNNING = 0
    NOT_RUNNING = 3
    UNKNOWN = 4


def exit_code_for(name: str) -> int:
    """Map an error name from a reply (e.g. ``"AUTH"``) to a ``krex`` exit code."""
    if name == "AUTH":
        return ExitCode.NOPERM
    if name in ("INTERNAL",):
        return ExitCode.SOFTWARE
    if name in ("SHUTTING_DOWN", "TOO_MANY"):
        return ExitCode.UNAVAILABLE
    return ExitCode.DATAERR


#: What each co-tenant out-of-memory reason of the shim means (the reasons are
#: krexd's ``gate.COTENANT_REASONS``), for ``krex run``'s one-line message
#: when it exits 75.
COTENANT_TEXT = {
    "timeout": "co-tenants did not free enough GPU memory within [memory] oom_wait_s",
    "in_region": "inside its critical region, where frozen co-tenants' memory cannot be awaited",
    "nested": "inside another driver call, where the shim cannot wait",
    "no_wait": "co-tenants held the GPU memory and waiting is off ([memory] oom_wait_s = 0)",
    "mutual": "every co-tenant holding GPU memory was waiting for memory too",
}
