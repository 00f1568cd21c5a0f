"""Write the corpus trace: every candidate of every task, in an agent-like interleaved order.

Each task is one agent trajectory that tries its candidates one after the
other (in a seeded random order, sometimes re-running one, as agents
re-check a promising candidate); trajectories advance at random relative
speeds, so consecutive commands mostly belong to different tasks (paper
§6.1: commands of concurrent agent sessions).

    python workloads/make_trace.py [--seed 7] [--reruns 0.3] [--out workloads/trace.jsonl]

A compile mix: a base trace plus every ``torch_compile`` candidate of the
corpus, each ``--compile-copies`` times (agents submit near-identical
compiled candidates), spread through the base in a seeded order:

    python workloads/make_trace.py --mix workloads/trace-h200.jsonl --compile-copies 2 \
        --out workloads/trace-compile-mix.jsonl
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path
from typing import Any

import corpus


def interleave(cmds: list[dict[str, Any]], seed: int, reruns: float) -> list[dict[str, Any]]:
    """Trajectories (one per task) merged in a random, seeded order."""
    rng = random.Random(seed)
    by_task: dict[str, list[dict[str, Any]]] = {}
    for c in cmds:
        by_task.setdefault(c["task"], []).append(c)
    queues = []
    for task in sorted(by_task):
        traj = list(by_task[task])
        rng.shuffle(traj)
        if rng.random() < reruns:
            traj.append(dict(rng.choice(traj)))
        queues.append(traj)
    speed = [rng.uniform(0.5, 2.0) for _ in queues]
    out = []
    while any(queues):
        live = [i for i, q in enumerate(queues) if q]
        i = rng.choices(live, weights=[speed[j] for j in live])[0]
        out.append(queues[i].pop(0))
    return out


def entry(c: dict[str, Any]) -> dict[str, Any]:
    """One trace line (argv and labels) for a corpus command."""
    argv = [
        "python",
        f"workloads/{c['family']}.py",
        "--task",
        c["task"],
        "--candidate",
        c["candidate"],
    ]
    return {
        "argv": argv,
        "task": c["task"],
        "candidate": c["candidate"],
        "band": c["band"],
        "family": c["family"],
    }


def compile_mix(base: list[dict[str, Any]], copies: int, seed: int) -> list[dict[str, Any]]:
    """``base`` with each ``torch_compile`` candidate inserted ``copies`` times, seeded."""
    rng = random.Random(seed)
    out = list(base)
    extra = [entry(c) for c in corpus.commands() if c["candidate"] == "torch_compile"] * copies
    for e in extra:
        out.insert(rng.randrange(len(out) + 1), dict(e))
    return out


def main(argv: list[str] | None = None) -> int:
    """The command line (``argv``: its arguments, default ``sys.argv[1:]``); returns 0."""
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--seed", type=int, default=7)
    p.add_argument(
        "--reruns",
        type=float,
        default=0.3,
        help="probability that a trajectory re-runs one of its candidates",
    )
    p.add_argument("--out", type=Path, default=corpus.HERE / "trace.jsonl")
    p.add_argument("--mix", type=Path, help="base trace to add the compiled candidates to")
    p.add_argument("--compile-copies", type=int, default=2)
    a = p.parse_args(argv)
    if a.mix is not None:
        base = [json.loads(x) for x in a.mix.read_text(encoding="utf-8").splitlines() if x.strip()]
        entries = compile_mix(base, a.compile_copies, a.seed)
    else:
        entries = [entry(c) for c in interleave(corpus.commands(), a.seed, a.reruns)]
    lines = [json.dumps(e, separators=(",", ":")) for e in entries]
    a.out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"{a.out}: {len(lines)} commands", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
