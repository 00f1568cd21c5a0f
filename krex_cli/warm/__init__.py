"""Warm starts for ``krex run --warm``: pools of interpreters that imported the frameworks already.

docs/design/warm.md.  Modules, by side:

* ``krex run``: :mod:`~krex_cli.warm.plan` (can a pool run this command,
  which pool key), :mod:`~krex_cli.warm.pooldir` (the user's private pool
  directory), :mod:`~krex_cli.warm.client` (the request protocol's client
  side), :mod:`~krex_cli.warm.launch` (the integration in ``krex run``).
* the pool's keeper (krex's interpreter, the user's uid):
  :mod:`~krex_cli.warm.keeper` (starts the zygote, registers it with krexd,
  watches krexd).
* the pool's zygote (the command's interpreter; standard library only, run
  by file path): ``krexpool_zygote.py`` (the script), ``krexpool_serve.py``
  (the server loop), ``krexpool_child.py`` (a forked command's set-up),
  ``krexpool_wire.py`` (the message framing, shared with ``krex run``).
"""
