"""A warm pool's zygote: import the configured modules once, then fork one process per command.

Run by file path under the command's own interpreter and flags, by the
pool's keeper (so this file and its ``krexpool_*`` siblings use the
standard library only).  docs/design/warm.md "Processes".
"""

from __future__ import annotations

import json
import os
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from krex_cli.warm.krexpool_child import Command


def _say(message: dict[str, Any]) -> None:
    """One JSON line to the keeper (our stdout)."""
    os.write(1, (json.dumps(message) + "\n").encode())


def _read_settings() -> dict[str, Any] | None:
    """The settings line the keeper writes on our stdin (None at end of file)."""
    data = b""
    while not data.endswith(b"\n"):
        chunk = os.read(0, 65536)
        if not chunk:
            return None
        data += chunk
    settings = json.loads(data.decode())
    return settings if isinstance(settings, dict) else None


def _import_modules(names: list[str]) -> tuple[list[str], list[str], str | None]:
    """(imported, skipped, failure): modules that do not exist are skipped, anything else fails."""
    import importlib

    imported: list[str] = []
    skipped: list[str] = []
    for name in names:
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name.split(".")[0] and exc.name != name:
                return imported, skipped, f"importing {name} failed: {exc!r}"
            skipped.append(name)
            continue
        except BaseException as exc:  # noqa: BLE001 - any failure leaves a half-imported state
            return imported, skipped, f"importing {name} failed: {exc!r}"
        imported.append(name)
    return imported, skipped, None


#: What ``torch.compile`` imports on its first use, none of which initialises CUDA:
#: imported after the configured modules when they include torch, optionally.
COMPILE_MODULES = ("torch._dynamo", "torch._inductor.config", "torch._inductor.compile_fx")


def import_list(modules: list[str]) -> tuple[list[str], list[str]]:
    """``(required, optional)``: the configured ``modules``, and the compile modules a
    pool importing ``torch`` adds (none otherwise; never one configured already)."""
    required = list(modules)
    if "torch" not in required:
        return required, []
    return required, [m for m in COMPILE_MODULES if m not in required]


def _import_optional(names: list[str]) -> tuple[list[str], list[str]]:
    """``(imported, skipped)``: ``names`` imported here only if a trial fork imported them
    all without failing or leaving the process unfit to fork (:func:`_unclean`), since
    an import cannot be undone; any failure skips them all, the pool serves without.

    ``TORCH_WARM_POOL=0`` during the imports (unless set): Inductor versions that
    start their compile workers when imported start them at the first compile instead.
    """
    if not names:
        return [], []
    pid = os.fork()
    if pid == 0:
        try:
            ok = _import_tolerant(names) == names and _unclean() is None
        except BaseException:  # noqa: BLE001 - whatever happens, the trial says no
            ok = False
        os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        return [], list(names)
    imported = _import_tolerant(names)
    return imported, [n for n in names if n not in imported]


def _import_tolerant(names: list[str]) -> list[str]:
    """Import ``names`` in order, stopping at the first failure; those imported."""
    import importlib

    unset = "TORCH_WARM_POOL" not in os.environ
    if unset:
        os.environ["TORCH_WARM_POOL"] = "0"
    done: list[str] = []
    try:
        for name in names:
            try:
                importlib.import_module(name)
            except Exception:  # noqa: BLE001 - optional: the command imports it itself
                break
            done.append(name)
    finally:
        if unset:
            os.environ.pop("TORCH_WARM_POOL", None)
    return done


def _threads() -> int:
    """This process's thread count (``Threads:`` of /proc/self/status; 1 when unreadable)."""
    with open("/proc/self/status") as f:
        found = [ln.split()[1] for ln in f if ln.startswith("Threads:")]
    return int(found[0]) if found else 1


def _threads_after_a_trial_fork() -> int:
    """The thread count once a fork has run the libraries' fork handlers.

    Thread pools that are safe to fork stop their threads in a
    ``pthread_atfork`` handler and start them again on their next use:
    OpenBLAS does, and ``import torch`` starts its pool through numpy (one
    thread per core but one: 15 on a 16-core host).  A fork whose child
    exits at once shows which threads outlive a fork: those are the unsafe
    ones (another thread's lock copied held).
    """
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    return _threads()


def _unclean() -> str | None:
    """Why a fork of this process would not be a clean start (None when it would be).

    A loaded but uninitialised CUDA driver is a clean start (``import torch``
    maps ``libcuda.so`` on some builds without calling it; CUDA's fork rule
    is about an initialised driver).  Initialised is judged by the shim (every
    driver call through it initialises it) and, whatever path reached the
    driver, by an open GPU device file (``cuInit`` opens ``/dev/nvidiactl``).
    Without the shim nothing can tell, and a mapped ``libcuda.so`` refuses.
    """
    if _threads() > 1 and (left := _threads_after_a_trial_fork()) > 1:
        return (
            f"the imports left {left - 1} thread(s) running that do not stop at a fork "
            "(a fork copies one)"
        )
    mode = None
    if os.environ.get("LD_PRELOAD"):
        import ctypes

        mode = getattr(ctypes.CDLL(None), "krex_shim_mode", None)
        if mode is not None and mode() != 0:
            return "the imports called the CUDA driver (libkrex_shim is initialised)"
    device = _gpu_device_open()
    if device is not None:
        return f"the imports initialised the CUDA driver ({device} is open)"
    if mode is None:
        with open("/proc/self/maps") as f:
            if any("/libcuda.so" in line for line in f):
                return "the imports loaded the CUDA driver (libcuda.so) and no shim can tell"
    return None


#: Device files a GPU driver opens when it initialises (NVIDIA; AMD's KFD and DRM).
GPU_DEVICE_PREFIXES = ("/dev/nvidia", "/dev/kfd", "/dev/dri/")


def _gpu_device_open(prefixes: tuple[str, ...] = GPU_DEVICE_PREFIXES) -> str | None:
    """The first file open or mapped in this process whose path starts with one of
    ``prefixes`` (a driver keeps its device files mapped even after closing them)."""
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue  # the listing's own descriptor, closed meanwhile
        if target.startswith(prefixes):
            return target
    with open("/proc/self/maps") as f:
        for line in f:
            fields = line.split(maxsplit=5)  # the sixth, when present, is the mapped path
            if len(fields) == 6 and fields[5].strip().startswith(prefixes):
                return fields[5].strip()
    return None


def _main() -> Command | None:
    """Boot, import, check, serve; the command to run when this is a forked child.

    Started with the command's environment plus ``KREX_SHIM_DEFER=1``,
    stdin/stdout pipes to the keeper and stderr to the pool's log:

    1. Record the interpreter as it started (``krexpool_child.Boot``).
    2. Read the pool's settings, one JSON line on stdin: ``socket``,
       ``key``, ``version``, ``idle_s``, ``modules`` (sent once krexd has
       registered the zygote and moved it into its pool cgroup).
    3. Import the modules.  One that does not exist is skipped; one that
       fails otherwise, a thread left running, an initialised shim
       (``krex_shim_mode() != 0``) or an initialised CUDA driver (a GPU
       device file open) make the pool refuse: a fork would not be a clean
       start.  With torch, :data:`COMPILE_MODULES` too, optionally (only
       when a trial fork imported them cleanly).
    4. Say ``{"ready": ...}`` or ``{"refused": why}`` on stdout.
    5. Serve (``krexpool_serve.Server``); in a forked child the server
       returns the command, which runs at the script's top level, so that
       it ends through the interpreter's normal exit path.
    """
    original_path = list(sys.path)
    here = os.path.dirname(os.path.realpath(__file__))
    sys.path.insert(0, here)
    if TYPE_CHECKING:
        from krex_cli.warm import krexpool_child, krexpool_serve
    else:
        import krexpool_child
        import krexpool_serve

    boot = krexpool_child.Boot(os.path.abspath(__file__), original_path)
    sys.path[:] = boot.base_path
    if sys.version_info < (3, 9):  # noqa: UP036 - the command's interpreter may be older
        _say({"refused": f"Python {sys.version_info[0]}.{sys.version_info[1]} (3.9 or later)"})
        return None
    settings = _read_settings()
    if settings is None:
        return None
    required, optional = import_list(list(settings.get("modules") or []))
    imported, skipped, failure = _import_modules(required)
    why = failure or _unclean()
    if why is None and optional and "torch" in imported:
        more, left = _import_optional(optional)
        imported, skipped = imported + more, skipped + left
    if why is not None:
        krexpool_serve.log(f"refusing to serve: {why}")
        _say({"refused": why})
        return None
    server = krexpool_serve.Server(settings, boot, {"modules": imported, "skipped": skipped})
    server.bind()
    krexpool_serve.log(f"serving {settings['socket']}: imported {', '.join(imported) or '-'}")
    _say({"ready": True, "pid": os.getpid(), "modules": imported, "skipped": skipped})
    return server.run()


if __name__ == "__main__":
    _command = _main()
    if _command is None:
        raise SystemExit(0)
    _command.run()
