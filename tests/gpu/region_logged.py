"""One helper of the GPU tests: run a program under a real krexd with a region log."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest

PROGS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "progs")


def run_logged(krexd_factory: Any, prog: str, **env: str) -> list[dict[str, Any]]:
    """``krex run --region-log LOG -- python progs/PROG`` on the real GPU; LOG's records.

    Skips without torch or pynvml; fails with the program's stderr when it fails.
    ``env``: variables added to the command's environment.
    """
    pytest.importorskip("torch")
    pytest.importorskip("pynvml")
    k = krexd_factory(fake_gpus=0, slots=2)
    log = os.path.join(k.workdir, "regions.jsonl")
    run = subprocess.run(
        [*k.krex, "run", "--region-log", log, "--", sys.executable, os.path.join(PROGS, prog)],
        env=dict(k.env, **env),
        capture_output=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr.decode()[-4000:]
    with open(log) as f:
        return [json.loads(line) for line in f]
