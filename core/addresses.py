"""Where a replica may be: addresses resolved, never compared as text.

A provider names where its replica serves (``http(s)://<host>:<port>``), and the gateway then sends
tenants' requests there. A host is only text: ``localhost``, ``127.1``, ``2130706433``, ``0x7f000001``,
``[::ffff:127.0.0.1]`` and a DNS name that resolves to one of them all reach the kernel's own
loopback. So an address is judged by the IP addresses the HTTP client would connect to, parsed the
way the client (aiohttp, over glibc's ``inet_aton``/``getaddrinfo``) parses them, and each of them
must pass :func:`ip_refusal`:

* never unspecified (``0.0.0.0``, ``::``: "this host"), multicast, link-local (``169.254/16``, where
  clouds serve instance metadata; ``fe80::/10``), broadcast or reserved;
* never loopback, unless a loopback network is listed by name in the allowed replica networks
  (the dev stack lists ``127.0.0.0/8`` and ``::1/128``: everything it runs is on one host);
  ``0.0.0.0/0`` does not allow it;
* inside one of the allowed replica networks (:data:`ANY_NETWORK` when none is configured);
* never a kernel service: not the address and port of one, and on a loopback the dev stack
  allows, not one of the kernel's ports on any loopback address (a kernel service bound to
  ``0.0.0.0`` counts as bound to loopback too). The kernel does not know its hosts' other ports:
  a production deployment lists replica networks that leave its own hosts out;
* an IPv6 address that carries an IPv4 one (``::ffff:a.b.c.d``, 6to4, Teredo, NAT64's
  ``64:ff9b::/96``) is judged as that IPv4 address too.

Everything here is pure except :func:`resolve`, the impure shell's lookup (the intake resolves and
hands the judge the addresses as facts; the gateway resolves again when it connects, since DNS can
change between the two, and connects only to addresses that pass).
"""

from __future__ import annotations

import contextlib
import ipaddress
import socket
from collections.abc import Iterable
from typing import Protocol
from urllib.parse import urlsplit

from core.errors import InvalidInput

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

ANY_NETWORK: tuple[IPNetwork, ...] = (ipaddress.ip_network("0.0.0.0/0"), ipaddress.ip_network("::/0"))
"""The allowed replica networks when none is configured: any address that passes the rest."""
LOOPBACK_NETWORKS = "127.0.0.0/8,::1/128"
"""What the dev stack (and the test harnesses that run everything on one host) allow."""
MAX_NETWORKS = 256
"""Most networks ``RESONTECH_REPLICA_NETWORKS`` may list."""
MAX_RESOLVED = 32
"""Most addresses of one name that are judged (a name with more is refused)."""
_LOOPBACK = (ipaddress.ip_network("127.0.0.0/8"), ipaddress.ip_network("::1/128"))
_NAT64 = ipaddress.ip_network("64:ff9b::/96")


def parse_networks(text: str) -> tuple[IPNetwork, ...]:
    """The networks of a comma-separated list of CIDRs (``10.0.0.0/8,fd00::/8``); :data:`ANY_NETWORK`
    for an empty one.

    Raises:
        InvalidInput: a malformed entry, or more than :data:`MAX_NETWORKS`.
    """
    entries = [e.strip() for e in text.split(",") if e.strip()]
    if len(entries) > MAX_NETWORKS:
        raise InvalidInput(f"at most {MAX_NETWORKS} replica networks, got {len(entries)}")
    try:
        found = tuple(ipaddress.ip_network(e, strict=False) for e in entries)
    except ValueError as exc:
        raise InvalidInput(f"not a network: {exc}") from None
    return found or ANY_NETWORK


def literal_ip(host: str) -> IPAddress | None:
    """``host`` as the IP address an HTTP client connects to when it names one, else ``None`` (a
    name, which must be resolved). IPv4 in every form ``inet_aton`` takes (``127.1``,
    ``2130706433``, ``0x7f000001``, ``0177.0.0.1``); IPv6 with or without brackets or a zone.
    A host that is digits and dots but no address (``1.2.3.4.5``) is refused as not an address."""
    host = host.strip().lower().removeprefix("[").removesuffix("]")
    if ":" in host:
        try:
            return ipaddress.IPv6Address(host.split("%", 1)[0])
        except ValueError:
            raise InvalidInput(f"{host[:80]!r} is not an IPv6 address") from None
    if host.replace(".", "").isdigit() or host.startswith("0x") or _hexish(host):
        try:
            return ipaddress.IPv4Address(socket.inet_aton(host))  # inet_aton is pure: no lookup
        except OSError:
            if host.replace(".", "").isdigit():  # what aiohttp takes for an address, but none
                raise InvalidInput(f"{host[:80]!r} is not an IP address") from None
    return None


def _hexish(host: str) -> bool:
    """Whether ``host`` has a part ``inet_aton`` reads as hex (``127.0x0.1``)."""
    return any(part.startswith("0x") for part in host.split("."))


def embedded_ipv4(ip: IPAddress) -> IPAddress | None:
    """The IPv4 address an IPv6 address carries (mapped, 6to4, Teredo, NAT64), else ``None``."""
    if isinstance(ip, ipaddress.IPv4Address):
        return None
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip.sixtofour is not None:
        return ip.sixtofour
    if ip.teredo is not None:
        return ip.teredo[1]
    if ip in _NAT64:
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return None


def ip_refusal(
    ip: IPAddress, port: int, networks: Iterable[IPNetwork], kernel: Iterable[tuple[IPAddress, int]]
) -> str | None:
    """Why a replica may not be at ``ip``:``port``, or ``None`` (the rules of the module docstring).

    Args:
        networks: the allowed replica networks (:func:`parse_networks`).
        kernel: ``(address, port)`` of each of the kernel's own services, resolved.
    """
    inner = embedded_ipv4(ip)
    if inner is not None:
        refusal = ip_refusal(inner, port, networks, kernel)
        if refusal is not None:
            return refusal
    # never "this host", a group, a link's neighbours (cloud metadata) or a reserved range
    if ip.is_unspecified:
        return f"{ip} is unspecified (this host)"
    if ip.is_multicast:
        return f"{ip} is multicast"
    if ip.is_link_local:
        return f"{ip} is link-local"
    if ip == ipaddress.IPv4Address("255.255.255.255") or (ip.is_reserved and not ip.is_loopback):
        return f"{ip} is reserved"
    nets = list(networks)
    if ip.is_loopback and not any(ip in n and _is_loopback_network(n) for n in nets):
        return f"{ip} is loopback, and no loopback network is an allowed replica network"
    if not any(ip.version == n.version and ip in n for n in nets):
        return f"{ip} is in none of the allowed replica networks"
    for service, service_port in kernel:
        # on a loopback the dev stack shares with the kernel, every spelling of it is one host
        same_host = service == ip or (ip.is_loopback and (service.is_loopback or service.is_unspecified))
        if same_host and service_port == port:
            where = f"[{ip}]:{port}" if ip.version == 6 else f"{ip}:{port}"
            return f"{where} is one of the kernel's own services"
    return None


def _is_loopback_network(network: IPNetwork) -> bool:
    return any(network.version == lo.version and network.subnet_of(lo) for lo in _LOOPBACK)  # type: ignore[arg-type]


def url_host_port(address: str) -> tuple[str, int]:
    """The host and port of ``http(s)://host:port`` (the port is required).

    Raises:
        InvalidInput: not such a URL.
    """
    try:
        url = urlsplit(address)
        port = url.port
    except ValueError:
        raise InvalidInput(f"address {address[:100]!r} is not a URL") from None
    if url.scheme not in ("http", "https") or not url.hostname or port is None:
        raise InvalidInput(f"address {address[:100]!r} is not http(s)://host:port")
    return url.hostname, port


def resolve(host: str, port: int) -> tuple[str, ...]:
    """Every address ``host`` resolves to now, as the HTTP client would look it up (``getaddrinfo``,
    TCP); ``()`` when it does not resolve. The impure half: it may wait on DNS (call it in a thread)."""
    try:
        found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return ()
    return tuple(dict.fromkeys(str(info[4][0]).split("%", 1)[0] for info in found))


def addresses_refusal(
    host: str,
    port: int,
    resolved: tuple[str, ...] | None,
    networks: Iterable[IPNetwork],
    kernel: Iterable[tuple[IPAddress, int]],
) -> str | None:
    """Why a replica may not be at ``host``:``port``, or ``None``: ``host`` is an IP address in any
    form the client reads, or a name whose ``resolved`` addresses (``None``: not looked up) every
    one pass :func:`ip_refusal`."""
    try:
        ip = literal_ip(host)
    except InvalidInput as exc:
        return exc.message
    if ip is not None:
        ips: list[IPAddress] = [ip]
    elif resolved is None:
        return f"{host[:80]!r} was not resolved"
    elif not resolved:
        return f"{host[:80]!r} does not resolve"
    elif len(resolved) > MAX_RESOLVED:
        return f"{host[:80]!r} resolves to more than {MAX_RESOLVED} addresses"
    else:
        try:
            ips = [ipaddress.ip_address(a) for a in resolved]
        except ValueError:
            return f"{host[:80]!r} resolves to something that is not an address"
    nets, services = list(networks), list(kernel)
    for one in ips:
        refusal = ip_refusal(one, port, nets, services)
        if refusal is not None:
            return f"{host[:80]!r} is {one}: {refusal}" if ip is None else refusal
    return None


def kernel_services(urls: Iterable[str]) -> frozenset[tuple[IPAddress, int]]:
    """``(address, port)`` of each URL's host, resolved now (impure: :func:`resolve`); a URL without
    a port or that does not parse is skipped."""
    found: set[tuple[IPAddress, int]] = set()
    for url in urls:
        try:
            parts = urlsplit(url.strip())
            host, port = parts.hostname, parts.port
        except ValueError:
            continue
        if not host or port is None:
            continue
        try:
            ip = literal_ip(host)
        except InvalidInput:
            continue
        for text in (str(ip),) if ip is not None else resolve(host, port):
            found.add((ipaddress.ip_address(text), port))
    return frozenset(found)


class KernelUrls(Protocol):
    """What :func:`kernel_endpoints` reads of :class:`core.settings.Settings` (a Protocol, since
    settings import this module to parse networks)."""

    @property
    def nats_url(self) -> str: ...

    @property
    def s3_endpoint(self) -> str: ...


def kernel_endpoints(settings: KernelUrls, *extra: str) -> frozenset[str]:
    """``host:port`` of the NATS servers and the object store in ``settings``, and of ``extra`` URLs
    (the gateway's)."""
    found = set()
    for url in [*settings.nats_url.split(","), settings.s3_endpoint or "", *extra]:
        with contextlib.suppress(ValueError):
            parts = urlsplit(url.strip())
            if parts.hostname and parts.port:
                found.add(f"{parts.hostname}:{parts.port}")
    return frozenset(found)


__all__ = [
    "ANY_NETWORK",
    "LOOPBACK_NETWORKS",
    "addresses_refusal",
    "embedded_ipv4",
    "ip_refusal",
    "kernel_endpoints",
    "kernel_services",
    "literal_ip",
    "parse_networks",
    "resolve",
    "url_host_port",
]
