"""What one replay runs (``RunOptions``) and each command's argv and environment under it.

Moved out of ``runner.py`` (which runs the commands) to keep that module
to scheduling, workers and recording.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from krex_cli.replay import modes
from krex_cli.replay.trace import TraceEntry


@dataclass
class RunOptions:
    """What one replay runs.

    trace: the commands; trace_path: where they came from; mode: how to run;
    out: output directory; gpus: GPU indices to use; pin_gpus: pass
    ``--gpu`` to ``krex run`` (when the GPUs were named explicitly);
    duration_s: loop the trace until this many seconds are spent (None: no
    loop); repeat: passes over the trace (None: 1, or unbounded with
    duration_s; with duration_s an upper bound);
    python: interpreter substituted for argv[0] "python"/"python3"; cwd:
    commands' working directory; timeout_s: per-command limit (s);
    socket: a running krexd to use instead of starting one; fake_gpus: pass
    ``--fake-gpus N`` to the started krexd; base_config: krexd config the
    mode overrides; progress: show a progress bar; warm: ``auto`` (no start
    flag: krexd's ``[warm] start`` decides), ``off`` (``krex run --cold``), ``on``
    (``--warm``) or ``alternate`` (``krex_cli.replay.starts``); ray_address: run the
    commands over this Ray cluster's krex hosts instead (``ray_runner.py``;
    no krexd is started, ``gpus`` is empty); slots_from_krexd: ``mode``'s
    concurrency is a placeholder, to be the started krexd's derived slots
    (``daemon_info.started_slots``).
    """

    trace: Sequence[TraceEntry]
    trace_path: Path
    mode: modes.Mode
    out: Path
    gpus: Sequence[int]
    pin_gpus: bool = False
    duration_s: float | None = None
    repeat: int | None = None
    python: str = sys.executable
    cwd: Path = field(default_factory=Path.cwd)
    timeout_s: float = 600.0
    socket: str | None = None
    fake_gpus: int | None = None
    base_config: Path | None = None
    progress: bool = True
    warm: str = "auto"
    ray_address: str | None = None
    slots_from_krexd: bool = False


def resolve_argv(argv: Sequence[str], python: str) -> list[str]:
    """argv with a leading "python"/"python3" replaced by ``python``."""
    out = list(argv)
    if out[0] in ("python", "python3"):
        out[0] = python
    return out


def command(
    opts: RunOptions,
    entry: TraceEntry,
    gpu: int,
    socket: str | None,
    start: Sequence[str] = (),
) -> tuple[list[str], dict[str, str]]:
    """(argv, env) of one trace command on GPU ``gpu``.

    native: the command itself with ``CUDA_VISIBLE_DEVICES=gpu``; in a mode that
    uses krexd (``socket`` required): ``krex run [--gpu G] [--mem M] [START] --
    ARGV`` with ``KREX_SOCKET``; ``start``: the start options
    (``krex_cli.replay.starts.run_flags``).  The caller's ``KREX_*`` variables
    are dropped.
    """
    argv = resolve_argv(entry.argv, opts.python)
    base = {k: v for k, v in os.environ.items() if not k.startswith("KREX_")}
    env = modes.command_env(base, modes.package_pythonpath())
    if not opts.mode.uses_krexd:
        env["CUDA_VISIBLE_DEVICES"] = str(gpu)
        return argv, env
    assert socket is not None
    env["KREX_SOCKET"] = socket
    pin = ["--gpu", str(gpu)] if opts.pin_gpus else []
    mem = entry.extra.get("mem")  # the command's declared GPU memory need, e.g. "8G"
    if isinstance(mem, str) and mem:
        pin += ["--mem", mem]
    pin += start
    return modes.krex_command() + ["run", *pin, "--", *argv], env
