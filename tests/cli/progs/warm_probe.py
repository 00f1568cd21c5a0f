"""What a command can see of how it was started, printed as one JSON line (tests/cli/test_warm_*).

Run as a script (``python warm_probe.py ARGS``), a module (``python -m
warm_probe ARGS`` from this directory) or a program (``python -c "$(cat
warm_probe.py)" ARGS``).  It reads its cgroup before anything else, so the
line shows where its first instruction ran.  Nothing here depends on how it
was started; the tests compare a cold run's line with a warm run's.
"""

CGROUP = open("/proc/self/cgroup").read()  # noqa: SIM115 - first thing, before any import

import gc  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import resource  # noqa: E402
import signal  # noqa: E402
import stat  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
import warnings  # noqa: E402

import __main__  # noqa: E402


def _fds() -> dict[str, str]:
    out = {}
    for fd in range(256):
        try:
            st = os.fstat(fd)
        except OSError:
            continue
        kind = "file"
        if stat.S_ISFIFO(st.st_mode):
            kind = "pipe"
        elif stat.S_ISSOCK(st.st_mode):
            kind = "socket"
        elif stat.S_ISCHR(st.st_mode):
            kind = "chr"
        flags = "inheritable" if os.get_inheritable(fd) else "cloexec"
        out[str(fd)] = f"{kind} {flags}"
    return out


def _stream(s: object) -> dict[str, object] | None:
    if s is None:
        return None
    buf = getattr(s, "buffer", None)
    return {
        "isatty": s.isatty(),  # type: ignore[attr-defined]
        "line_buffering": getattr(s, "line_buffering", None),
        "write_through": getattr(s, "write_through", None),
        "encoding": getattr(s, "encoding", None),
        "errors": getattr(s, "errors", None),
        "name": getattr(s, "name", None),
        "mode": getattr(s, "mode", None),
        "buffer": type(buf).__name__,
        "raw_name": getattr(getattr(buf, "raw", buf), "name", None),
        "newlines": repr(getattr(s, "newlines", None)),
    }


def _main_module() -> dict[str, object]:
    out: dict[str, object] = {"keys": sorted(vars(__main__))}
    for key in ("__file__", "__cached__", "__name__", "__package__", "__doc__"):
        out[key] = repr(vars(__main__).get(key, "<absent>"))
    spec = vars(__main__).get("__spec__")
    out["__spec__"] = None if spec is None else [spec.name, spec.origin]
    loader = vars(__main__).get("__loader__")
    out["__loader__"] = getattr(loader, "__name__", type(loader).__name__)
    out["__builtins__"] = type(vars(__main__).get("__builtins__")).__name__
    out["in_sys_modules"] = sys.modules.get("__main__") is __main__
    return out


def _umask() -> str:
    with open("/proc/self/status") as f:
        return [ln.split()[1] for ln in f if ln.startswith("Umask:")][0]


def observe() -> dict[str, object]:
    """Everything the tests compare."""
    sigs = {}
    for sig in signal.valid_signals():
        try:
            sigs[str(int(sig))] = repr(signal.getsignal(sig))
        except (OSError, ValueError):
            pass
    return {
        "cgroup": CGROUP,
        "argv": sys.argv,
        "orig_argv": getattr(sys, "orig_argv", None),
        "path": sys.path,
        "executable": sys.executable,
        "flags": list(sys.flags),
        "main": _main_module(),
        "cwd": os.getcwd(),
        "umask": _umask(),
        "rlimits": {
            n: list(resource.getrlimit(getattr(resource, n)))
            for n in dir(resource)
            if n.startswith("RLIMIT_")
        },
        "nice": os.getpriority(os.PRIO_PROCESS, 0),
        "ids": [os.getuid(), os.geteuid(), os.getgid(), os.getegid(), sorted(os.getgroups())],
        "env": dict(os.environ),
        "fds": _fds(),
        "stdio": [_stream(sys.stdin), _stream(sys.stdout), _stream(sys.stderr)],
        "std_are_dunder": [
            sys.stdin is sys.__stdin__,
            sys.stdout is sys.__stdout__,
            sys.stderr is sys.__stderr__,
        ],
        "signals": sigs,
        "sigmask": sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, [])),
        "own_group": os.getpgrp() == os.getpid(),
        "excepthook_default": sys.excepthook is sys.__excepthook__,
        "warnings": repr(warnings.filters),
        "gc": [gc.isenabled(), list(gc.get_threshold())],
        "threads": threading.active_count(),
    }


print(json.dumps(observe()))
