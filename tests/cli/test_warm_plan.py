"""Which commands a pool can run, the pool key, the pool's environment, the pool checks.

No krexd, no root: ``krex_cli.warm.plan``, ``krex_cli.warm.client.mismatch``,
the wire format, and the rule that the zygote's modules use the standard
library only (they run under the command's interpreter).
"""

from __future__ import annotations

import ast
import os
import socket
import sys
from pathlib import Path
from typing import Any

import pytest

from krex_cli import __version__
from krex_cli.warm import client, plan
from krex_cli.warm import krexpool_wire as wire

PY = sys.executable
WARM_DIR = Path(plan.__file__).resolve().parent
SETTINGS = plan.Settings(True, ("json",), 60.0, ("PYTHON", "TORCH", "LD_"), ("HOME",))
GRANTED = ["KREX_TENANT", "CUDA_VISIBLE_DEVICES", "LD_PRELOAD", "NCCL_NVLS_ENABLE"]


@pytest.mark.parametrize(
    ("argv", "mode", "target", "args", "flags"),
    [
        (["python3", "s.py", "-u", "x"], "script", "s.py", ["-u", "x"], []),
        (["python3", "-u", "-B", "s.py"], "script", "s.py", [], ["-u", "-B"]),
        (["python3", "-uB", "--", "-s.py"], "script", "-s.py", [], ["-u", "-B"]),
        (["python3", "-m", "pkg.mod", "-c", "x"], "module", "pkg.mod", ["-c", "x"], []),
        (["python3", "-mpkg"], "module", "pkg", [], []),
        (["python3", "-c", "print(1)", "a"], "code", "print(1)", ["a"], []),
        (["python3", "-uc", "print(1)"], "code", "print(1)", [], ["-u"]),
        (
            ["python3", "-W", "error", "-Xdev", "-OO", "s.py"],
            "script",
            "s.py",
            [],
            ["-W", "error", "-X", "dev", "-O", "-O"],
        ),
        (
            ["python3", "--check-hash-based-pycs", "never", "s.py"],
            "script",
            "s.py",
            [],
            ["--check-hash-based-pycs", "never"],
        ),
    ],
)
def test_python_command_lines(
    argv: list[str], mode: str, target: str, args: list[str], flags: list[str]
) -> None:
    cmd = plan.parse_python(argv, "/usr/bin/python3")
    assert isinstance(cmd, plan.PythonCommand), cmd
    assert (cmd.mode, cmd.target, list(cmd.args), list(cmd.flags)) == (mode, target, args, flags)
    assert cmd.argv == tuple(argv)


@pytest.mark.parametrize(
    ("argv", "path", "why"),
    [
        (["sh", "-c", "x"], "/bin/sh", "not a Python interpreter"),
        (["python3"], "/usr/bin/python3", "no program"),
        (["python3", "-"], "/usr/bin/python3", "read from stdin"),
        (["python3", "-i", "s.py"], "/usr/bin/python3", "option -i"),
        (["python3", "-v", "s.py"], "/usr/bin/python3", "option -v"),
        (["python3", "-X", "importtime", "s.py"], "/usr/bin/python3", "-X importtime"),
        (["python3", "--version"], "/usr/bin/python3", "option --version"),
        (["python3", "-c"], "/usr/bin/python3", "without its argument"),
    ],
)
def test_command_lines_a_pool_cannot_run(argv: list[str], path: str, why: str) -> None:
    got = plan.parse_python(argv, path)
    assert isinstance(got, str) and why in got


def _plan(argv: list[str], env: dict[str, str], settings: plan.Settings = SETTINGS) -> Any:
    return plan.make_plan(argv, PY, env, GRANTED, settings, "/run/krex/krexd.sock")


def _key(env: dict[str, str], argv: list[str] | None = None) -> str:
    made = _plan(argv or [PY, "-c", "pass"], env)
    assert isinstance(made, plan.Plan), made
    return made.key


def test_the_key_follows_what_imports_can_see_and_only_that() -> None:
    base = {"PATH": "/usr/bin", "HOME": "/h", "LD_PRELOAD": "/x/libkrex_shim.so"}
    key = _key(base)
    assert _key(dict(base)) == key  # stable
    for var, value in [
        ("TORCH_X", "1"),
        ("PYTHONHASHSEED", "1"),
        ("HOME", "/g"),
        ("LD_PRELOAD", ""),
    ]:
        assert _key({**base, var: value}) != key, var
    # Not keyed: other variables, and what krexd sets per command.
    assert _key({**base, "KREX_AUTOREGION": "1"}) != key  # acted on at interpreter start
    for var in ("MY_VAR", "KREX_TENANT", "KREX_TOKEN", "CUDA_VISIBLE_DEVICES", "NCCL_NVLS_ENABLE"):
        assert _key({**base, var: "other"}) == key, var
    assert _key(base, [PY, "-u", "-c", "pass"]) != key  # interpreter options
    assert _key(base, [PY, "-c", "other program"]) == key  # the program is not in the key
    other = plan.Settings(True, ("json", "csv"), 60.0, SETTINGS.key_prefixes, SETTINGS.key_names)
    made = _plan([PY, "-c", "pass"], base, other)
    assert isinstance(made, plan.Plan) and made.key != key  # the modules


def test_the_key_has_krex_s_version(monkeypatch: pytest.MonkeyPatch) -> None:
    key = _key({})
    monkeypatch.setattr(plan, "__version__", __version__ + ".next")
    assert _key({}) != key


def test_the_pool_environment() -> None:
    env = {
        "PATH": "/usr/bin",
        "LD_PRELOAD": "/x/libkrex_shim.so",
        "KREX_TENANT": "3",
        "KREX_SLOTS_FD": "9",
        "KREX_AUTOREGION": "1",
        "CUDA_VISIBLE_DEVICES": "GPU-1",
        "NCCL_NVLS_ENABLE": "0",
        "MY_VAR": "1",
    }
    made = _plan([PY, "-c", "pass"], env)
    assert isinstance(made, plan.Plan)
    assert made.zygote_env == {
        "PATH": "/usr/bin",
        "LD_PRELOAD": "/x/libkrex_shim.so",
        "MY_VAR": "1",
        "KREX_AUTOREGION": "1",
        "KREX_SHIM_DEFER": "1",
    }


def test_environments_and_files_a_pool_cannot_serve(tmp_path: Path) -> None:
    assert "enabled = false" in _plan([PY, "-c", "x"], {}, plan.Settings())
    assert "relative entry" in _plan([PY, "-c", "x"], {"PYTHONPATH": "/a:b"})
    assert "relative entry" in _plan([PY, "-c", "x"], {"PYTHONPATH": "/a::/b"})
    assert isinstance(_plan([PY, "-E", "-c", "x"], {"PYTHONPATH": "b"}), plan.Plan)  # ignored
    assert "PYTHONINSPECT" in _plan([PY, "-c", "x"], {"PYTHONINSPECT": "1"})
    (tmp_path / "c.pyc").write_bytes(b"\x00" * 16)
    (tmp_path / "z.py").write_bytes(b"PK\x05\x06" + b"\x00" * 18)  # an empty zip archive
    assert "compiled" in _plan([PY, str(tmp_path / "c.pyc")], {})
    assert "zip archive" in _plan([PY, str(tmp_path / "z.py")], {})
    assert "not a regular file" in _plan([PY, str(tmp_path)], {})
    assert "No such file" in _plan([PY, str(tmp_path / "none.py")], {})


def _hello(**over: Any) -> dict[str, Any]:
    import resource

    limits = {
        n: list(resource.getrlimit(getattr(resource, n)))
        for n in dir(resource)
        if n.startswith("RLIMIT_")
    }
    hello = {
        "version": __version__,
        "key": "k",
        "uid": os.getuid(),
        "euid": os.geteuid(),
        "gid": os.getgid(),
        "egid": os.getegid(),
        "groups": sorted(os.getgroups()),
        "rlimits": limits,
        "nice": os.getpriority(os.PRIO_PROCESS, 0),
    }
    hello.update(over)
    return hello


def test_a_pool_must_be_able_to_start_the_command_as_krex_run_would(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert client.mismatch(_hello(), __version__, "k") is None
    assert "runs krex 0.0.1" in str(client.mismatch(_hello(version="0.0.1"), __version__, "k"))
    assert "another key" in str(client.mismatch(_hello(), __version__, "other"))
    assert "uid" in str(client.mismatch(_hello(uid=os.getuid() + 1), __version__, "k"))
    assert "groups" in str(client.mismatch(_hello(groups=[12345]), __version__, "k"))
    # Unprivileged: no limit above the pool's hard limit, no nice value below the pool's.
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    hello = _hello(euid=1000)
    hello["rlimits"]["RLIMIT_NOFILE"] = [16, 32]
    assert "RLIMIT_NOFILE hard limit" in str(client.mismatch(hello, __version__, "k"))
    assert "nice" in str(client.mismatch(_hello(euid=1000, nice=19), __version__, "k"))


def test_the_wire_carries_messages_and_descriptors() -> None:
    a, b = socket.socketpair()
    r, w = os.pipe()
    try:
        wire.send(a, {"op": "run", "text": "é\udcff"}, [r, w])
        msg, fds = wire.recv(b, 4)
        assert msg == {"op": "run", "text": "é\udcff"} and len(fds) == 2
        os.write(fds[1], b"x")
        assert os.read(r, 1) == b"x"
        assert not os.get_inheritable(fds[0])  # received close-on-exec
        for fd in fds:
            os.close(fd)
        wire.send(a, {"op": "x"}, [r])
        with pytest.raises(wire.WireError, match="more file descriptors"):
            wire.recv(b, 0)  # more than the request may carry: refused, none leaked
        a.sendall(b"\x00\x00\x00\x05[1]")
        a.close()
        with pytest.raises(wire.WireError):
            wire.recv(b, 0)
    finally:
        for fd in (r, w):
            os.close(fd)
        b.close()


def _imports(node: ast.AST, typing_only: bool = False) -> list[tuple[str, bool]]:
    """(module, only under ``if TYPE_CHECKING:``) of every import below ``node``."""
    out: list[tuple[str, bool]] = []
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.Import):
            out.extend((a.name, typing_only) for a in child.names)
        elif isinstance(child, ast.ImportFrom) and child.module:
            out.extend((f"{child.module}.{a.name}", typing_only) for a in child.names)
        elif isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
            for sub in child.body:
                out.extend(_imports(ast.Module(body=[sub], type_ignores=[]), True))
            for sub in child.orelse:
                out.extend(_imports(ast.Module(body=[sub], type_ignores=[]), typing_only))
        else:
            out.extend(_imports(child, typing_only))
    return out


def test_the_zygote_runs_on_the_standard_library_alone() -> None:
    files = sorted(WARM_DIR.glob("krexpool_*.py"))
    assert len(files) == 4
    for path in files:
        for module, typing_only in _imports(ast.parse(path.read_text())):
            top, last = module.split(".")[0], module.split(".")[-1]
            ok = top in sys.stdlib_module_names or last.startswith("krexpool_") or typing_only
            assert ok, f"{path.name} imports {module}"
