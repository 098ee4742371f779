"""Errors that reach users, and the unwrapping of trio's exception groups around them."""

from __future__ import annotations


class PortInUseError(OSError):
    """The requested port is already taken; the message says how to choose another."""


class InsecureBindError(ValueError):
    """Binding a non-loopback address without a token was refused."""


class RefusedError(Exception):
    """The broker could not accept or persist a batch; nothing of it was acknowledged.

    ``reason`` is one line for the user (never a server path or a traceback). ``retryable`` says
    whether sending the same batch again may succeed once the cause goes away (disk full, too many
    open files, a run locked by another process) or never will (a run name that clashes with the
    record format, an event the broker refuses). Transports re-send retryable refusals themselves,
    with backoff, until they are accepted; they hand every refusal (retryable or not) once to the
    writer through ``Transport.take_errors()``, so the training code hears the real reason on its
    next call or ``flush()``.
    """

    def __init__(self, reason: str, *, retryable: bool) -> None:
        super().__init__(reason)
        self.reason = reason
        self.retryable = retryable


def unwrap(exc: BaseException) -> BaseException:
    """Return the single exception inside nested one-member exception groups, else ``exc``.

    trio's nurseries wrap every error in an ``ExceptionGroup``; a start-up failure of one task
    is still one error, and users should see it as such.
    """
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


def describe(exc: BaseException) -> str:
    """One line for a user: the exception's type and message, never an empty message."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text:.300}" if text else type(exc).__name__
