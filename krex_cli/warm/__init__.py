"""Warm starts for ``krex run --warm``: pools of interpreters that imported the frameworks already.

``krex run``'s side (plan, pooldir, client, launch), the keeper's, and the
zygote's (the ``krexpool_*`` files: standard library only, run by file
path).  docs/design/warm.md.
"""
