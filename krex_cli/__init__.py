"""krex_cli: the user's programs around krexd: ``krex run``, ``krex replay``, ``krexctl``, demo.

They talk to krexd only through its control socket, with the client
library ``krex_client``, and never import ``krexd`` (they start it as a
program only: ``krex replay``).  Importing this package has no side effects.
"""

__version__ = "0.1.0"


def help_text(doc: str | None) -> str:
    """``doc`` (a module docstring, reST) as plain ``--help`` text: double backticks removed."""
    return (doc or "").replace("``", "")
