"""The pool directory against another user who gets there first.

docs/design/security.md "Warm pools".  Another user (uid 65534, through
``setpriv``) creates the user's rendezvous first, as a directory of their
own or as a symbolic link to one: the user's warm pools still work from
the next candidate, or the command starts cold saying why (``-v``), and
nothing is created through the planted path.  Before, a directory planted
at ``/tmp/krex-pool-<uid>`` turned every warm start cold, for good.

The shared place is a sticky, world-writable directory like ``/tmp``
(``TMPDIR`` or ``XDG_RUNTIME_DIR`` point there): the real ``/tmp`` is left
alone.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from krex_cli.warm import pooldir
from tests.cli.warm_support import PY, Pools, warm_config
from tests.support.krexd import Krexd

pytestmark = pytest.mark.root
Factory = Callable[..., Krexd]
OTHER = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]


@pytest.fixture
def sticky() -> Iterator[Path]:
    """A root-owned sticky directory everyone may create entries in (a private ``/tmp``)."""
    path = Path(tempfile.mkdtemp(prefix="krex-sticky-"))
    os.chmod(path, 0o1777)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def home() -> Iterator[Path]:
    """A private home short enough for socket paths under its ``.cache`` (tmp_path is not)."""
    path = Path(tempfile.mkdtemp(prefix="krex-home-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _plant(*argv: str) -> None:
    subprocess.run([*OTHER, *argv], check=True, timeout=10)


def _env(pools: Pools, **env: str) -> dict[str, str]:
    out = {k: v for k, v in pools.env.items() if k not in ("XDG_RUNTIME_DIR", "TMPDIR")}
    return {**out, **env}


def test_a_directory_planted_by_another_user_does_not_stop_pools(
    krexd_factory: Factory, tmp_path: Path, sticky: Path, home: Path
) -> None:
    planted = sticky / "krex"
    _plant("mkdir", "-m", "0777", str(planted))
    pools = Pools(krexd_factory(config=warm_config()), tmp_path)
    env = _env(pools, XDG_RUNTIME_DIR=str(sticky), HOME=str(home))
    notes: list[str] = []
    assert pooldir.directory(env, notes.append) == str(home / ".cache" / "krex-pool")
    assert notes == [f"pool directory refused: {planted} belongs to uid 65534, not 0"]
    pools.ready(env=env)
    p = pools.warm([PY, "-c", "print(3)"], env=env)
    assert p.returncode == 0 and p.stdout == "3\n"
    assert any(f"{planted} belongs to uid 65534" in ln for ln in p.debug)  # type: ignore[attr-defined]
    assert list((home / ".cache" / "krex-pool").glob("*.sock"))
    assert not list(planted.iterdir())  # nothing was started there


@pytest.mark.skipif(os.path.isdir(f"/run/user/{os.getuid()}"), reason="logind's directory serves")
def test_with_every_candidate_taken_the_start_is_cold_and_says_why(
    krexd_factory: Factory, tmp_path: Path, sticky: Path
) -> None:
    planted = sticky / f"krex-pool-{os.getuid()}"
    _plant("mkdir", "-m", "0700", str(planted))
    pools = Pools(krexd_factory(config=warm_config()), tmp_path)
    env = _env(pools, TMPDIR=str(sticky), HOME="/nonexistent/home", XDG_CACHE_HOME="")
    p = pools.warm([PY, "-c", "print(4)"], served=False, env=env)
    assert p.returncode == 0 and p.stdout == "4\n", p.stderr
    assert any(
        "cold start: pool directory" in ln and "belongs to uid 65534" in ln
        for ln in p.debug  # type: ignore[attr-defined]
    ), p.debug  # type: ignore[attr-defined]


@pytest.mark.skipif(os.path.isdir(f"/run/user/{os.getuid()}"), reason="logind's directory serves")
def test_a_planted_symbolic_link_is_never_followed(
    krexd_factory: Factory, tmp_path: Path, sticky: Path
) -> None:
    target = sticky / "theirs"
    _plant("mkdir", "-m", "0777", str(target))
    link = sticky / f"krex-pool-{os.getuid()}"
    _plant("ln", "-s", str(target), str(link))
    pools = Pools(krexd_factory(config=warm_config()), tmp_path)
    env = _env(pools, TMPDIR=str(sticky), HOME="/nonexistent/home", XDG_CACHE_HOME="")
    with pytest.raises(pooldir.PoolDirError, match="is a symbolic link"):
        pooldir.directory(env)
    p = pools.warm([PY, "-c", "print(5)"], served=False, env=env)
    assert p.returncode == 0 and p.stdout == "5\n", p.stderr
    assert any("is a symbolic link" in ln for ln in p.debug)  # type: ignore[attr-defined]
    assert not list(target.iterdir())  # no socket, lock, log or start file through the link


def test_a_parent_others_can_write_is_refused(tmp_path: Path, home: Path) -> None:
    """A non-sticky shared parent: another user could rename the directory away."""
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    notes: list[str] = []
    env = {"XDG_RUNTIME_DIR": str(shared), "HOME": str(home)}
    assert pooldir.directory(env, notes.append) == str(home / ".cache" / "krex-pool")
    assert notes and "writable by others" in notes[0]
    assert not (shared / "krex").exists()
