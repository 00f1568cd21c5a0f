"""krexd: the krex daemon (admission, tenants, cgroups, CPU slices, region coordination).

Importing this package has no side effects and needs nothing beyond the standard
library; the daemon's parts live in submodules.
"""

__version__ = "0.1.0"
