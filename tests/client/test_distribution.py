"""krex-client as its own distribution: built from python_client/, installed into a fresh venv.

The venv has no pyzmq, msgpack, PyTorch or krexd: a script off krex must run
there, and importing krex_client must not try to import any of them.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path
from typing import Any

import pytest

import krex_client

REPO = Path(__file__).resolve().parents[2]
CLIENT = REPO / "python_client"

pytestmark = pytest.mark.slow


def _setuptools_major() -> int:
    from importlib.metadata import version

    return int(version("setuptools").split(".")[0])


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv (no pip, no packages) with the krex-client wheel installed; its python."""
    if _setuptools_major() < 77:
        pytest.skip("building krex-client offline needs setuptools >= 77 (make venv)")
    tmp = tmp_path_factory.mktemp("dist")
    # Build from a copy: an in-tree build would leave build/ and *.egg-info in python_client/.
    src = tmp / "src"
    shutil.copytree(
        CLIENT, src, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__")
    )
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
         "--no-index", "-w", str(tmp / "wheels"), str(src)],
        check=True, timeout=300,
    )  # fmt: skip
    (wheel,) = (tmp / "wheels").glob("krex_client-*.whl")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp / "venv")], check=True)
    python = tmp / "venv" / "bin" / "python"
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        check=True, capture_output=True, text=True,
    ).stdout.strip()  # fmt: skip
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
         "--target", site, str(wheel)],
        check=True, timeout=300,
    )  # fmt: skip
    assert (Path(site) / "krex_client-autoregion.pth").is_file()
    return python


def _run(python: Path, script: str, **env: str) -> dict[str, Any]:
    """Run ``script`` in the venv (outside the repository, no KREX_*); its JSON output."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("KREX_", "PYTHON"))}
    res = subprocess.run(
        [str(python), "-c", textwrap.dedent(script)],
        env={**base, **env}, cwd=python.parent, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    out: dict[str, Any] = json.loads(res.stdout.splitlines()[-1])
    out["stderr"] = res.stderr
    return out


OFF_KREX = """
    import importlib.util, json, sys, warnings
    warnings.simplefilter("always")
    with warnings.catch_warnings(record=True) as caught:
        import krex_client
        from krex_client import region
        from krex_client.testing import do_bench, time_trials
        with region.critical():
            x = sum(range(1000))
        with region.critical():
            ms = do_bench(lambda: sum(range(1000)), warmup=1, rep=5)
        trials = time_trials(lambda: sum(range(1000)), num_trials=5)
    print(json.dumps({
        "file": krex_client.__file__,
        "ms": ms,
        "trials": trials.num_trials,
        "imported": sorted(m for m in ("zmq", "msgpack", "torch", "krexd") if m in sys.modules),
        "installed": sorted(m for m in ("zmq", "msgpack", "torch", "krexd")
                            if importlib.util.find_spec(m) is not None),
        "warnings": [str(w.message) for w in caught],
    }))
"""


def test_off_krex_needs_no_zmq_torch_or_daemon(venv: Path) -> None:
    out = _run(venv, OFF_KREX)
    assert out["installed"] == []  # the venv really lacks them
    assert out["imported"] == []
    assert str(venv.parents[1]) in out["file"]
    assert out["ms"] > 0 and out["trials"] == 5
    region_warnings = [w for w in out["warnings"] if "region.critical() does nothing" in w]
    assert len(region_warnings) == 1, out["warnings"]
    assert sum("host clock" in w for w in out["warnings"]) == 1, out["warnings"]


def test_under_krex_without_pyzmq_says_what_is_missing(venv: Path) -> None:
    script = """
        import json
        from krex_client import region
        try:
            with region.critical():
                pass
            print(json.dumps({"error": None}))
        except region.RegionError as exc:
            print(json.dumps({"error": str(exc)}))
    """
    out = _run(venv, script, KREX_SOCKET="/nonexistent.sock", KREX_TENANT="1", KREX_TOKEN="t")
    assert out["error"] is not None and "pyzmq" in out["error"]


def test_pth_file_turns_autoregions_on_without_importing_krex_client(
    venv: Path, tmp_path: Path
) -> None:
    stub = tmp_path / "triton"
    stub.mkdir()
    (stub / "__init__.py").write_text("")
    (stub / "testing.py").write_text("def do_bench(fn, warmup=25, rep=100):\n    return fn()\n")
    script = """
        import json, sys
        import triton.testing
        print(json.dumps({
            "patched": getattr(triton.testing.do_bench, "__krex_autoregion__", False),
            "client_loaded": "krex_client" in sys.modules,
        }))
    """
    on = _run(venv, script, PYTHONPATH=str(tmp_path), KREX_AUTOREGION="1")
    assert on == {"patched": True, "client_loaded": True, "stderr": on["stderr"]}
    off = _run(venv, script, PYTHONPATH=str(tmp_path))
    assert off["patched"] is False and off["client_loaded"] is False


def test_versions_agree() -> None:
    root = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    client = tomllib.loads((CLIENT / "pyproject.toml").read_text())["project"]
    assert krex_client.__version__ == root["version"]
    assert client["name"] == "krex-client" and client["dynamic"] == ["version"]
    # Only what talking to krexd needs; never the daemon or PyTorch.
    assert sorted(d.split(">")[0] for d in client["dependencies"]) == ["msgpack", "pyzmq"]
