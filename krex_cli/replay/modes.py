"""Replay modes and the krexd a krexd-backed mode runs under (paper §6.1 baselines).

native, serial, krex and ungated (docs/design/replay.md "Modes (paper
§6.1)"); a krexd-backed mode starts its own krexd, configured from the
shipped ``etc/krex.toml`` plus the mode's overrides, unless a running
krexd's socket is given.
"""

from __future__ import annotations

import math
import os
import re
import signal
import subprocess
import sys
import time
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from krex_client.connection import Connection, KrexUnavailable, RemoteError

MODES: tuple[str, ...] = ("native", "serial", "krex", "ungated")
# Config keys the overrides set: (table, key).
CONCURRENCY_KEY: tuple[str, str] = ("admission", "slots_per_gpu")
ENFORCE_KEY: tuple[str, str] = ("region", "enforce")


class ModeError(RuntimeError):
    """A mode cannot run (bad combination, krexd failed to start, ...)."""


@dataclass(frozen=True)
class Mode:
    """How one replay runs its commands.

    name: one of ``MODES``; concurrency: commands per GPU at once;
    uses_krexd: commands go through ``krex run``; enforce: regions enforced.
    """

    name: str
    concurrency: int
    uses_krexd: bool
    enforce: bool


def make_mode(name: str, concurrency: int) -> Mode:
    """The ``Mode`` for a ``--mode``/``--concurrency`` pair.

    native and serial run one command per GPU; asking them for another
    concurrency is an error rather than silently ignored.

    Raises:
        ModeError: unknown mode, concurrency < 1, or concurrency != 1 for
            native/serial.
    """
    if name not in MODES:
        raise ModeError(f"unknown mode {name!r}; expected one of {', '.join(MODES)}")
    if concurrency < 1:
        raise ModeError(f"--concurrency must be >= 1, got {concurrency}")
    if name in ("native", "serial") and concurrency != 1:
        raise ModeError(
            f"mode {name} runs one command per GPU; drop --concurrency "
            f"or set it to 1 (got {concurrency})"
        )
    return Mode(name, concurrency, uses_krexd=name != "native", enforce=name != "ungated")


# --- config -------------------------------------------------------------------------------


def default_base_config() -> Path | None:
    """The shipped config: ``etc/krex.toml`` of a source checkout, else /etc/krex/krex.toml."""
    here = Path(__file__).resolve().parents[2] / "etc" / "krex.toml"
    for p in (here, Path("/etc/krex/krex.toml")):
        if p.is_file():
            return p
    return None


def mode_config(base: Mapping[str, Any], mode: Mode, auto_slots: bool = False) -> dict[str, Any]:
    """``base`` (a parsed krexd config) with the mode's concurrency and enforce keys set.

    ``auto_slots``: the slots are ``"auto"`` (krexd derives them; the replay
    then takes them from its status), not the mode's concurrency.  Also
    ``[cgroup] name`` = ``krex-replay-<pid>``: the replay's krexd gets its own subtree.
    """
    cfg: dict[str, Any] = {k: (dict(v) if isinstance(v, Mapping) else v) for k, v in base.items()}
    # A cgroup subtree of its own, so a replay never touches a system krexd's tenants.
    cfg.setdefault("cgroup", {})
    if not isinstance(cfg["cgroup"], dict):
        raise ModeError("config key 'cgroup' must be a table")
    cfg["cgroup"]["name"] = f"krex-replay-{os.getpid()}"
    slots: int | str = "auto" if auto_slots else mode.concurrency
    for (table, key), value in ((CONCURRENCY_KEY, slots), (ENFORCE_KEY, mode.enforce)):
        section = cfg.setdefault(table, {})
        if not isinstance(section, dict):
            raise ModeError(f"config key '{table}' must be a table")
        section[key] = value
    return cfg


def _toml_value(v: Any, where: str) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if not math.isfinite(v):
            raise ModeError(f"config value {where} is not finite")
        return repr(v)
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
    if isinstance(v, list | tuple):
        return "[" + ", ".join(_toml_value(x, where) for x in v) + "]"
    raise ModeError(f"config value {where} of type {type(v).__name__} cannot be written")


def _toml_key(k: str) -> str:
    return k if re.fullmatch(r"[A-Za-z0-9_-]+", k) else _toml_value(k, k)


def dumps_toml(cfg: Mapping[str, Any], prefix: str = "") -> str:
    """Write a config (tables of scalars and lists, nested tables) as TOML text.

    Only the shapes krexd configs use; tomllib reads the result back equal.
    """
    scalars = [(k, v) for k, v in cfg.items() if not isinstance(v, Mapping)]
    tables = [(k, v) for k, v in cfg.items() if isinstance(v, Mapping)]
    lines = [f"{_toml_key(k)} = {_toml_value(v, prefix + k)}" for k, v in scalars]
    out = "\n".join(lines) + ("\n" if lines else "")
    for k, v in tables:
        name = f"{prefix}{_toml_key(k)}"
        body = dumps_toml(v, name + ".")
        out += f"\n[{name}]\n{body}"
    return out


def write_config(mode: Mode, path: Path, base_path: Path | None, auto_slots: bool = False) -> Path:
    """Write the krexd config of ``mode`` to ``path`` (base: ``base_path`` or none).

    ``auto_slots``: as :func:`mode_config`'s.
    """
    base: dict[str, Any] = {}
    if base_path is not None:
        try:
            base = tomllib.loads(base_path.read_text(encoding="utf-8"))
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ModeError(f"cannot read base config {base_path}: {exc}") from None
    path.write_text(dumps_toml(mode_config(base, mode, auto_slots)), encoding="utf-8")
    return path


# --- krexd process and commands --------------------------------------------------------


def _script(name: str) -> str | None:
    """The console script ``name`` installed beside this interpreter, if any."""
    beside = Path(sys.executable).parent / name
    return str(beside) if beside.is_file() and os.access(beside, os.X_OK) else None


def krexd_command() -> list[str]:
    """How to start krexd: its console script beside this Python, else ``python -m krexd``."""
    script = _script("krexd")
    return [script] if script else [sys.executable, "-m", "krexd"]


def krex_command() -> list[str]:
    """How to call ``krex``: its console script beside this Python, else its main()."""
    script = _script("krex")
    if script:
        return [script]
    return [sys.executable, "-c", "import sys; from krex_cli.main import main; sys.exit(main())"]


def package_pythonpath() -> list[str]:
    """Directories holding the krex_cli and krex_client packages (for commands' PYTHONPATH)."""
    dirs = [str(Path(__file__).resolve().parents[2])]
    try:
        import krex_client

        dirs.append(str(Path(krex_client.__file__).resolve().parents[1]))
    except ImportError:
        pass
    return dirs


def ping(socket_path: str, timeout_s: float = 1.0) -> dict[str, Any]:
    """Send the ``ping`` op to krexd (interfaces.md, control plane); returns its body.

    Uses :class:`krex_client.connection.Connection` (framing of krex_client.protocol).

    Raises:
        ModeError: krexd unreachable, no reply within ``timeout_s``, or an error reply.
    """
    try:
        with Connection(socket_path, timeout_s=timeout_s) as conn:
            return conn.request("ping")
    except KrexUnavailable as exc:
        raise ModeError(f"krexd did not answer ping: {exc}") from None
    except RemoteError as exc:
        raise ModeError(f"krexd ping failed: {exc}") from None


class Krexd:
    """A krexd started for one replay (``krexd --foreground``), stopped by ``stop()``."""

    def __init__(
        self,
        out_dir: Path,
        config: Path,
        fake_gpus: int | None,
        env: Mapping[str, str],
        start_timeout_s: float = 60.0,
    ) -> None:
        """Start krexd with socket ``out_dir/krexd.sock`` and wait until it answers ping.

        Args:
            out_dir: replay output directory (socket, gate files, krexd.log).
            config: generated config path; fake_gpus: ``--fake-gpus N`` or None.
            env: environment of krexd; start_timeout_s: how long to wait (s).
        Raises:
            ModeError: krexd exited or did not answer in time (log tail included).
        """
        self.socket = str(out_dir / "krexd.sock")
        self.log_path = out_dir / "krexd.log"
        argv = krexd_command() + ["--foreground", "--socket", self.socket, "--config", str(config)]
        if fake_gpus is not None:
            argv += ["--fake-gpus", str(fake_gpus)]
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            argv,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=dict(env),
            start_new_session=True,
        )
        deadline = time.monotonic() + start_timeout_s
        while True:
            if self.proc.poll() is not None:
                self._log.close()
                raise ModeError(
                    f"krexd exited with code {self.proc.returncode} at start; "
                    f"log:\n{self.log_tail()}"
                )
            if os.path.exists(self.socket):
                try:
                    ping(self.socket, 0.5)
                    return
                except ModeError:
                    pass
            if time.monotonic() > deadline:
                self.stop()
                raise ModeError(
                    f"krexd did not answer within {start_timeout_s} s; log:\n{self.log_tail()}"
                )
            time.sleep(0.1)

    def log_tail(self, n: int = 4000) -> str:
        """The last ``n`` characters of krexd's log."""
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def stop(self, timeout_s: float = 15.0) -> int | None:
        """SIGTERM krexd, SIGKILL after ``timeout_s``; returns its exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if not self._log.closed:
            self._log.close()
        return self.proc.returncode


def command_env(base: Mapping[str, str], python_path: Sequence[str]) -> dict[str, str]:
    """``base`` with ``python_path`` dirs prepended to PYTHONPATH."""
    env = dict(base)
    parts = list(python_path) + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(parts))
    return env
