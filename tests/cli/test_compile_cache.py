"""Compile caches shared per user (krex_cli.compile_cache): where, how safely, how large."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from krex_cli import compile_cache as cc
from tests.support.krexd import Krexd

UID = os.getuid()
OTHER = UID + 4242


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    return {"HOME": str(tmp_path / "home"), "XDG_CACHE_HOME": str(tmp_path / "xdg"), **extra}


def test_the_variables_name_a_private_directory_of_the_user(tmp_path: Path) -> None:
    added = cc.environ(cc.Settings(), _env(tmp_path))
    user_dir = tmp_path / "xdg" / "krex" / "compile"
    assert added == {
        "TORCHINDUCTOR_CACHE_DIR": str(user_dir / "inductor"),
        "TRITON_CACHE_DIR": str(user_dir / "triton"),
        "CUDA_CACHE_PATH": str(user_dir / "cuda"),
    }
    st = os.lstat(user_dir)
    assert stat.S_ISDIR(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o700 and st.st_uid == UID
    assert all(os.path.isdir(p) for p in added.values())
    # A directory of the user's that others could read is made private again.
    os.chmod(user_dir, 0o755)
    cc.environ(cc.Settings(), _env(tmp_path))
    assert stat.S_IMODE(os.lstat(user_dir).st_mode) == 0o700
    # Without XDG_CACHE_HOME (or a relative one): ~/.cache; a home that does not
    # exist is never made (HOME=/nonexistent); without a home: refused.
    with pytest.raises(cc.Refused, match="No such file"):
        cc.environ(cc.Settings(), {"HOME": str(tmp_path / "home"), "XDG_CACHE_HOME": "x"})
    assert not (tmp_path / "home").exists()
    (tmp_path / "home").mkdir()
    home = cc.environ(cc.Settings(), {"HOME": str(tmp_path / "home"), "XDG_CACHE_HOME": "x"})
    assert home["TRITON_CACHE_DIR"] == str(tmp_path / "home/.cache/krex/compile/triton")
    with pytest.raises(cc.Refused, match="no absolute HOME"):
        cc.environ(cc.Settings(), {})


def test_the_users_own_settings_win(tmp_path: Path) -> None:
    env = _env(tmp_path, TRITON_CACHE_DIR="/mine/triton")
    added = cc.environ(cc.Settings(), env)
    assert "TRITON_CACHE_DIR" not in added and set(added) == {
        "TORCHINDUCTOR_CACHE_DIR",
        "CUDA_CACHE_PATH",
    }
    everything = {var: "/mine" for var, _ in cc.VARS}
    assert cc.environ(cc.Settings(), {**_env(tmp_path), **everything}) == {}
    assert cc.environ(cc.Settings(enabled=False), _env(tmp_path)) == {}
    assert not (tmp_path / "xdg").exists() or (tmp_path / "xdg" / "krex").exists()


def test_two_users_get_different_directories(tmp_path: Path) -> None:
    root = cc.Settings(root=str(tmp_path))
    assert cc.location(root, {}, 1001) != cc.location(root, {}, 1002)
    assert cc.location(root, {}, 1001) == (str(tmp_path), ["1001"])
    a = cc.location(cc.Settings(), {"HOME": "/home/a"}, 1001)
    b = cc.location(cc.Settings(), {"HOME": "/home/b"}, 1002)
    assert a != b
    # Two users naming one XDG_CACHE_HOME: the second finds the first's directory and is refused.
    cc.ensure(cc.Settings(), _env(tmp_path), UID)
    with pytest.raises(cc.Refused, match=f"owned by uid {UID}, not by this user"):
        cc.ensure(cc.Settings(), _env(tmp_path), OTHER)


def test_a_configured_root_holds_one_private_directory_per_uid(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir(mode=0o755)
    os.chmod(root, 0o1777)  # like /tmp: anybody creates, nobody renames another's
    path = cc.ensure(cc.Settings(root=str(root)), {}, UID)
    assert path == str(root / str(UID)) and stat.S_IMODE(os.lstat(path).st_mode) == 0o700
    os.chmod(root, 0o777)  # world-writable without the sticky bit: entries can be replaced
    with pytest.raises(cc.Refused, match="other users could replace"):
        cc.ensure(cc.Settings(root=str(root)), {}, UID)
    with pytest.raises(cc.Refused, match="No such file"):
        cc.ensure(cc.Settings(root=str(tmp_path / "absent")), {}, UID)


def test_a_symlink_on_the_way_is_refused_with_one_line(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "xdg").mkdir()
    os.symlink(elsewhere, tmp_path / "xdg" / "krex")
    with pytest.raises(cc.Refused) as info:
        cc.ensure(cc.Settings(), _env(tmp_path), UID)
    assert "xdg/krex: not a directory krex may use" in str(info.value)
    assert "\n" not in str(info.value) and not list(elsewhere.iterdir())
    # krex run says so once and runs the command without the variables.
    said: list[str] = []
    prepared = cc.prepare({}, _env(tmp_path), said.append)
    assert prepared.env == {} and prepared.path is None and prepared.trim() is None
    assert len(said) == 1 and said[0].startswith("compile cache: ") and "\n" not in said[0]


def test_a_directory_of_another_owner_is_refused(tmp_path: Path) -> None:
    cc.ensure(cc.Settings(), _env(tmp_path), UID)  # the user's, on disk
    with pytest.raises(cc.Refused, match=r"xdg/krex: owned by uid \d+, not by this user"):
        cc.ensure(cc.Settings(), _env(tmp_path), OTHER)  # seen as another user would
    if os.geteuid() == 0:  # really another owner, for the real user
        os.chown(tmp_path / "xdg" / "krex" / "compile", OTHER, OTHER)
        with pytest.raises(cc.Refused, match=f"krex/compile: owned by uid {OTHER}"):
            cc.ensure(cc.Settings(), _env(tmp_path), UID)


def test_prepare_reads_krexds_settings(tmp_path: Path) -> None:
    about = {"cache": {"enabled": True, "dir": "", "max_bytes": 123}}
    prepared = cc.prepare(about, _env(tmp_path), lambda s: None)
    assert prepared.max_bytes == 123 and prepared.path == str(tmp_path / "xdg/krex/compile")
    assert cc.prepare({"cache": {"enabled": False}}, _env(tmp_path), print).env == {}


def _entry(root: Path, name: str, size: int, age_s: float) -> Path:
    d = root / name
    d.mkdir(parents=True)
    (d / "kernel.bin").write_bytes(b"x" * size)
    then = time.time() - age_s
    os.utime(d, (then, then))
    return d


def test_the_trim_removes_the_oldest_entries_over_the_bound(tmp_path: Path) -> None:
    root = tmp_path / "c"
    oldest = _entry(root, "triton/aaa", 400, 4000)
    older = _entry(root, "triton/bbb", 400, 3000)
    old = _entry(root, "inductor/xy/ccc", 400, 2000)
    fresh = _entry(root, "inductor/xy/ddd", 400, 10)  # too recent to remove, even over
    done = cc.trim(str(root), 900, min_age_s=60)
    assert (done.total, done.freed, done.removed, done.complete) == (1600, 800, 2, True)
    assert not oldest.exists() and not older.exists() and old.exists() and fresh.exists()
    done = cc.trim(str(root), 100, min_age_s=60)
    assert done.removed == 1 and not old.exists() and fresh.exists()
    assert cc.trim(str(root), 100, bound_s=0.0).complete is False


def test_the_trim_runs_at_most_once_a_minute(tmp_path: Path) -> None:
    root = tmp_path / "c"
    _entry(root, "triton/aaa", 400, 4000)
    assert cc.trim_if_due(str(root), 0) is None  # max_bytes 0: never
    first = cc.trim_if_due(str(root), 100)
    assert first is not None and first.removed == 1
    _entry(root, "triton/bbb", 400, 4000)
    assert cc.trim_if_due(str(root), 100) is None  # the stamp is fresh
    stamp = root / cc.STAMP
    os.utime(stamp, (time.time() - 120, time.time() - 120))
    later = cc.trim_if_due(str(root), 100)
    assert later is not None and later.removed == 1 and stamp.exists()


SHOW = (
    "import json, os; print(json.dumps({v: os.environ.get(v) for v in "
    "('TORCHINDUCTOR_CACHE_DIR', 'TRITON_CACHE_DIR', 'CUDA_CACHE_PATH')}))"
)


@pytest.mark.root
def test_krex_run_gives_its_commands_the_users_caches(
    krexd_factory: Callable[..., Krexd], tmp_path: Path
) -> None:
    k = krexd_factory()
    env = {**k.env, "XDG_CACHE_HOME": str(tmp_path / "xdg"), "TRITON_CACHE_DIR": "/mine"}
    p = subprocess.run(
        [*k.krex, "run", "--", sys.executable, "-c", SHOW],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 0, p.stderr
    seen = json.loads(p.stdout.splitlines()[-1])
    user_dir = tmp_path / "xdg" / "krex" / "compile"
    assert seen == {
        "TORCHINDUCTOR_CACHE_DIR": str(user_dir / "inductor"),
        "TRITON_CACHE_DIR": "/mine",
        "CUDA_CACHE_PATH": str(user_dir / "cuda"),
    }
    assert (user_dir / cc.STAMP).exists()  # trimmed (nothing to remove) after the command
    # krexd's [cache] enabled = false: the tools' own defaults.
    off = krexd_factory(config={"cache": {"enabled": False}})
    p = subprocess.run(
        [*off.krex, "run", "--", sys.executable, "-c", SHOW],
        env={**off.env, "XDG_CACHE_HOME": str(tmp_path / "xdg2")},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 0 and set(json.loads(p.stdout.splitlines()[-1]).values()) == {None}
