"""The project's errors. One root; every subclass carries a machine-readable code."""

from __future__ import annotations


class ResontechError(Exception):
    """Root of every error this project raises on purpose."""

    code = "error"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class ConfigError(ResontechError):
    """A setting is missing or malformed; the message names the setting."""

    code = "config"


class ConcurrencyConflict(ResontechError):
    """An append's expected sequence did not match: someone else appended first.

    Handle it by re-reading and re-deciding, never by overwriting.
    """

    code = "concurrency_conflict"

    def __init__(self, message: str, *, subject: str, expected: int) -> None:
        super().__init__(message)
        self.subject = subject
        self.expected = expected


class AppendTimeout(ResontechError):
    """The server did not acknowledge an append in time; it may or may not be stored.

    Retrying with the same event id is safe: the server stores it at most once.
    """

    code = "append_timeout"


class AppendRejected(ResontechError):
    """The server refused an append (no stream for the subject, limits, permissions)."""

    code = "append_rejected"


class NoResponders(AppendRejected):
    """Nothing answered the append: no stream captures its subject, or JetStream was briefly
    unavailable (a server reloading its accounts stops answering for ~50 ms). Nothing was stored."""


class LogUnavailable(ResontechError):
    """NATS could not be reached or JetStream is not enabled."""

    code = "log_unavailable"


class NotFound(ResontechError):
    """The thing asked for does not exist."""

    code = "not_found"


class InvalidInput(ResontechError):
    """Input was rejected; the message says what to fix."""

    code = "invalid_input"


class EnrollmentRefused(ResontechError):
    """A worker id may not be enrolled: the kernel keeps it for itself, or another provider holds it."""

    code = "enrollment_refused"
