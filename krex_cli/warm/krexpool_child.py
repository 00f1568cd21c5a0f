"""A warm pool's child: become the command's process, then run it as a cold interpreter would.

Standard library only (it runs under the command's interpreter, forked from
the zygote).  :func:`become` sets the process up right after ``fork`` and
waits for ``go``; :meth:`Command.run`, called from the zygote script's top
level, runs the command.  docs/design/warm.md "A warm command, step by
step" (5-7) and "What a command can tell".
"""

from __future__ import annotations

import builtins
import fcntl
import io
import os
import resource
import signal
import socket
import sys
import types
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from krex_cli.warm import krexpool_wire as wire
else:
    try:  # the zygote: run by file path, it imports its siblings by these names
        import krexpool_wire as wire
    except ImportError:  # imported as part of krex_cli (tests, tools)
        from krex_cli.warm import krexpool_wire as wire

#: Signals ``krex run`` resets to SIG_DFL before a cold command's exec (krex_cli/run.py).
RESET_SIGNALS = ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGPIPE", "SIGXFSZ", "SIGTTOU")
#: What CPython ignores at start (SIGPIPE, SIGXFSZ; pylifecycle.c signal_install_handlers).
PYTHON_IGNORES = ("SIGPIPE", "SIGXFSZ")
_UNCATCHABLE = ("SIGKILL", "SIGSTOP")


class Boot:
    """What the zygote's interpreter looked like at start, before the pool changed anything.

    ``base_path``: ``path`` (``sys.path`` at start) without the zygote's own directory;
    ``prepends``: whether this interpreter puts a script's directory first
    (not under ``-P``, ``-I`` or ``PYTHONSAFEPATH``); ``stdio``: encoding and
    errors of stdin, stdout, stderr (from the locale and ``PYTHONIOENCODING``);
    ``buffered``: False under ``-u`` / ``PYTHONUNBUFFERED``; ``own_files``:
    the pool's source files, left out of tracebacks.
    """

    def __init__(self, zygote_file: str, path: list[str]) -> None:
        self.prepends = not (getattr(sys.flags, "safe_path", False) or sys.flags.isolated)
        self.base_path = list(path[1:] if self.prepends else path)
        streams = (sys.stdin, sys.stdout, sys.stderr)
        self.stdio = [
            (getattr(s, "encoding", "utf-8"), getattr(s, "errors", "strict")) for s in streams
        ]
        self.buffered = not getattr(sys.stdout, "write_through", False)
        self.own_files = {zygote_file, os.path.abspath(__file__)}


def _signal_numbers(names: tuple[str, ...]) -> set[int]:
    return {int(getattr(signal, n)) for n in names if hasattr(signal, n)}


def fresh_signals(ignored: list[int], mask: list[int]) -> None:
    """Dispositions and mask of an interpreter ``krex run`` just exec'd.

    ``ignored``: signals ``krex run`` itself ignores (SIG_IGN survives exec),
    less the ones it resets; everything else is SIG_DFL, then what CPython
    sets at start: SIGINT raises KeyboardInterrupt, SIGPIPE and SIGXFSZ are
    ignored.  ``mask``: ``krex run``'s blocked signals.
    """
    keep = set(ignored) - _signal_numbers(RESET_SIGNALS)
    skip = _signal_numbers(_UNCATCHABLE)
    for sig in signal.valid_signals():
        if sig in skip:
            continue
        try:
            signal.signal(sig, signal.SIG_IGN if sig in keep else signal.SIG_DFL)
        except (OSError, ValueError):
            pass  # reserved by the C library (SIGRTMIN..)
    for num in _signal_numbers(PYTHON_IGNORES):
        signal.signal(num, signal.SIG_IGN)
    if signal.SIGINT not in keep:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.pthread_sigmask(signal.SIG_SETMASK, mask)


def place_fds(conn: socket.socket, fds: list[int], targets: list[int]) -> socket.socket:
    """Put received ``fds`` at their ``targets`` numbers and close every other descriptor.

    ``conn`` (the request connection) is moved above them all, close-on-exec;
    the new connection object is returned.  Every target is inheritable, as
    in ``krex run``, whose fd table a cold command inherits.
    """
    floor = max([2, *targets]) + 1
    high = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, floor) for fd in fds]
    conn_fd = fcntl.fcntl(conn.fileno(), fcntl.F_DUPFD_CLOEXEC, floor)
    conn.close()
    for fd in fds:
        os.close(fd)
    for fd, target in zip(high, targets):  # noqa: B905 - the zygote may run on Python 3.9
        os.dup2(fd, target, inheritable=True)
    keep = set(targets) | {conn_fd}
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd not in keep:
            try:
                os.close(fd)
            except OSError:
                pass  # the directory's own descriptor, closed already
    return socket.socket(fileno=conn_fd)


def apply_process(req: dict[str, Any]) -> None:
    """umask, resource limits and nice value of ``krex run`` (raises OSError / ValueError)."""
    os.umask(int(req["umask"]))
    for name, (soft, hard) in req["rlimits"].items():
        res = getattr(resource, name, None)
        if res is not None and resource.getrlimit(res) != (soft, hard):
            resource.setrlimit(res, (soft, hard))
    nice = int(req["nice"])
    if os.getpriority(os.PRIO_PROCESS, 0) != nice:
        os.setpriority(os.PRIO_PROCESS, 0, nice)
    os.environ.clear()
    os.environ.update({str(k): str(v) for k, v in req["env"].items()})


#: Exit status of a pool child told ``go`` that krexd never placed (EX_SOFTWARE).
NOT_PLACED_EXIT = 70


def own_cgroup() -> str:
    """This process's cgroup2 path (the ``0::`` line of /proc/self/cgroup); "" when unreadable."""
    try:
        with open("/proc/self/cgroup") as f:
            for line in f:
                if line.startswith("0::"):
                    return line[3:].strip()
    except OSError:
        pass
    return ""


def become(
    conn: socket.socket,
    req: dict[str, Any],
    fds: list[int],
    boot: Boot,
    pool_cgroup: str | None = None,
) -> Command:
    """In the forked child: set up the command's process, report the pid, wait for ``go``.

    Never returns into the pool's server on failure: it answers ``{"error"}``
    (``krex run`` then starts the command cold) or just exits when
    ``krex run`` goes away or sends ``abort``.  ``pool_cgroup`` (a registered
    pool's cgroup, :func:`own_cgroup` of the zygote): at ``go`` this process
    must have left it, i.e. krexd placed it in a tenant; otherwise it says so
    on the command's stderr and exits :data:`NOT_PLACED_EXIT` without running
    anything (docs/design/security.md §8).
    """
    try:
        os.setpgid(0, 0)
        fresh_signals(list(req["ignored"]), list(req["sigmask"]))
        os.fchdir(fds[-1])
        os.close(fds[-1])
        conn = place_fds(conn, fds[:-1], list(req["fds"]))
        apply_process(req)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        _refuse(conn, f"cannot set up the command's process: {exc}")
    try:
        conn.settimeout(None)
        wire.send(conn, {"pid": os.getpid()})
        go, _ = wire.recv(conn)
    except (OSError, EOFError, wire.WireError):
        os._exit(0)
    if go.get("op") != "go":
        os._exit(0)
    conn.close()
    if pool_cgroup is not None and own_cgroup() in (pool_cgroup, ""):
        _say_unplaced()
    return Command(req, boot)


def _say_unplaced() -> None:
    try:
        os.write(2, b"krex: warm: this process was not placed by krexd: it runs nothing\n")
    finally:
        os._exit(NOT_PLACED_EXIT)


def _refuse(conn: socket.socket, why: str) -> None:
    try:
        wire.send(conn, {"error": why})
    finally:
        os._exit(0)


def _stream(fd: int, write: bool, name: str, enc: tuple[str, str], buffered: bool) -> Any:
    """One standard stream as CPython's ``create_stdio`` makes it (None for a closed fd)."""
    try:
        os.fstat(fd)
    except OSError:
        return None
    buffering = -1 if (buffered or not write) else 0
    buf: Any = open(fd, "wb" if write else "rb", buffering=buffering, closefd=False)
    raw = buf.raw if buffering else buf
    raw.name = name
    line = buffered and (raw.isatty() or fd == 2)
    text: Any = io.TextIOWrapper(
        buf, enc[0], enc[1], newline="\n", line_buffering=line, write_through=not buffered
    )
    text.mode = "w" if write else "r"
    return text


class Command:
    """The command the child runs: ``mode`` ``script``, ``module`` or ``code``, its ``target``."""

    def __init__(self, req: dict[str, Any], boot: Boot) -> None:
        self.mode = str(req["mode"])
        self.target = str(req["target"])
        self.args = [str(a) for a in req["args"]]
        self.orig_argv = [str(a) for a in req["argv"]]
        self.boot = boot

    def run(self) -> None:
        """Set up the interpreter as a cold start has it, then run the command (see module doc)."""
        main = self._prepare()
        try:
            if self.mode == "code":
                main.__loader__ = __import__("importlib.machinery").machinery.BuiltinImporter
                code = compile(self.target, "<string>", "exec", dont_inherit=True)
                exec(code, main.__dict__)
            elif self.mode == "module":
                __import__("runpy")._run_module_as_main(self.target)
            else:
                self._run_script(main)
        except BaseException as exc:
            if not isinstance(exc, SystemExit):
                self._report_without_us(main)
            raise
        if self.mode == "script":
            _forget_file(main)

    def _prepare(self) -> types.ModuleType:
        boot = self.boot
        for name in [n for n in sys.modules if n.startswith("krexpool_")]:
            del sys.modules[name]
        streams = [
            _stream(0, False, "<stdin>", boot.stdio[0], boot.buffered),
            _stream(1, True, "<stdout>", boot.stdio[1], boot.buffered),
            _stream(2, True, "<stderr>", boot.stdio[2], boot.buffered),
        ]
        sys.stdin, sys.stdout, sys.stderr = streams
        sys.__stdin__, sys.__stdout__, sys.__stderr__ = streams  # type: ignore[misc]
        first = {"script": "", "module": "-m", "code": "-c"}[self.mode]
        sys.argv = [self.target if self.mode == "script" else first, *self.args]
        sys.orig_argv = list(self.orig_argv)
        path0 = {
            "script": os.path.dirname(os.path.realpath(self.target)),
            "module": os.getcwd(),
            "code": "",
        }[self.mode]
        sys.path[:] = ([path0] if boot.prepends else []) + list(boot.base_path)
        __import__("importlib").invalidate_caches()
        numpy_random = sys.modules.get("numpy.random")
        if numpy_random is not None:  # its legacy global state was seeded in the zygote
            try:
                numpy_random.seed()
            except Exception:
                pass
        main = types.ModuleType("__main__")
        main.__dict__["__annotations__"] = {}
        main.__dict__["__builtins__"] = builtins
        sys.modules["__main__"] = main
        return main

    def _run_script(self, main: types.ModuleType) -> None:
        path = os.path.abspath(self.target)
        main.__dict__["__file__"] = path
        main.__dict__["__cached__"] = None
        machinery = __import__("importlib.machinery").machinery
        main.__loader__ = machinery.SourceFileLoader("__main__", path)
        try:
            with open(path, "rb") as f:
                source = f.read()
        except OSError as exc:
            sys.stderr.write(
                f"{self.orig_argv[0]}: can't open file {path!r}: "
                f"[Errno {exc.errno}] {exc.strerror}\n"
            )
            raise SystemExit(2) from None
        exec(compile(source, path, "exec", dont_inherit=True), main.__dict__)

    def _report_without_us(self, main: types.ModuleType) -> None:
        """Have the next uncaught-exception report skip the pool's own frames (once)."""
        original = sys.excepthook
        own = self.boot.own_files
        script = self.mode == "script"

        def hook(kind: type, value: BaseException, tb: types.TracebackType | None) -> None:
            sys.excepthook = original
            while tb is not None and tb.tb_frame.f_code.co_filename in own:
                tb = tb.tb_next
            value.__traceback__ = tb
            sys.last_traceback = tb
            try:
                original(kind, value, tb)
            finally:
                if script:  # CPython drops them after the report, before atexit
                    _forget_file(main)

        sys.excepthook = hook


def _forget_file(main: types.ModuleType) -> None:
    """What CPython does after running a script file: ``__file__``/``__cached__`` removed."""
    main.__dict__.pop("__file__", None)
    main.__dict__.pop("__cached__", None)
