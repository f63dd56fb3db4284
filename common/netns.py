"""A cluster in one box: one network namespace per node, joined by a switch of their own
(docs/design.md, "A cluster in one box").

Each node is a namespace with its loopback and one interface, `mdt0`, holding its own address
(10.213.0.<node + 1>/24) at the end of a veth pair whose other end is a port of a bridge inside
one more namespace, the switch. The link exists only between those namespaces: no route leads
anywhere else, and nothing is added to the machine's own namespace. A link rate is `tc`'s token
bucket (tbf) on both ends of each node's veth, so a node sends and receives at that rate.
Making and removing namespaces needs CAP_NET_ADMIN (root); without it, one line says so.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
from dataclasses import dataclass

from common import config, processes, supervise

PREFIX = "mdt"  # every namespace this project makes: mdt<pid>-n<i>, mdt<pid>-sw
IFACE = "mdt0"  # each node's interface
SUBNET = "10.213.0"
BURST_S = 0.004  # seconds of traffic a token bucket holds
RATES = {"unlimited": None, "10gbit": 10e9, "1gbit": 1e9, "100mbit": 100e6}


class NetnsError(config.ConfigError):
    """The namespaces cannot be made here: one line saying why and what to do."""


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    try:
        done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    except FileNotFoundError:
        raise NetnsError("the `ip` command is missing: install iproute2") from None
    if check and done.returncode:
        said = (done.stderr.strip() or done.stdout.strip()).splitlines()
        raise NetnsError(f"ip {' '.join(args)}: {said[-1] if said else 'failed'}")
    return done


def rate_bps(name: str) -> float | None:
    """A link rate's bits per second: `unlimited` (None), or a number with gbit, mbit, kbit."""
    if name in RATES:
        return RATES[name]
    match = re.fullmatch(r"(\d+(?:\.\d+)?)(gbit|mbit|kbit)", name)
    if not match or float(match.group(1)) <= 0:
        raise config.ConfigError(
            f"link rate {name!r}: give unlimited or a rate such as 10gbit, 1gbit, 100mbit"
        )
    scale = {"gbit": 1e9, "mbit": 1e6, "kbit": 1e3}[match.group(2)]
    return float(match.group(1)) * scale


@dataclass
class Network:
    """`nodes` namespaces and their switch, tagged with this process's pid."""

    nodes: int
    rate: str = "unlimited"
    tag: str = ""

    def __post_init__(self):
        self.tag = self.tag or f"{PREFIX}{os.getpid()}"
        rate_bps(self.rate)  # checked before anything is made

    def ns(self, node: int) -> str:
        return f"{self.tag}-n{node}"

    @property
    def switch(self) -> str:
        return f"{self.tag}-sw"

    def address(self, node: int) -> str:
        return f"{SUBNET}.{node + 1}"

    def names(self) -> list[str]:
        return [self.switch, *(self.ns(i) for i in range(self.nodes))]

    def __enter__(self) -> Network:
        try:
            self.create()
        except BaseException:
            self.remove()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.remove()

    def create(self) -> None:
        """The switch, then each node's namespace, veth and address; the rate on both ends."""
        remove_stale()
        _ip("netns", "add", self.switch)
        _ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.switch, "link", "set", "br0", "up")
        for i in range(self.nodes):
            ns, port = self.ns(i), f"p{i}"
            _ip("netns", "add", ns)
            _ip(
                "link",
                "add",
                IFACE,
                "netns",
                ns,
                "type",
                "veth",
                "peer",
                port,
                "netns",
                self.switch,
            )
            _ip("-n", ns, "addr", "add", f"{self.address(i)}/24", "dev", IFACE)
            _ip("-n", ns, "link", "set", "lo", "up")
            _ip("-n", ns, "link", "set", IFACE, "up")
            _ip("-n", self.switch, "link", "set", port, "master", "br0", "up")
            if rate_bps(self.rate):
                self._limit(ns, IFACE)
                self._limit(self.switch, port)

    def _limit(self, ns: str, dev: str) -> None:
        """tbf at the link's rate; its bucket holds BURST_S of traffic (at least 64 KiB): no
        smaller than what the kernel hands it at once (a timer tick, a segmentation-offload
        packet), which would cap a fast link below its rate."""
        burst = max(64 << 10, int(rate_bps(self.rate) / 8 * BURST_S))
        tc = ["tc", "qdisc", "add", "dev", dev, "root", "tbf", "rate", self.rate]
        _ip("netns", "exec", ns, *tc, "burst", str(burst), "latency", "100ms")

    def remove(self) -> None:
        """Delete every namespace of this network (their interfaces go with them)."""
        for name in self.names():
            _ip("netns", "delete", name, check=False)

    def link_problem(self) -> str | None:
        """Which node's link is down, seen from the switch: its port without carrier."""
        out = _ip("-n", self.switch, "-o", "link", "show", check=False).stdout
        for i in range(self.nodes):
            line = next((x for x in out.splitlines() if re.search(rf"\bp{i}@", x)), "")
            if "LOWER_UP" not in line or "state DOWN" in line or "NO-CARRIER" in line:
                return f"node {i}'s link went down"
        return None


def existing() -> list[str]:
    """This project's namespaces on the machine (`ip netns list`)."""
    out = _ip("netns", "list", check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.startswith(PREFIX)]


def remove_stale() -> None:
    """Delete the namespaces of a cluster whose process is gone (killed outright, it could not
    remove its own), with any process still inside them."""
    for name in existing():
        owner = re.match(rf"{PREFIX}(\d+)-", name)
        if owner and not processes.alive(int(owner.group(1))):
            for pid in supervise.netns_pids(name):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, 9)
            _ip("netns", "delete", name, check=False)


def check_can_make() -> None:
    """One line where namespaces cannot be made here (not root, no CAP_NET_ADMIN, no ip)."""
    probe = f"{PREFIX}{os.getpid()}-probe"
    done = _ip("netns", "add", probe, check=False)
    if done.returncode:
        said = done.stderr.strip().splitlines()
        raise NetnsError(
            "network namespaces cannot be made here "
            f"({said[-1] if said else 'ip netns add failed'}): the cluster needs root or "
            "CAP_NET_ADMIN"
        )
    _ip("netns", "delete", probe, check=False)
