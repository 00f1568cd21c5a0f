"""Can a pool serve this command, and which pool: the Python command line, the pool key.

``krex run --warm`` asks :func:`make_plan`: a Python interpreter running a
script, ``-m`` or ``-c`` with options a pool reproduces, and the key over
everything a module could see at import time; anything else is a reason (a
string) to start cold.  docs/design/warm.md "A warm command, step by step"
(2) and "The pool key and the pool's environment".
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from krex_cli import __version__

_PYTHON_NAME = re.compile(r"^python(\d+(\.\d+)*)?$")
#: Interpreter options without an argument that a pool reproduces (it runs with them).
_PLAIN_OPTIONS = frozenset("bBdEIOPqRsSu")
#: ``-X`` options whose effect a pool cannot reproduce for a command.
_UNSUPPORTED_X = frozenset({"importtime", "showrefcount"})
#: Variables that change how the interpreter runs a command, which a pool cannot replay.
_UNSUPPORTED_ENV = ("PYTHONINSPECT", "PYTHONPROFILEIMPORTTIME", "PYTHONVERBOSE")
#: Set only in the zygote's environment (libkrex_shim: skip initialisation at load).
DEFER_VAR = "KREX_SHIM_DEFER"
#: krex variables an interpreter acts on at start (krex_client-autoregion.pth, or
#: krex_client's import): kept in the pool's environment, and in its key.
STARTUP_VARS = ("KREX_AUTOREGION",)


@dataclass(frozen=True)
class Settings:
    """krexd's ``[warm]`` settings, as ``ping`` reports them (``warm``)."""

    enabled: bool = False
    modules: tuple[str, ...] = ()
    idle_s: float = 600.0
    key_prefixes: tuple[str, ...] = ()
    key_names: tuple[str, ...] = ()
    start: str = "cold"  # without --warm/--cold ("cold" from a krexd that does not say)
    cold_reasons: bool = False  # krexd counts cold starts by reason (place's "cold" field)
    serve: bool = True  # try a pool for this command (False: --cold, or [warm] start = "cold")

    @classmethod
    def from_ping(cls, about: Mapping[str, Any]) -> Settings:
        """The settings in a ``ping`` reply (disabled when krexd has none: an older krexd)."""
        warm = about.get("warm")
        if not isinstance(warm, dict):
            return cls()
        return cls(
            enabled=bool(warm.get("enabled")),
            start="warm" if warm.get("start") == "warm" else "cold",
            modules=tuple(str(m) for m in warm.get("modules") or ()),
            idle_s=float(warm.get("idle_s") or 600.0),
            key_prefixes=tuple(str(p) for p in warm.get("key_prefixes") or ()),
            key_names=tuple(str(n) for n in warm.get("key_names") or ()),
            cold_reasons=warm.get("cold_reasons") is True,
        )


@dataclass(frozen=True)
class PythonCommand:
    """A Python command line: ``mode`` is ``script``, ``module`` or ``code``.

    ``argv``: the whole command line as given; ``path``: the interpreter
    file it execs; ``flags``: its interpreter options, one token each
    (``-W`` and ``-X`` followed by their argument); ``target``: the script
    path, module name or program text; ``args``: what follows it.
    """

    argv: tuple[str, ...]
    path: str
    flags: tuple[str, ...]
    mode: str
    target: str
    args: tuple[str, ...]


@dataclass(frozen=True)
class Plan:
    """How a pool would run the command: its ``key``, the zygote's environment."""

    command: PythonCommand
    key: str
    zygote_env: dict[str, str]
    settings: Settings
    krexd_socket: str
    material: dict[str, Any] = field(default_factory=dict)


def parse_python(argv: Sequence[str], path: str) -> PythonCommand | str:
    """``argv`` as a :class:`PythonCommand`, or why a pool cannot run it (CPython's options)."""
    name = os.path.basename(path)
    real = os.path.basename(os.path.realpath(path))
    if not (_PYTHON_NAME.match(name) or _PYTHON_NAME.match(real)):
        return f"{argv[0]} is not a Python interpreter"
    flags: list[str] = []
    i = 1
    while i < len(argv):
        tok = argv[i]
        if tok == "--":
            i += 1
            break
        if tok == "-":
            return "the program is read from stdin"
        if not tok.startswith("-"):
            break
        if tok.startswith("--"):
            if tok != "--check-hash-based-pycs" or i + 1 >= len(argv):
                return f"interpreter option {tok}"
            flags += [tok, argv[i + 1]]
            i += 2
            continue
        step = _short_options(argv, i, flags)
        if isinstance(step, str):
            return step
        if isinstance(step, PythonCommand):
            return PythonCommand(tuple(argv), path, tuple(flags), step.mode, step.target, step.args)
        i = step
    if i >= len(argv):
        return "no program to run (an interactive interpreter)"
    return PythonCommand(tuple(argv), path, tuple(flags), "script", argv[i], tuple(argv[i + 1 :]))


def _short_options(argv: Sequence[str], i: int, flags: list[str]) -> int | str | PythonCommand:
    """Options of token ``argv[i]``: the next index, a refusal, or the ``-c``/``-m`` command."""
    tok = argv[i]
    j = 1
    while j < len(tok):
        c = tok[j]
        if c in _PLAIN_OPTIONS:
            flags.append(f"-{c}")
            j += 1
            continue
        if c not in "WXcm":
            return f"interpreter option -{c}"
        value = tok[j + 1 :]
        if not value:
            i += 1
            if i >= len(argv):
                return f"interpreter option -{c} without its argument"
            value = argv[i]
        if c in "cm":
            mode = "code" if c == "c" else "module"
            return PythonCommand((), "", (), mode, value, tuple(argv[i + 1 :]))
        if c == "X" and value.split("=", 1)[0] in _UNSUPPORTED_X:
            return f"interpreter option -X {value}"
        flags += [f"-{c}", value]
        return i + 1
    return i + 1


def _ignores_env(flags: Sequence[str]) -> bool:
    return "-E" in flags or "-I" in flags


def _check_environment(cmd: PythonCommand, env: Mapping[str, str]) -> str | None:
    if _ignores_env(cmd.flags):
        return None
    for var in _UNSUPPORTED_ENV:
        if env.get(var):
            return f"{var} is set"
    for entry in env.get("PYTHONPATH", "").split(os.pathsep) if env.get("PYTHONPATH") else []:
        if not os.path.isabs(entry):
            return f"PYTHONPATH has a relative entry {entry!r} (resolved against the cwd)"
    return None


def _check_script(target: str) -> str | None:
    """Why a pool cannot run the script file ``target`` as CPython would (None: it can)."""
    try:
        st = os.stat(target)
    except OSError as exc:
        return f"script {target}: {exc.strerror}"  # the cold interpreter says so itself
    if not stat.S_ISREG(st.st_mode):
        return f"script {target} is not a regular file"
    if target.endswith(".pyc"):
        return f"script {target} is compiled"
    try:
        if zipfile.is_zipfile(target):
            return f"script {target} is a zip archive"
    except OSError as exc:
        return f"script {target}: {exc.strerror}"
    return None


def _file_identity(path: str) -> list[Any]:
    try:
        st = os.stat(path)
    except OSError:
        return [path, None]
    return [os.path.realpath(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns]


def zygote_environ(env: Mapping[str, str], granted: Sequence[str]) -> dict[str, str]:
    """The pool's environment: the command's less what krexd sets per command, plus the deferral.

    ``granted``: the variables of krexd's ``admit`` reply; ``LD_PRELOAD``
    stays (the shim must be loaded in the zygote to be in its children).
    """
    drop = {k for k in granted if k != "LD_PRELOAD"}
    out = {
        k: v
        for k, v in env.items()
        if k not in drop and (not k.startswith("KREX_") or k in STARTUP_VARS)
    }
    out[DEFER_VAR] = "1"
    return out


def make_plan(
    argv: Sequence[str],
    path: str,
    env: Mapping[str, str],
    granted: Sequence[str],
    settings: Settings,
    krexd_socket: str,
) -> Plan | str:
    """The :class:`Plan` of ``argv`` (exec'd as ``path`` with ``env``), or why it runs cold."""
    if not settings.enabled:
        return "krexd's [warm] enabled = false (or krexd has no warm pools)"
    cmd = parse_python(argv, path)
    if isinstance(cmd, str):
        return cmd
    why = _check_environment(cmd, env)
    if why is None and cmd.mode == "script":
        why = _check_script(cmd.target)
    if why is not None:
        return why
    zenv = zygote_environ(env, granted)
    keyed = {
        k: v
        for k, v in sorted(zenv.items())
        if k in settings.key_names or k in STARTUP_VARS or k.startswith(settings.key_prefixes)
    }
    preload = [p for p in zenv.get("LD_PRELOAD", "").replace(" ", ":").split(":") if p]
    material = {
        "krex": __version__,
        "krexd": krexd_socket,
        "uid": os.getuid(),
        "interpreter": [path, *_file_identity(path)],
        "flags": list(cmd.flags),
        "modules": list(settings.modules),
        "preload": [_file_identity(p) for p in preload],
        "env": keyed,
    }
    digest = hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()
    return Plan(cmd, digest[:24], zenv, settings, krexd_socket, material)
