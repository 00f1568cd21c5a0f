"""``krex replay``: replay a benchmarking-command trace in one mode, or report on runs.

    krex replay TRACE --mode native|serial|krex|ungated [--concurrency N] --out DIR
                [--duration S] [--repeat K] [--gpus 0,1,...] [--fake-gpus N]
                [--socket PATH] [--config PATH] [--python PATH] [--cwd DIR]
                [--timeout S] [--warm auto|off|on|alternate] [--no-progress]
                [--no-report]
    krex replay TRACE --mode krex --ray ADDRESS --out DIR [--duration S] [--repeat K] ...
    krex replay report DIR... --out REPORT_DIR

A run writes DIR/results.jsonl and DIR/meta.json, then (unless
--no-report) a report in DIR/report comparing it with every other run
directory under DIR's parent.  In the krex and ungated modes --concurrency
defaults to krexd's slots per GPU: a running krexd's (--socket, from its
status), else [admission] slots_per_gpu of the config the started krexd
gets (--config or the shipped one); the replay says which it took.
--ray ADDRESS spreads the commands over the krex hosts of a Ray cluster
(each host's krexd and its configuration enforce; the report adds each
host's and the cluster's cmds/min); --python and --cwd must then name the
same paths on every host.

Under krexd (also each host's, with --ray), commands start as a plain
krex run starts them: from a warm pool or cold as that krexd's [warm]
start says (warm as shipped; --warm auto, the default).  --warm off starts
every command cold (krex run --cold), on asks for warm (krex run --warm),
alternate runs every other command warm and the others cold; the report
compares their start-up times.
Exit codes: 0 done (even when some commands
failed: see the results), 1 the replay could not run (bad trace or
arguments, krexd failed), 130 interrupted.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from krex_cli import argtypes, help_text
from krex_cli.replay import modes, starts
from krex_cli.replay.daemon_info import daemon_gpus, default_concurrency
from krex_cli.replay.options import RunOptions
from krex_cli.replay.trace import TraceError, load

if TYPE_CHECKING:
    from krex_cli.replay.runner import Runner

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_INTERRUPTED = 130


def _gpu_list(text: str) -> list[int]:
    try:
        gpus = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        msg = f"--gpus wants comma-separated indices, got {text!r}"
        raise argparse.ArgumentTypeError(msg) from None
    if not gpus or len(set(gpus)) != len(gpus) or not all(0 <= g <= argtypes.MAX_GPU for g in gpus):
        raise argparse.ArgumentTypeError(
            f"--gpus wants distinct indices in [0, {argtypes.MAX_GPU}], got {text!r}"
        )
    return gpus


MAX_CONCURRENCY = 1024
"""The most commands per GPU (krexd's ``[admission] slots_per_gpu`` is at most 1024)."""

MAX_FAKE_GPUS = 64
"""The most simulated GPUs a replay asks its krexd for."""


def configure(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the replay arguments to ``p`` (in the order ``--help`` lists them)."""
    _add_run_arguments(p)
    _add_placement_arguments(p)
    _add_command_arguments(p)
    return p


def _add_run_arguments(p: argparse.ArgumentParser) -> None:
    """What to replay, in which mode, for how long, and where results go."""
    p.add_argument(
        "target",
        metavar="TRACE",
        help="trace file (JSONL), or the word 'report' followed by run directories",
    )
    p.add_argument("dirs", nargs="*", metavar="DIR", help="run directories (report only)")
    p.add_argument(
        "--out", type=Path, required=True, help="output directory (a run's results, or the report)"
    )
    p.add_argument("--mode", choices=modes.MODES, help="how to run the commands")
    p.add_argument(
        "--concurrency",
        type=argtypes.integer(1, MAX_CONCURRENCY, "a count"),
        default=None,
        help="commands per GPU at once (krex, ungated; default: krexd's slots per GPU, "
        "from --socket's status or the config's [admission] slots_per_gpu; said on stderr)",
    )
    p.add_argument(
        "--duration",
        type=argtypes.seconds(),
        default=None,
        metavar="S",
        help="loop over the trace until S seconds are spent",
    )
    p.add_argument(
        "--repeat",
        type=argtypes.integer(1, argtypes.MAX_COUNT, "a count"),
        default=None,
        metavar="K",
        help="passes over the trace (default 1; with --duration, at most K)",
    )


def _add_placement_arguments(p: argparse.ArgumentParser) -> None:
    """Which GPUs and which krexd (started, or a running one) the replay uses."""
    p.add_argument(
        "--gpus", type=_gpu_list, default=None, help="GPU indices to use, e.g. 0,1 (default: all)"
    )
    p.add_argument(
        "--fake-gpus",
        type=argtypes.integer(1, MAX_FAKE_GPUS, "a count"),
        default=None,
        metavar="N",
        help="simulated GPUs (passed to the started krexd; native uses 0..N-1)",
    )
    p.add_argument(
        "--socket",
        default=None,
        help="use the krexd running at this socket instead of starting one",
    )
    p.add_argument(
        "--config",
        type=Path,
        default=None,
        help="base krexd config (default: the shipped etc/krex.toml)",
    )
    p.add_argument(
        "--ray",
        metavar="ADDRESS",
        default=None,
        help="run the commands over this Ray cluster's krex hosts (mode krex; each host's "
        "krexd decides slots and regions)",
    )


def _add_command_arguments(p: argparse.ArgumentParser) -> None:
    """How each command runs (interpreter, directory, time limit) and what is printed."""
    p.add_argument(
        "--python",
        default=sys.executable,
        help="interpreter for commands whose argv[0] is python/python3",
    )
    p.add_argument(
        "--cwd",
        type=Path,
        default=Path.cwd(),
        help="working directory of the commands (default: current)",
    )
    p.add_argument(
        "--timeout",
        type=argtypes.seconds(),
        default=600.0,
        metavar="S",
        help="per-command time limit (default 600 s)",
    )
    p.add_argument(
        "--warm",
        choices=starts.WARM_CHOICES,
        default=starts.DEFAULT,
        help="how krexd-backed modes start commands: auto (default: as krexd's [warm] "
        "start says, as a plain krex run does; warm as shipped), off (krex run --cold), "
        "on (krex run --warm), or alternate warm and cold to compare them in one run",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--no-report", action="store_true", help="skip the report after a run")


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``replay`` on the ``krex`` CLI's subparsers (dispatch to ``main``)."""
    p = subparsers.add_parser(
        "replay",
        help="replay a benchmarking-command trace in one mode, or report on runs",
        description=help_text(__doc__),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    configure(p)
    p.set_defaults(func=main)


def build_parser(prog: str = "krex replay") -> argparse.ArgumentParser:
    """A standalone parser (``python -m krex_cli.replay``)."""
    return configure(
        argparse.ArgumentParser(
            prog=prog,
            description=help_text(__doc__),
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
    )


def count_gpus() -> int:
    """Number of NVIDIA GPUs ``nvidia-smi -L`` lists (0 when it is missing or fails)."""
    try:
        out = subprocess.run(
            ["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return 0
    if out.returncode != 0:
        return 0
    return sum(1 for line in out.stdout.splitlines() if line.startswith("GPU "))


def _err(msg: str) -> int:
    print(f"krex replay: {msg}", file=sys.stderr)
    return EXIT_ERROR


def _report(args: argparse.Namespace) -> int:
    from krex_cli.replay.report import ReportError, generate

    if not args.dirs:
        return _err("report needs at least one run directory")
    if args.mode is not None or args.concurrency is not None:
        return _err("report takes run directories and --out only")
    try:
        md = generate([Path(d) for d in args.dirs], args.out)
    except ReportError as exc:
        return _err(str(exc))
    print(f"report: {md}")
    return EXIT_OK


def _gpus(args: argparse.Namespace) -> list[int] | int:
    """The GPU indices a run uses, or an exit code after saying why there are none."""
    if args.gpus is not None:
        return list(args.gpus)
    if args.fake_gpus is not None:
        return list(range(args.fake_gpus))
    if args.socket is not None:
        gpus = daemon_gpus(args.socket)  # the running krexd's GPUs
        return gpus or _err(f"the krexd at {args.socket} reports no GPU; pass --gpus")
    gpus = list(range(count_gpus()))
    return gpus or _err("no GPU found (nvidia-smi -L); pass --gpus or --fake-gpus")


def _ray_conflict(args: argparse.Namespace) -> str | None:
    """Why ``--ray`` cannot go with the other arguments, or None."""
    if args.mode != "krex":
        return "--ray runs mode krex only (each host's krexd configuration decides the rest)"
    given = [
        flag
        for flag, value in (
            ("--socket", args.socket),
            ("--fake-gpus", args.fake_gpus),
            ("--gpus", args.gpus),
            ("--concurrency", args.concurrency),
            ("--config", args.config),
        )
        if value is not None
    ]
    if given:
        return f"{', '.join(given)}: not with --ray (the hosts' krexds decide GPUs and slots)"
    return None


def main(args: argparse.Namespace) -> int:
    """Run ``krex replay`` with parsed ``args``; returns the exit code."""
    if args.target == "report":
        return _report(args)
    if args.dirs:
        return _err(f"unexpected arguments after the trace: {' '.join(args.dirs)}")
    if args.mode is None:
        return _err("--mode is required (native, serial, krex or ungated)")
    if args.ray is not None and (why := _ray_conflict(args)) is not None:
        return _err(why)
    try:
        opts = _options(args)
        if isinstance(opts, int):
            return opts
        results = _runner(opts).run()
    except (TraceError, modes.ModeError) as exc:
        return _err(str(exc))
    except KeyboardInterrupt:
        print("krex replay: interrupted; partial results kept", file=sys.stderr)
        return EXIT_INTERRUPTED
    print(f"results: {results}")
    if opts.ray_address is not None:
        _print_hosts(opts.out)
    if not args.no_report:
        from krex_cli.replay.report import find_runs, generate

        out = args.out.resolve()
        dirs = find_runs(out.parent)
        if out not in dirs:
            dirs.append(out)
        print(f"report: {generate(dirs, out / 'report')}")
    return EXIT_OK


def _options(args: argparse.Namespace) -> RunOptions | int:
    """The run's ``RunOptions``, or an exit code after saying why there are none.

    Raises TraceError (a bad trace) and ModeError (a bad mode or concurrency).
    """
    trace_path = Path(args.target)
    entries = load(trace_path)
    modes.make_mode(args.mode, args.concurrency or 1)  # a bad combination fails first
    gpus = [] if args.ray is not None else _gpus(args)
    if isinstance(gpus, int):
        return gpus
    base = args.config if args.config is not None else modes.default_base_config()
    if args.config is not None and not args.config.is_file():
        return _err(f"--config {args.config}: no such file")
    concurrency = args.concurrency
    slots_from_krexd = False
    if concurrency is None and args.ray is None:
        concurrency, note = default_concurrency(args.mode, args.socket, gpus, base)
        slots_from_krexd = concurrency is None  # "auto": asked of the krexd once started
        if note is not None:
            print(f"krex replay: {note}", file=sys.stderr)
    mode = modes.make_mode(args.mode, concurrency or 1)
    if args.socket is not None and not mode.uses_krexd:
        return _err("--socket applies to the krexd-backed modes only")
    if args.warm in ("on", "alternate") and not mode.uses_krexd:
        return _err(f"--warm {args.warm} applies to the krexd-backed modes only")
    return RunOptions(
        trace=entries,
        trace_path=trace_path.resolve(),
        mode=mode,
        out=args.out.resolve(),
        gpus=gpus,
        pin_gpus=args.gpus is not None,
        duration_s=args.duration,
        repeat=args.repeat,
        python=args.python,
        cwd=args.cwd.resolve(),
        timeout_s=args.timeout,
        socket=args.socket,
        fake_gpus=args.fake_gpus,
        base_config=base,
        progress=not args.no_progress,
        warm=args.warm,
        slots_from_krexd=slots_from_krexd,
        ray_address=args.ray,
    )


def _runner(opts: RunOptions) -> Runner:
    """The runner of ``opts``: over a Ray cluster (``--ray``) or on this host."""
    if opts.ray_address is not None:
        from krex_cli.replay.ray_runner import RayRunner

        return RayRunner(opts)
    from krex_cli.replay.runner import Runner

    return Runner(opts)


def _print_hosts(out: Path) -> None:
    """Each host's and the cluster's cmds/min of the run in ``out`` (``--ray``)."""
    import json

    from krex_cli.replay import hosts
    from krex_cli.replay.results import META, RESULTS, load_results

    meta = json.loads((out / META).read_text(encoding="utf-8"))
    for line in hosts.lines(hosts.summarize(load_results(out / RESULTS), meta)):
        print(f"throughput {line}")
