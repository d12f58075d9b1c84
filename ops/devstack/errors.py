"""The dev stack's one error: it cannot start or stop, and the message says why in one line."""

from __future__ import annotations

from core.errors import ResontechError


class DevStackError(ResontechError):
    """The dev stack cannot start or stop; the message says why in one line."""

    code = "devstack"
