"""Hosts of the test's own: one Linux network namespace per node, each with a veth link into a hub
namespace that holds the bridge between them, and one veth link from the test's own namespace
into the hub (the test is the load balancer and the operator: it reaches every node's address).

Nothing else of the machine's network changes: the bridge lives in the hub namespace, the host
namespace gains one veth of ours on a /24 no route of the host's uses, and every namespace (with
its links, its nftables rules and its processes) is deleted when the `Network` closes, on failure
too. Needs root, iproute2 and nftables.

Partitions: `isolate(node)` takes the node's link down (it reaches no one and no one reaches it);
`cut(a, b)` drops every packet between two nodes with nftables inside `a`'s namespace, both ways,
while both keep talking to everyone else."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from contextlib import contextmanager


def available() -> str | None:
    """Why the namespaces cannot be made here, or None."""
    if os.geteuid() != 0:
        return "not root"
    for tool in ("ip", "nft"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (apt-get install iproute2 nftables)"
    return None


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], check=check, capture_output=True, text=True, timeout=30)


class Network:
    def __init__(self, nodes: list[str]) -> None:
        tag = os.getpid() % 250 + 1
        self.prefix = f"ul{os.getpid()}"
        self.subnet = f"10.231.{tag}"
        self.hub = f"{self.prefix}-hub"
        self.nodes = {name: f"{self.subnet}.{n + 10}" for n, name in enumerate(nodes)}
        self.host_ip = f"{self.subnet}.254"
        self.host_link = f"ulh{os.getpid()}"[:15]
        self.made: list[str] = []

    def ns(self, node: str) -> str:
        return f"{self.prefix}-{node}"

    def ip(self, node: str) -> str:
        return self.nodes[node]

    def up(self) -> None:
        _ip("netns", "add", self.hub)
        self.made.append(self.hub)
        _ip("-n", self.hub, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.hub, "link", "set", "br0", "up")
        _ip("-n", self.hub, "link", "set", "lo", "up")
        for n, (node, address) in enumerate(self.nodes.items()):
            ns = self.ns(node)
            _ip("netns", "add", ns)
            self.made.append(ns)
            _ip("-n", ns, "link", "set", "lo", "up")
            # Both ends are created in the node's namespace, then one moves to the hub.
            _ip("-n", ns, "link", "add", "eth0", "type", "veth", "peer", "name", f"p{n}")
            _ip("-n", ns, "link", "set", f"p{n}", "netns", self.hub)
            _ip("-n", ns, "addr", "add", f"{address}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
            _ip("-n", self.hub, "link", "set", f"p{n}", "master", "br0")
            _ip("-n", self.hub, "link", "set", f"p{n}", "up")
        _ip("link", "add", self.host_link, "type", "veth", "peer", "name", "ph", "netns", self.hub)
        _ip("addr", "add", f"{self.host_ip}/24", "dev", self.host_link)
        _ip("link", "set", self.host_link, "up")
        _ip("-n", self.hub, "link", "set", "ph", "master", "br0")
        _ip("-n", self.hub, "link", "set", "ph", "up")

    def down(self) -> None:
        for ns in reversed(self.made):
            for pid in _ip("netns", "pids", ns, check=False).stdout.split():
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass
        time.sleep(0.2)
        _ip("link", "del", self.host_link, check=False)
        for ns in reversed(self.made):
            _ip("netns", "del", ns, check=False)
        self.made = []

    def exec(self, node: str) -> list[str]:
        """The command prefix that runs a program on `node`."""
        return ["ip", "netns", "exec", self.ns(node)]

    def isolate(self, node: str) -> None:
        _ip("-n", self.ns(node), "link", "set", "eth0", "down")

    def rejoin(self, node: str) -> None:
        _ip("-n", self.ns(node), "link", "set", "eth0", "up")
        _ip("-n", self.ns(node), "addr", "replace", f"{self.ip(node)}/24", "dev", "eth0")

    def cut(self, a: str, b: str) -> None:
        peer = self.ip(b)
        self._nft(a, f"""table inet cut_{b} {{
  chain output {{ type filter hook output priority 0; ip daddr {peer} drop; }}
  chain input {{ type filter hook input priority 0; ip saddr {peer} drop; }}
}}""")

    def heal(self, a: str, b: str) -> None:
        subprocess.run([*self.exec(a), "nft", "delete", "table", "inet", f"cut_{b}"], capture_output=True, timeout=30)

    def _nft(self, node: str, ruleset: str) -> None:
        subprocess.run([*self.exec(node), "nft", "-f", "-"], input=ruleset, text=True, check=True,
                       capture_output=True, timeout=30)


@contextmanager
def network(nodes: list[str]):
    net = Network(nodes)
    try:
        net.up()
        yield net
    finally:
        net.down()
