"""Files krexd and its clients open safely; the gate is readable by the socket group only.

Each fails on the krexd before: the gate file was 0644 whatever the socket group.
"""

from __future__ import annotations

import grp
import os
import stat
from collections.abc import Callable

import pytest

from tests.conftest import Krexd

pytestmark = pytest.mark.root
Factory = Callable[..., Krexd]


def test_the_gate_is_readable_by_the_socket_group_only(krexd_factory: Factory) -> None:
    group = grp.getgrgid(65534).gr_name
    k = krexd_factory(config={"daemon": {"socket_group": group}})
    gate = k.status()["gpus"][0]["gate"]
    st = os.stat(gate)
    assert st.st_uid == 0 and st.st_gid == 65534, (st.st_uid, st.st_gid)
    assert stat.S_IMODE(st.st_mode) == 0o640, oct(st.st_mode)
