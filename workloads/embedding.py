"""Embedding-gather benchmarking commands: F.embedding, index_select, indexing, Triton rows.

python workloads/embedding.py --task embedding_t16384_bf16 --candidate triton_b1024
"""

from __future__ import annotations

from typing import Any

import harness
from harness import Bench, Case, Task

CANDIDATES = (
    "torch_embedding",
    "index_select",
    "advanced_indexing",
    "triton_b1024",
    "triton_b4096",
)
VOCAB, DIM = 128256, 4096

TASKS = [
    Task(
        "embedding_t16384_bf16",
        "<0.1ms",
        CANDIDATES,
        {"vocab": VOCAB, "dim": DIM, "tokens": 16384},
        rtol=0,
        atol=0,
        about="token embedding lookup of a 16k-token prefill (1 GiB table)",
        smoke={"vocab": 100, "dim": 300, "tokens": 17},
    ),
    Task(
        "embedding_t65536_bf16",
        "0.1-1ms",
        CANDIDATES,
        {"vocab": VOCAB, "dim": DIM, "tokens": 65536},
        rtol=0,
        atol=0,
        about="embedding lookup of a 64k-token batch (512 MiB gathered)",
        smoke={"vocab": 100, "dim": 300, "tokens": 64},
    ),
]


def build(c: Case) -> Bench:
    import torch
    import torch.nn.functional as F

    p = c.p
    w = torch.randn(p["vocab"], p["dim"], device=c.device, dtype=torch.bfloat16)
    idx = torch.randint(0, p["vocab"], (p["tokens"],), device=c.device, dtype=torch.int64)

    def reference() -> Any:
        return w[idx.cpu()].float()

    name = c.candidate
    fn: Any
    if name == "torch_embedding":

        def fn() -> Any:
            return F.embedding(idx, w)
    elif name == "index_select":

        def fn() -> Any:
            return torch.index_select(w, 0, idx)
    elif name == "advanced_indexing":

        def fn() -> Any:
            return w[idx]
    elif name.startswith("triton_b"):
        from impl import pointwise

        block = int(name.removeprefix("triton_b"))

        def fn() -> Any:
            return pointwise.gather_rows(w, idx, block, num_warps=8 if block >= 4096 else 4)
    else:
        raise AssertionError(f"no builder for candidate {name}")
    return Bench(fn, reference)


if __name__ == "__main__":
    harness.run("embedding", TASKS, build, frameworks=("torch", "triton"))
