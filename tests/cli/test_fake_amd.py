"""krexd with simulated AMD GPUs (``--fake-vendor amd``): status, the table, a command's binding."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from krex_cli.krexctl import render
from krexd.config.config import Config, ConfigError, load, with_overrides
from tests.support.krexd import Krexd

SHOW_ENV = (
    "import json, os; print(json.dumps({k: os.environ.get(k) for k in "
    "('ROCR_VISIBLE_DEVICES', 'HIP_VISIBLE_DEVICES', 'CUDA_VISIBLE_DEVICES', "
    "'CUDA_DEVICE_ORDER', 'KREX_GPU_UUID', 'KREX_GPU', 'GPU_DEVICE_ORDINAL', "
    "'KREX_GPU_VENDOR', 'KREX_GPU_PCI')}))"
)


@pytest.mark.root
def test_krexd_with_simulated_amd_gpus(krexd_factory: Callable[..., Krexd]) -> None:
    k = krexd_factory(fake_gpus=2, args=["--fake-vendor", "amd"])
    st = k.status()
    assert [(g["index"], g["vendor"], g["name"]) for g in st["gpus"]] == [
        (0, "amd", "fake AMD GPU 0"),
        (1, "amd", "fake AMD GPU 1"),
    ]
    table = subprocess.run(
        [*k.krexctl, "status"], env=k.env, capture_output=True, text=True, check=True
    ).stdout
    header = next(line for line in table.splitlines() if line.startswith("GPU "))
    assert "VENDOR" in header
    rows = [line for line in table.splitlines() if line.startswith(("0 ", "1 "))]
    assert len(rows) == 2 and all(" amd " in r for r in rows), table
    run = subprocess.run(
        [*k.krex, "run", "--gpu", "1", "--", sys.executable, "-c", SHOW_ENV],
        env={
            **k.env,
            "CUDA_VISIBLE_DEVICES": "3",
            "HIP_VISIBLE_DEVICES": "2",
            "GPU_DEVICE_ORDINAL": "1",
        },  # fmt: skip
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout) == {
        "ROCR_VISIBLE_DEVICES": "GPU-6b72657866616b01",
        "HIP_VISIBLE_DEVICES": "0",
        "CUDA_VISIBLE_DEVICES": "",
        "CUDA_DEVICE_ORDER": None,
        "KREX_GPU_UUID": "GPU-6b72657866616b01",
        "KREX_GPU": "1",
        "GPU_DEVICE_ORDINAL": "0",  # the user's 1 would have left no device
        "KREX_GPU_VENDOR": "amd",
        "KREX_GPU_PCI": None,  # a simulated GPU has no PCI address
    }


def test_the_gpu_table_has_a_vendor_column() -> None:
    st = {"version": "x", "pid": 1, "uptime_s": 1.0, "state": "running", "socket": "s"}
    gpus = [
        {"index": 0, "name": "NVIDIA H100", "vendor": "nvidia", "slots_used": 0, "slots_total": 4},
        {"index": 1, "name": "AMD Instinct MI300X", "vendor": "amd", "slots_used": 1,
         "slots_total": 4},
        {"index": 2, "name": "from an older krexd", "slots_used": 0, "slots_total": 4},
    ]  # fmt: skip
    lines = render({**st, "gpus": gpus, "tenants": []}).splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("GPU "))
    start, end = lines[head].index("VENDOR"), lines[head].index("SLOTS")
    assert [r[start:end].strip() for r in lines[head + 1 : head + 4]] == ["nvidia", "amd", "-"]
    # an NVIDIA host's table keeps the columns it always had
    nvidia_only = render({**st, "gpus": [gpus[0], gpus[2]], "tenants": []})
    header = next(line for line in nvidia_only.splitlines() if line.startswith("GPU "))
    assert "VENDOR" not in header and header.split()[:3] == ["GPU", "NAME", "SLOTS"]


def test_fake_vendor_is_nvidia_unless_configured(tmp_path: Path) -> None:
    assert Config().daemon.fake_vendor == "nvidia"
    path = tmp_path / "k.toml"
    path.write_text('[daemon]\nfake_vendor = "amd"\n')
    assert load(str(path)).daemon.fake_vendor == "amd"
    assert with_overrides(Config(), fake_vendor="amd").daemon.fake_vendor == "amd"
    path.write_text('[daemon]\nfake_vendor = "intel"\n')
    with pytest.raises(ConfigError, match="fake_vendor"):
        load(str(path))
