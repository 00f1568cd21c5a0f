"""Convolution benchmarking commands: cuDNN layouts and algorithm choice, GEMM lowering, Triton.

python workloads/conv.py --task conv2d_3x3_n32_c256_56_fp16 --candidate channels_last
"""

from __future__ import annotations

from typing import Any

import harness
from harness import Bench, Case, Task

TASKS = [
    Task(
        "conv2d_3x3_n32_c256_56_fp16",
        "0.1-1ms",
        ("nchw", "channels_last", "channels_last_benchmark", "nchw_bias_separate"),
        {"n": 32, "c": 256, "k": 256, "hw": 56, "r": 3, "dtype": "float16"},
        rtol=2e-2,
        atol=2e-2,
        about="ResNet-style 3x3 convolution with bias",
        smoke={"n": 2, "c": 8, "k": 8, "hw": 9},
    ),
    Task(
        "conv2d_1x1_n64_c512_28_bf16",
        "<0.1ms",
        ("nchw", "channels_last", "as_matmul"),
        {"n": 64, "c": 512, "k": 512, "hw": 28, "r": 1, "dtype": "bfloat16"},
        rtol=2e-2,
        atol=2e-2,
        about="pointwise convolution, a GEMM in disguise",
        smoke={"n": 2, "c": 8, "k": 8, "hw": 5},
    ),
    Task(
        "causal_conv1d_b8_d4096_l4096_bf16",
        "0.1-1ms",
        ("torch_conv1d", "triton_b256", "triton_b1024", "torch_unfold"),
        {"b": 8, "d": 4096, "l": 4096, "width": 4},
        rtol=2e-2,
        atol=2e-2,
        about="Mamba-style causal depthwise conv1d, width 4",
        smoke={"b": 2, "d": 3, "l": 300},
    ),
]


def build(c: Case) -> Bench:
    import torch
    import torch.nn.functional as F

    p = c.p
    name = c.candidate
    fn: Any
    if c.task.name.startswith("causal_conv1d"):
        bf = torch.bfloat16
        width = p["width"]
        x = torch.randn(p["b"], p["d"], p["l"], device=c.device, dtype=bf)
        w = (torch.randn(p["d"], width, device=c.device, dtype=torch.float32) / 2).to(bf)
        length = p["l"]

        def reference() -> Any:
            return F.conv1d(x.float(), w.float().unsqueeze(1), padding=width - 1, groups=p["d"])[
                ..., :length
            ]

        if name == "torch_conv1d":
            w3 = w.unsqueeze(1).contiguous()

            def fn() -> Any:
                return F.conv1d(x, w3, padding=width - 1, groups=p["d"])[..., :length]
        elif name == "torch_unfold":  # windows materialized, then a weighted sum

            def fn() -> Any:
                win = F.pad(x, (width - 1, 0)).unfold(-1, width, 1)
                return (win * w[:, None, :]).sum(-1)
        elif name.startswith("triton_b"):
            from impl import conv as kern

            block = int(name.removeprefix("triton_b"))

            def fn() -> Any:
                return kern.causal_dwconv1d(x, w, block, num_warps=4)
        else:
            raise AssertionError(f"no builder for candidate {name}")
        return Bench(fn, reference)

    dt = getattr(torch, p["dtype"])
    n, ch, k, hw, r = p["n"], p["c"], p["k"], p["hw"], p["r"]
    pad = r // 2
    x = torch.randn(n, ch, hw, hw, device=c.device, dtype=dt)
    w = (torch.randn(k, ch, r, r, device=c.device, dtype=torch.float32) / (ch * r * r) ** 0.5).to(
        dt
    )
    bias = torch.randn(k, device=c.device, dtype=dt)
    with_bias = r == 3

    def ref_conv() -> Any:
        return F.conv2d(x.float(), w.float(), bias.float() if with_bias else None, padding=pad)

    b_arg = bias if with_bias else None
    if name == "nchw":

        def fn() -> Any:
            return F.conv2d(x, w, b_arg, padding=pad)
    elif name in ("channels_last", "channels_last_benchmark"):
        xl = x.contiguous(memory_format=torch.channels_last)
        wl = w.contiguous(memory_format=torch.channels_last)
        if name == "channels_last_benchmark":  # let cuDNN time its algorithms first
            c.need_cuda()
            torch.backends.cudnn.benchmark = True

        def fn() -> Any:
            return F.conv2d(xl, wl, b_arg, padding=pad)
    elif name == "nchw_bias_separate":  # convolution, then the bias as another pass

        def fn() -> Any:
            return F.conv2d(x, w, None, padding=pad) + bias.view(1, -1, 1, 1)
    elif name == "as_matmul":  # 1x1: NCHW -> (N*H*W, C) @ (C, K) -> NCHW
        w2 = w.view(k, ch).t().contiguous()

        def fn() -> Any:
            y = x.permute(0, 2, 3, 1).reshape(-1, ch) @ w2
            return y.view(n, hw, hw, k).permute(0, 3, 1, 2)
    else:
        raise AssertionError(f"no builder for candidate {name}")
    return Bench(fn, ref_conv)


if __name__ == "__main__":
    harness.run("conv", TASKS, build, frameworks=("torch", "triton"))
