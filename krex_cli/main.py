"""``krex``: the user's command.

    krex run [--gpu N] [--timeout S] [--exclusive] [--mem SIZE] [--label L]
             [--retry-tempfail N] [--fault-retries N] [--socket PATH] [--autoregion]
             [--region-log PATH] [--grant-log PATH] [--die-with PID]
             [--warm | --cold] [-v] -- CMD ARGS...
    krex replay TRACE --mode native|serial|krex|ungated ...   (see krex replay -h)
    krex ray-resources [--socket PATH] [--host NAME] [--exec -- ray start ...]

``krex run`` exits with CMD's own exit code; ``krex run --help`` lists its
other exit codes.
"""

from __future__ import annotations

import argparse
import os
import sys

from krex_cli import __version__, argtypes, help_text
from krex_cli import ray_resources as ray_resources_cli
from krex_cli.replay import cli as replay_cli
from krex_client.connection import default_socket
from krex_client.errors import ExitCode
from krex_client.sizes import parse_size

MAX_RETRIES = 100
"""The most re-runs ``--retry-tempfail`` and ``--fault-retries`` take."""

#: ``krex run``'s exit codes (its ``--help`` epilog); numbers from krex_client.errors.ExitCode.
RUN_EXIT_CODES = f"""\
exit codes:
  CMD's own     CMD ran and exited (0 included)
  128+N         signal N killed CMD (137 for SIGKILL)
  {ExitCode.TIMEOUT:<13} --timeout expired; CMD's process tree was killed
  {ExitCode.UNAVAILABLE:<13} krexd is unreachable, or it is shutting down
  {ExitCode.TEMPFAIL:<13} CMD failed after GPU out-of-memory errors its co-tenants caused
                (EX_TEMPFAIL: run it again; the failure is not the command's;
                --retry-tempfail N does so up to N times)
  {ExitCode.FAULT_CASUALTY:<13} CMD failed only because a co-tenant's kernel faulted the GPU under
                MPS, and its --fault-retries re-runs were used up
  {ExitCode.UNPROTECTABLE:<13} krexd ended CMD: it used the GPU where krex cannot drain it
                (no shim, an exec'd program without it) or tampered with its
                gate registrations (one line names the process and cause)
  {ExitCode.WRONG_GPU:<13} CMD tried to use another GPU than its own (the shim ended it)
  {ExitCode.CANNOT_EXEC:<13} CMD cannot be executed (a directory, permission denied)
  {ExitCode.NOT_FOUND:<13} CMD not found
  {ExitCode.DATAERR:<13} krexd refused the request (no such GPU, bad field)
  {ExitCode.NOPERM:<13} krexd refused the caller (authentication)
  {ExitCode.SOFTWARE:<13} internal error in krexd (see its log)
  {ExitCode.USAGE:<13} bad arguments to krex run
"""


_seconds = argtypes.seconds()
_gpu_index = argtypes.integer(0, argtypes.MAX_GPU, "a GPU index")
_pid = argtypes.integer(1, argtypes.MAX_PID, "a process id")
_retries = argtypes.integer(0, MAX_RETRIES, "a count")


def _size(text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _label(text: str) -> str:
    if not 0 < len(text) <= 512:
        raise argparse.ArgumentTypeError(f"must be 1 to 512 characters, got {len(text)}")
    return text


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``krex``."""
    p = argparse.ArgumentParser(
        prog="krex",
        description=help_text(__doc__),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--version", action="version", version=f"krex {__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    run = sub.add_parser(
        "run",
        help="run one command as a krex tenant",
        description="Run CMD on a GPU shared through krexd.",
        epilog=RUN_EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_run_placement(run)
    _add_run_memory(run)
    run.add_argument(
        "--socket",
        metavar="PATH",
        help="krexd's socket (default: $KREX_SOCKET or /run/krex/krexd.sock)",
    )
    _add_run_regions(run)
    _add_run_start(run)
    _add_run_launcher(run)
    run.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- CMD ARGS")
    replay_cli.add_parser(sub)
    ray_resources_cli.add_parser(sub)
    return p


def _add_run_placement(run: argparse.ArgumentParser) -> None:
    """``krex run``'s GPU choice, time limit and exclusivity."""
    run.add_argument("--gpu", type=_gpu_index, metavar="N", help="this GPU (default: least loaded)")
    run.add_argument(
        "--timeout",
        type=_seconds,
        metavar="S",
        help="kill CMD's process tree after S seconds (exit 124; at most 1000000)",
    )
    run.add_argument(
        "--exclusive",
        action="store_true",
        help="wait until the GPU has no tenants, then hold it alone, unshimmed",
    )


def _add_run_memory(run: argparse.ArgumentParser) -> None:
    """``krex run``'s GPU memory options: declared need, label, retries after co-tenant OOM."""
    run.add_argument(
        "--mem",
        type=_size,
        metavar="SIZE",
        help="GPU memory CMD needs (bytes, or e.g. 512M, 4G): admitted only where it fits "
        "(default: krexd's [memory] default_need)",
    )
    run.add_argument(
        "--label",
        type=_label,
        metavar="L",
        help="name CMD for learned memory needs: krexd charges it the peak earlier runs "
        "with this label used (default: the script and its arguments)",
    )
    run.add_argument(
        "--retry-tempfail",
        type=_retries,
        metavar="N",
        help="run CMD again, up to N times, when it exits 75 (failed by co-tenants' GPU "
        "memory), once its memory is free (default: krexd's [memory] retry_tempfail; 0 = never)",
    )
    run.add_argument(
        "--fault-retries",
        type=_retries,
        default=2,
        metavar="N",
        help="re-runs after GPU-wide faults under MPS that CMD did not cause (default 2; "
        "a suspect runs again without MPS, beside the others)",
    )


def _add_run_regions(run: argparse.ArgumentParser) -> None:
    """``krex run``'s region options: auto-regions and the region record."""
    # -- region options (auto-regions, the region record) --
    run.add_argument(
        "--autoregion",
        action="store_true",
        help="run triton.testing.do_bench, Triton's autotuner and torch.utils.benchmark.Timer "
        "measurements in critical regions (sets KREX_AUTOREGION=1 for CMD)",
    )
    run.add_argument(
        "--region-log",
        metavar="PATH",
        help="append one JSON line per critical region of CMD to PATH "
        "(sets KREX_REGION_LOG; docs/design/region-log.md)",
    )
    # -- end of region options --


def _add_run_start(run: argparse.ArgumentParser) -> None:
    """``krex run``'s start options: warm or cold, and what it says about it."""
    start = run.add_mutually_exclusive_group()
    start.add_argument(
        "--warm",
        action="store_true",
        help="start a Python CMD (python SCRIPT, -m MODULE, -c CODE) from a warm pool that "
        "imported krexd's [warm] modules already; anything a pool cannot serve starts "
        'cold (docs/design/warm.md). The default when krexd\'s [warm] start = "warm" '
        "(as shipped)",
    )
    start.add_argument(
        "--cold",
        action="store_true",
        help='start CMD in a fresh process (the default when krexd\'s [warm] start = "cold")',
    )
    run.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="say on stderr how CMD is started (why not warm) and, when stderr is not a "
        "terminal, where CMD waits in krexd's queue; also KREX_LOG=debug",
    )


def _add_run_launcher(run: argparse.ArgumentParser) -> None:
    """Options for programs that start ``krex run`` (a cluster's task): grants, parent death."""
    run.add_argument(
        "--grant-log",
        metavar="PATH",
        help="append one JSON line per admission (time, tenant, GPU, wait) to PATH "
        "(krex_cli/grantlog.py)",
    )
    run.add_argument(
        "--die-with",
        type=_pid,
        metavar="PID",
        help="get SIGKILL when the parent process PID ends (krexd then ends the command); "
        "exit 2 at once when PID is not (or no longer) the parent (krex_cli/parentdeath.py)",
    )


def _region_environ(args: argparse.Namespace) -> None:
    """``--autoregion`` and ``--region-log``: variables CMD inherits (krex run's environment)."""
    if args.autoregion:
        os.environ["KREX_AUTOREGION"] = "1"
    if args.region_log:
        os.environ["KREX_REGION_LOG"] = os.path.abspath(args.region_log)


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``krex``; returns the exit code.

    A subcommand's usage errors (unknown options, a bad value, no CMD) print
    that subcommand's usage, not krex's, and exit 2.
    """
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    sub = _subparser(parser, args.command)
    if extra:
        sub.error(f"unrecognized arguments: {' '.join(extra)}")
    if args.command == "run":
        cmd = list(args.cmd)
        if cmd and cmd[0] == "--":
            cmd = cmd[1:]
        if not cmd:
            sub.error("needs a command: krex run [options] -- CMD ARGS...")
        from krex_cli.run import run
        from krex_cli.warm import launch

        if args.die_with is not None and not _die_with(args.die_with):
            return ExitCode.USAGE
        _region_environ(args)
        launch.verbose = bool(args.verbose)
        return run(
            cmd,
            args.socket or default_socket(),
            args.gpu,
            args.timeout,
            args.exclusive,
            args.mem,
            args.label,
            args.retry_tempfail,
            fault_retries=args.fault_retries,
            warm=True if args.warm else False if args.cold else None,
            grant_log=os.path.abspath(args.grant_log) if args.grant_log else None,
        )
    return int(args.func(args))


def _die_with(parent: int) -> bool:
    """``--die-with PID``: arm the parent-death signal; False (said why) when it cannot hold."""
    from krex_cli import parentdeath

    try:
        if parentdeath.arm(parent):
            return True
        why = f"process {parent} is not krex run's parent (any more)"
    except OSError as exc:
        why = str(exc)
    print(f"krex: --die-with {parent}: {why}", file=sys.stderr)
    return False


def _subparser(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    """The parser of subcommand ``name`` of ``parser``."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices[name]  # type: ignore[no-any-return]
    raise LookupError(name)


if __name__ == "__main__":
    sys.exit(main())
