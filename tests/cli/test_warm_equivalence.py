"""A warm start cannot be told from a cold one: each item run both ways, the outputs compared.

Real krexd, real cgroups, real pools (modules: json).  The probe
(progs/warm_probe.py) prints what a command sees of its start — argv,
``__main__``, ``sys.path``, cwd, umask, limits, ids, environment, file
descriptors, standard streams and their buffering, signal dispositions and
mask, its cgroup at its first line — run as a script, as ``-m`` and as
``-c``; other tests compare exit codes, tracebacks, ``atexit``, output
order, signals and a terminal.  What still differs by design is listed in
docs/design/warm.md and checked in test_warm_pools.py.
"""

from __future__ import annotations

import os
import pty
import select
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.cli.warm_support import PROBE, PROGS, PY, SERVED, Pools, diff, probe, warm_config
from tests.support.krexd import Krexd

pytestmark = pytest.mark.root
Factory = Callable[..., Krexd]


@pytest.fixture
def pools(krexd_factory: Factory, tmp_path: Path) -> Pools:
    """A krexd with pools of json, and this test's pool directory."""
    return Pools(krexd_factory(config=warm_config()), tmp_path)


def _both(pools: Pools, argv: list[str], **kw: object) -> tuple[dict[str, object], ...]:
    cold = probe(pools.cold(argv, **kw))  # type: ignore[arg-type]
    warm = probe(pools.warm(argv, **kw))  # type: ignore[arg-type]
    return cold, warm


def test_a_script_sees_what_a_cold_start_sees(pools: Pools, tmp_path: Path) -> None:
    pools.ready()
    work = tmp_path / "work"
    (work / "sub").mkdir(parents=True)
    link = work / "probe_link.py"
    link.symlink_to(PROBE)  # sys.path[0] is the real file's directory, __file__ the link
    extra = os.open(os.devnull, os.O_RDONLY)  # an inheritable descriptor krex run holds
    os.set_inheritable(extra, True)
    try:
        cold, warm = _both(
            pools,
            [PY, "probe_link.py", "a b", "--x"],
            cwd=work,
            pass_fds=(extra,),
            input="stdin text\n",
        )
    finally:
        os.close(extra)
    assert diff(cold, warm) == {}
    assert warm["argv"] == ["probe_link.py", "a b", "--x"]
    assert warm["path"][0] == str(PROGS)
    assert str(extra) in warm["fds"]
    assert warm["main"]["__file__"] == repr(str(link))  # type: ignore[index]


def test_module_and_code_modes(pools: Pools) -> None:
    pools.ready()
    cold, warm = _both(pools, [PY, "-m", "warm_probe", "m1"], cwd=PROGS)
    assert diff(cold, warm) == {}
    assert warm["argv"] == [str(PROBE), "m1"] and warm["path"][0] == str(PROGS)  # type: ignore[index]
    assert warm["main"]["__spec__"] == ["warm_probe", str(PROBE)]  # type: ignore[index]
    code = PROBE.read_text()
    cold, warm = _both(pools, [PY, "-c", code, "c1"])
    assert diff(cold, warm) == {}
    assert warm["argv"] == ["-c", "c1"] and warm["path"][0] == ""  # type: ignore[index]


def test_interpreter_options_and_unbuffered_output(pools: Pools) -> None:
    env = dict(pools.env, PYTHONUNBUFFERED="1")
    flags = ("-B", "-W", "error::DeprecationWarning", "-X", "utf8")
    pools.ready(flags, env)
    cold, warm = _both(pools, [PY, *flags, str(PROBE)], env=env)
    assert diff(cold, warm) == {}
    stdout = warm["stdio"][1]  # type: ignore[index]
    assert stdout["write_through"] is True and stdout["buffer"] == "FileIO"
    assert "error" in str(warm["warnings"])


def test_umask_limits_and_closed_stdin(pools: Pools) -> None:
    pools.ready()

    def limited() -> None:
        os.umask(0o027)
        import resource

        resource.setrlimit(resource.RLIMIT_NOFILE, (200, 300))
        os.close(0)

    cold = probe(pools.cold([PY, str(PROBE)], preexec_fn=limited, stdin=None))
    warm = probe(pools.warm([PY, str(PROBE)], preexec_fn=limited, stdin=None))
    assert diff(cold, warm) == {}
    assert warm["umask"] == "0027" and warm["rlimits"]["RLIMIT_NOFILE"] == [200, 300]  # type: ignore[index]
    assert warm["stdio"][0] is None  # type: ignore[index]


_EXITS = {
    "sys_exit_code": "import sys; print('out'); sys.exit(3)",
    "sys_exit_text": "import sys; sys.exit('bye: text')",
    "uncaught": "def f():\n    raise ValueError('boom')\nprint('before')\nf()",
    "syntax_error": "x = (",
    "keyboard_interrupt": "raise KeyboardInterrupt",
    "signal_death": "import os, signal; os.kill(os.getpid(), signal.SIGTERM)",
    "os_exit": "import os, sys; sys.stdout.write('lost'); os._exit(5)",
    "atexit": (
        "import atexit, sys\n"
        "atexit.register(lambda: print('atexit', getattr(sys.modules['__main__'], "
        "'__file__', '-')))\n"
        "print('main')"
    ),
    "atexit_after_error": (
        "import atexit\natexit.register(lambda: print('atexit ran'))\nraise RuntimeError('x')"
    ),
    "interleaved": (
        "import sys\nfor i in range(3):\n    print('out', i)\n    print('err', i, file=sys.stderr)"
    ),
}


@pytest.mark.parametrize("name", sorted(_EXITS))
def test_exit_codes_tracebacks_atexit_and_output(pools: Pools, tmp_path: Path, name: str) -> None:
    script = tmp_path / f"{name}.py"
    script.write_text(_EXITS[name] + "\n")
    pools.ready()
    for argv in ([PY, str(script)], [PY, "-c", _EXITS[name]]):
        cold = pools.cold(argv)
        warm = pools.warm(argv)
        assert (warm.returncode, warm.stdout, warm.stderr) == (
            cold.returncode,
            cold.stdout,
            cold.stderr,
        ), argv
    expected = {"sys_exit_code": 3, "keyboard_interrupt": 130, "signal_death": 143, "os_exit": 5}
    assert warm.returncode == expected.get(name, warm.returncode)


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGTERM, 3), (signal.SIGINT, 4)])
def test_signals_to_krex_run_reach_the_command(
    pools: Pools, tmp_path: Path, sig: int, code: int
) -> None:
    pools.ready()
    ready = tmp_path / "ready"
    prog = (
        "import signal, sys, time, pathlib\n"
        "signal.signal(signal.SIGTERM, lambda *a: sys.exit(3))\n"
        "signal.signal(signal.SIGINT, lambda *a: sys.exit(4))\n"
        f"pathlib.Path({str(ready)!r}).write_text('x')\n"
        "time.sleep(60)\n"
    )
    for start in ("--cold", "--warm"):
        run = subprocess.Popen(
            [*pools.k.krex, "run", start, "-v", "--", PY, "-c", prog],
            env=pools.env,
            stderr=subprocess.PIPE,
            text=True,
        )
        deadline = time.monotonic() + 20
        while not ready.exists():
            assert time.monotonic() < deadline
            time.sleep(0.02)
        run.send_signal(sig)
        _, err = run.communicate(timeout=20)
        assert run.returncode == code, (start, err)
        assert (SERVED in err) == (start == "--warm")
        ready.unlink()


def _on_a_terminal(pools: Pools, start: str) -> dict[str, object]:
    master, slave = pty.openpty()
    try:
        opts = [start, "-v"] if start == "--warm" else [start]
        run = subprocess.Popen(
            [*pools.k.krex, "run", *opts, "--", PY, str(PROBE)],
            env=pools.env,
            stdin=slave,
            stdout=slave,
            stderr=subprocess.PIPE,
            text=True,
        )
        os.close(slave)
        out = b""
        while True:
            ready, _, _ = select.select([master], [], [], 30)
            assert ready, "no output from the command on the terminal"
            try:
                chunk = os.read(master, 65536)
            except OSError:
                break
            if not chunk:
                break
            out += chunk
        assert run.wait(30) == 0
        assert run.stderr is not None
        assert (SERVED in run.stderr.read()) == (start == "--warm")
    finally:
        os.close(master)
    line = out.decode().replace("\r\n", "\n").strip().splitlines()[-1]
    return probe(subprocess.CompletedProcess([], 0, line, ""))


def test_a_terminal_gives_line_buffering_as_cold(pools: Pools) -> None:
    pools.ready()
    cold = _on_a_terminal(pools, "--cold")
    warm = _on_a_terminal(pools, "--warm")
    assert diff(cold, warm) == {}
    stdout = warm["stdio"][1]  # type: ignore[index]
    assert stdout["isatty"] is True and stdout["line_buffering"] is True


def test_stdin_and_binary_output_are_the_commands_own(pools: Pools) -> None:
    pools.ready()
    prog = (
        "import sys\n"
        "data = sys.stdin.read()\n"
        "sys.stdout.write(data.upper())\n"
        "sys.stdout.buffer.write(b'\\xff\\n')\n"
        "print('é', file=sys.stderr)\n"
    )
    got = []
    for start in (["--cold"], ["--warm", "-v"]):
        p = subprocess.run(
            [*pools.k.krex, "run", *start, "--", PY, "-c", prog],
            env=pools.env,
            input=b"line one\nline two\n",
            capture_output=True,
            timeout=60,
        )
        err = b"".join(
            ln for ln in p.stderr.splitlines(keepends=True) if not ln.startswith(b"krex: warm: ")
        )
        assert (SERVED.encode() in p.stderr) == ("--warm" in start)
        got.append((p.returncode, p.stdout, err))
    assert got[0] == got[1]  # the same order of the text and binary layers' output too
    assert sorted(got[1][1].splitlines()) == [b"LINE ONE", b"LINE TWO", b"\xff"]
    assert got[1][2] == "é\n".encode()
