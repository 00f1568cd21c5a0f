"""krex_cli: the user's programs around krexd: ``krex run``, ``krex replay``, ``krexctl``, demo.

* :mod:`krex_cli.main` — the ``krex`` command (``run``, ``replay``, ``ray-resources``);
* :mod:`krex_cli.run` — ``krex run``: admit a command through krexd and run it as a tenant
  (:mod:`krex_cli.coldstart` forks and execs it; :mod:`krex_cli.warm` starts it from a
  warm pool with ``--warm``);
* :mod:`krex_cli.ray_resources` — ``krex ray-resources``: this host's Ray resources, from krexd;
* :mod:`krex_cli.krexctl` — ``krexctl status``;
* :mod:`krex_cli.replay` — ``krex replay``: replay a command trace, report fidelity;
* :mod:`krex_cli.demo` — ``make demo``: a short replay, native against krex.

They talk to krexd only through its control socket, with the client library
(:mod:`krex_client`: connection, wire protocol, error and exit codes, sizes),
and never import the daemon's package ``krexd``; they start krexd as a
program only (``krex replay``).  Importing this package has no side effects.
"""

__version__ = "0.1.0"


def help_text(doc: str | None) -> str:
    """``doc`` (a module docstring, reST) as plain ``--help`` text: double backticks removed."""
    return (doc or "").replace("``", "")
