"""What a krex command says and returns when krexd cannot be reached or refuses.

One home for the three outcomes every client command shares (``krex run``,
``krex ray-resources``): a socket this user may not open (exit 77, EX_NOPERM),
no krexd (exit 69, EX_UNAVAILABLE), an error reply (its code's exit code,
``krex_client.errors.exit_code_for``).
"""

from __future__ import annotations

from collections.abc import Callable

from krex_client.connection import KrexPermissionDenied, KrexUnavailable, RemoteError
from krex_client.errors import ExitCode, exit_code_for

#: The exceptions :func:`exit_code` handles.
KREXD_ERRORS = (KrexPermissionDenied, KrexUnavailable, RemoteError)


def exit_code(exc: Exception, say: Callable[[str], None]) -> int:
    """Say one line about ``exc`` (one of :data:`KREXD_ERRORS`) through ``say``; its exit code.

    Raises TypeError for any other exception.
    """
    if isinstance(exc, KrexPermissionDenied):
        say(f"cannot reach krexd at {exc.socket}: {exc.reason}")
        return ExitCode.NOPERM
    if isinstance(exc, KrexUnavailable):
        say(f"cannot reach krexd at {exc.socket}: {exc.reason}")
        return ExitCode.UNAVAILABLE
    if isinstance(exc, RemoteError):
        say(f"krexd refused: {exc.name}: {exc.message}")
        return exit_code_for(exc.name)
    raise TypeError(f"not a krexd error: {exc!r}")
