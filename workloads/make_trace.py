"""Write the corpus trace: every candidate of every task, in an agent-like interleaved order.

Each task is one agent trajectory that tries its candidates one after the
other (in a seeded random order, sometimes re-running one, as agents
re-check a promising candidate); trajectories advance at random relative
speeds, so consecutive commands mostly belong to different tasks (paper
§6.1: commands of concurrent agent sessions).

    python workloads/make_trace.py [--seed 7] [--reruns 0.3] [--out workloads/trace.jsonl]
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


def main() -> int:
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
    a = p.parse_args()
    lines = []
    for c in interleave(corpus.commands(), a.seed, a.reruns):
        argv = [
            "python",
            f"workloads/{c['family']}.py",
            "--task",
            c["task"],
            "--candidate",
            c["candidate"],
        ]
        lines.append(
            json.dumps(
                {
                    "argv": argv,
                    "task": c["task"],
                    "candidate": c["candidate"],
                    "band": c["band"],
                    "family": c["family"],
                },
                separators=(",", ":"),
            )
        )
    a.out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"{a.out}: {len(lines)} commands", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
