"""Errors that reach users, and the unwrapping of trio's exception groups around them."""

from __future__ import annotations


class PortInUseError(OSError):
    """The requested port is already taken; the message says how to choose another."""


class InsecureBindError(ValueError):
    """Binding a non-loopback address without a token was refused."""


def unwrap(exc: BaseException) -> BaseException:
    """Return the single exception inside nested one-member exception groups, else ``exc``.

    trio's nurseries wrap every error in an ``ExceptionGroup``; a start-up failure of one task
    is still one error, and users should see it as such.
    """
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc
