"""The gateway connects to a replica only where replicas may be: checked again when it connects.

The intake judged a replica's address when its agent claimed it (:mod:`core.addresses`), but a name
resolves anew at every connection, and DNS may answer differently by then (a provider's own
name pointed at the kernel's object store a minute after the claim); and the ENDPOINTS stream may
hold addresses accepted before the rule existed. So the proxy's client resolves through
:class:`CheckedResolver`, which keeps only the addresses that pass
:func:`core.addresses.ip_refusal` and fails the connection when none does: aiohttp then connects
to the checked addresses and no other. A host that is an IP address in any form (which aiohttp
connects to without resolving it) is checked by :meth:`ReplicaGuard.refusal` before the request.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterable

from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.resolver import DefaultResolver

from core.addresses import IPAddress, IPNetwork, ip_refusal, literal_ip, url_host_port
from core.errors import InvalidInput

KEPT = 10_000
"""Most replica addresses whose verdict is remembered (a literal address's verdict never changes)."""


class ReplicaGuard:
    """Where the gateway may connect to replicas.

    Args:
        networks: the allowed replica networks (``RESONTECH_REPLICA_NETWORKS``).
        kernel: ``(address, port)`` of the kernel's own services.
    """

    def __init__(self, networks: Iterable[IPNetwork], kernel: Iterable[tuple[IPAddress, int]]) -> None:
        self.networks = tuple(networks)
        self.kernel = frozenset(kernel)
        self._verdicts: dict[str, str | None] = {}

    def refusal(self, address: str) -> str | None:
        """Why the gateway will not send a request to ``address`` (``http(s)://host:port``), or
        ``None``. A host name passes here: :class:`CheckedResolver` checks what it resolves to."""
        if address in self._verdicts:
            return self._verdicts[address]
        try:
            host, port = url_host_port(address)
            ip = literal_ip(host)
            verdict = None if ip is None else ip_refusal(ip, port, self.networks, self.kernel)
        except InvalidInput as exc:
            verdict = exc.message
        if len(self._verdicts) >= KEPT:
            self._verdicts.clear()
        self._verdicts[address] = verdict
        return verdict

    def resolver(self) -> CheckedResolver:
        return CheckedResolver(self)


class CheckedResolver(AbstractResolver):
    """aiohttp's resolver, less every address a replica may not have (see the module docstring)."""

    def __init__(self, guard: ReplicaGuard, inner: AbstractResolver | None = None) -> None:
        self.guard = guard
        self.inner = inner or DefaultResolver()

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        found = await self.inner.resolve(host, port, family)
        kept = [
            r
            for r in found
            if ip_refusal(
                ipaddress.ip_address(r["host"].split("%", 1)[0]), port, self.guard.networks, self.guard.kernel
            )
            is None
        ]
        if not kept:  # an OSError: aiohttp reports it as a connection error, the replica is ejected
            raise OSError(f"{host} resolves to no address a replica may have")
        return kept

    async def close(self) -> None:
        await self.inner.close()


__all__ = ["CheckedResolver", "ReplicaGuard"]
