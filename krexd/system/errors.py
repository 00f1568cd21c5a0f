"""krexd's error exception; the codes themselves live in :mod:`krex_client.errors`.

An op handler raises ``KrexError(Code.X, "message")`` and the server turns it
into an error reply ``{"code", "name", "message"}``.  ``Code``, ``ExitCode``,
``StatusExit`` and ``exit_code_for`` are re-exported from the client library,
which both krexd and the command-line programs read (one definition).
"""

from __future__ import annotations

from krex_client.errors import Code, ExitCode, StatusExit, exit_code_for

__all__ = ["Code", "ExitCode", "KrexError", "StatusExit", "exit_code_for"]


class KrexError(Exception):
    """An error that becomes an error reply: ``code`` (:class:`Code`), ``message`` (text)."""

    def __init__(self, code: Code, message: str) -> None:
        super().__init__(f"{code.name}: {message}")
        self.code = code
        self.message = message
