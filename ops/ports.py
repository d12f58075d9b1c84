"""Local TCP ports: pick a free one, or check that a chosen one is free before a server wants it."""

from __future__ import annotations

import socket

from core.errors import ResontechError


class PortInUse(ResontechError):
    """A port a local server wants is already taken; the message names the port and the server."""

    code = "port_in_use"


def free_port(host: str = "127.0.0.1") -> int:
    """Return a TCP port on ``host`` that nothing listens on right now.

    The port is released before returning, so another process could take it in between: callers
    that need certainty still check the server they start (our servers fail fast, with a clear
    error, when that happens).
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def ensure_port_free(host: str, port: int, what: str) -> None:
    """Raise :class:`PortInUse` if ``host:port`` cannot be bound.

    Args:
        host: the address the server will listen on.
        port: the TCP port (0 always passes: the server picks one).
        what: who wants the port, for the message (e.g. ``"nats-server"``).

    Raises:
        PortInUse: something already listens on the port.
    """
    if port == 0:
        return
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # SO_REUSEADDR as the servers themselves (Go) use it: a port whose old connections linger
        # in TIME_WAIT after a restart is free for them, and only a live listener counts as taken.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            raise PortInUse(
                f"port {port} on {host} is already in use ({exc.strerror}); {what} wants it: "
                "stop whatever holds it or choose another port"
            ) from None
