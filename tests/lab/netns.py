"""A small network of namespaces for fault tests: nodes on two bridges, cut and reconnected at will.

The lab runs inside ``unshare -Urnm --fork --kill-child`` (user, network and mount namespaces of
its own), where an unprivileged user is root over its private network: no host interface, route or
firewall is touched, and everything vanishes with the process. :class:`NetLab` builds, in that
namespace:

* two bridges: ``brc`` for clients (``10.77.1.0/24``, the lab itself is ``10.77.1.1`` on it) and
  ``brr`` for cluster routes (``10.77.2.0/24``, the lab is ``10.77.2.1``);
* one network namespace per node, held by a child process (no ``ip netns``: that wants ``/run``),
  with a client interface ``10.77.1.(10+i)`` and a route interface ``10.77.2.(10+i)``, each a veth
  whose other end is a port of its bridge.

Cutting a node's link means taking the bridge-side end of its veth down: the node's side loses its
carrier and nothing crosses until it is up again. :meth:`NetLab.wrap` turns a command into one that
runs in a node's namespace.

Every child this module starts (the holders, and every command run through :meth:`NetLab.wrap`)
asks the kernel to SIGKILL it when its parent dies (``PR_SET_PDEATHSIG``), so a lab killed with
SIGKILL (``--kill-child``) leaves no process behind. The parent is the *thread* that forked: start
them from the main thread.

Run as ``python tests/lab/netns.py hold`` or ``python tests/lab/netns.py run <pid> <netns> -- <argv>``, this
file is that small launcher; it imports nothing but the standard library so that it starts quickly.
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

CLIENT_NET = "10.77.1"
ROUTE_NET = "10.77.2"
CLIENT_BRIDGE = "brc"
ROUTE_BRIDGE = "brr"

_PR_SET_PDEATHSIG = 1
_CLONE_NEWNET = 0x40000000
_INIT_UID_MAP = "0 0 4294967295"


class NetLabError(Exception):
    """The lab's network could not be built or changed; the message says which command failed."""


@dataclass
class Node:
    """One node's network namespace.

    Attributes:
        index: 0, 1, 2...
        holder: the process whose network namespace is the node's.
    """

    index: int
    holder: subprocess.Popen[bytes]

    @property
    def netns(self) -> str:
        """The path of the node's network namespace (``/proc/<holder pid>/ns/net``)."""
        return f"/proc/{self.holder.pid}/ns/net"

    @property
    def client_ip(self) -> str:
        """The address clients reach the node on."""
        return f"{CLIENT_NET}.{10 + self.index}"

    @property
    def route_ip(self) -> str:
        """The address the other nodes' routes reach the node on."""
        return f"{ROUTE_NET}.{10 + self.index}"

    @property
    def client_link(self) -> str:
        """The bridge-side end of the node's client veth (in the lab's namespace)."""
        return f"c{self.index}-br"

    @property
    def route_link(self) -> str:
        """The bridge-side end of the node's route veth (in the lab's namespace)."""
        return f"r{self.index}-br"


class NetLab:
    """The lab's network: bridges and node namespaces, with links to cut and restore.

    Args:
        size: the number of nodes (at most 200: the last octet is ``10 + i``).
    """

    def __init__(self, size: int = 3) -> None:
        self.size = size
        self.nodes: list[Node] = []

    def build(self) -> None:
        """Bring up ``lo``, the two bridges and every node's namespace with its two interfaces.

        Raises:
            NetLabError: not in a private user and network namespace (the lab refuses to touch a
                real host's network), or a command failed.
        """
        ensure_private_network()
        _ip("link", "set", "lo", "up")
        for bridge, net in ((CLIENT_BRIDGE, CLIENT_NET), (ROUTE_BRIDGE, ROUTE_NET)):
            _ip("link", "add", bridge, "type", "bridge")
            _ip("addr", "add", f"{net}.1/24", "dev", bridge)
            _ip("link", "set", bridge, "up")
        for index in range(self.size):
            self.nodes.append(self._add_node(index))

    def _add_node(self, index: int) -> Node:
        node = Node(index, _spawn_holder())
        inside = [("lo", "")]
        for bridge, link, ip in (
            (CLIENT_BRIDGE, node.client_link, node.client_ip),
            (ROUTE_BRIDGE, node.route_link, node.route_ip),
        ):
            peer = link.removesuffix("-br")
            _ip("link", "add", link, "type", "veth", "peer", "name", peer)
            _ip("link", "set", peer, "netns", str(node.holder.pid))
            _ip("link", "set", link, "master", bridge)
            _ip("link", "set", link, "up")
            inside.append((peer, ip))
        for peer, ip in inside:
            if ip:
                self.run_in(node, ["ip", "addr", "add", f"{ip}/24", "dev", peer])
            self.run_in(node, ["ip", "link", "set", peer, "up"])
        return node

    def wrap(self, node: Node, argv: list[str]) -> list[str]:
        """``argv`` as a command that runs in ``node``'s network namespace and dies with us."""
        return [sys.executable, "-S", str(Path(__file__)), "run", str(os.getpid()), node.netns, "--", *argv]

    def run_in(self, node: Node, argv: list[str]) -> None:
        """Run a short command in ``node``'s namespace and wait for it.

        Raises:
            NetLabError: it failed (the message quotes its output).
        """
        _run(self.wrap(node, argv), " ".join(argv))

    def cut_routes(self, node: Node) -> None:
        """Partition ``node`` from the other nodes: its routes' link goes down (clients still reach it)."""
        _ip("link", "set", node.route_link, "down")

    def restore_routes(self, node: Node) -> None:
        """Heal the partition of :meth:`cut_routes`."""
        _ip("link", "set", node.route_link, "up")

    def cut_all(self, node: Node) -> None:
        """Isolate ``node`` entirely: neither the other nodes nor any client reaches it."""
        _ip("link", "set", node.route_link, "down")
        _ip("link", "set", node.client_link, "down")

    def restore_all(self, node: Node) -> None:
        """Heal the isolation of :meth:`cut_all`."""
        _ip("link", "set", node.client_link, "up")
        _ip("link", "set", node.route_link, "up")

    def close(self) -> None:
        """Kill the holders: the namespaces go with the last process in them."""
        for node in self.nodes:
            if node.holder.poll() is None:
                node.holder.kill()
                node.holder.wait()


def ensure_private_network() -> None:
    """Refuse to run unless this process has a user namespace and a network namespace of its own
    with nothing in it but ``lo``: the lab adds bridges and addresses, which on a real host's
    network (run as root without ``unshare``) would do harm.

    Raises:
        NetLabError: not in a fresh private namespace.
    """
    uid_map = " ".join(Path("/proc/self/uid_map").read_text().split())
    if uid_map == _INIT_UID_MAP:
        raise NetLabError(
            "the lab must run in a user namespace of its own: unshare -Urnm --fork --kill-child"
        )
    # if_nameindex asks the kernel about this process's namespace (/sys/class/net may show another)
    links = sorted(name for _, name in socket.if_nameindex())
    if links != ["lo"]:
        raise NetLabError(f"the lab wants an empty network namespace (unshare -n), this one has {links}")


def _spawn_holder() -> subprocess.Popen[bytes]:
    """A child in a new network namespace of its own that does nothing until it is killed."""
    proc = subprocess.Popen(
        [sys.executable, "-S", str(Path(__file__)), "hold", str(os.getpid())],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
    )
    assert proc.stdout is not None
    # The holder says so once it has its namespace: before that, its /proc/<pid>/ns/net is ours.
    if proc.stdout.readline().strip() != b"ready":
        proc.kill()
        proc.wait()
        raise NetLabError("a namespace holder failed to start (unshare(CLONE_NEWNET) refused?)")
    proc.stdout.close()
    return proc


def _ip(*args: str) -> None:
    _run(["ip", *args], "ip " + " ".join(args))


def _run(argv: list[str], what: str) -> None:
    done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=60, check=False)
    if done.returncode != 0:
        output = (done.stderr or done.stdout).decode(errors="replace").strip()
        raise NetLabError(f"`{what}` failed with code {done.returncode}: {output}")


# -- the launcher: the standard library only ------------------------------------------------------


def _die_with(parent: int) -> None:
    """SIGKILL this process when its parent dies (kept across exec), or now if it already has."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        sys.exit(f"prctl(PR_SET_PDEATHSIG): {os.strerror(ctypes.get_errno())}")
    if os.getppid() != parent:  # it died before the prctl took effect
        sys.exit(1)


def _enter(netns: str) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(netns, os.O_RDONLY)
    try:
        if libc.setns(fd, _CLONE_NEWNET) != 0:
            sys.exit(f"setns({netns}): {os.strerror(ctypes.get_errno())}")
    finally:
        os.close(fd)


def _launcher(args: list[str]) -> None:
    match args:
        case ["hold", parent]:
            _die_with(int(parent))
            if ctypes.CDLL(None, use_errno=True).unshare(_CLONE_NEWNET) != 0:
                sys.exit(f"unshare(CLONE_NEWNET): {os.strerror(ctypes.get_errno())}")
            print("ready", flush=True)
            while True:
                signal.pause()
        case ["run", parent, netns, "--", *argv] if argv:
            _die_with(int(parent))
            _enter(netns)
            os.execvp(argv[0], argv)
        case _:
            sys.exit("usage: netns.py hold <parent pid> | run <parent pid> <netns path> -- <argv...>")


if __name__ == "__main__":
    _launcher(sys.argv[1:])
