"""cgroups: backend detection (v2, hybrid), tenant cgroups, freeze/thaw, cpuset."""

from krexd.cgroups.backend import CgroupBackend
from krexd.cgroups.fs import CgroupError
from krexd.cgroups.tenant import TenantCgroup

__all__ = ["CgroupBackend", "CgroupError", "TenantCgroup"]
