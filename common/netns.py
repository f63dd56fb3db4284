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
import ctypes
import os
import re
import socket
import struct
import subprocess
import threading
import time
from dataclasses import dataclass

from common import config, processes, supervise

PREFIX = "mdt"  # every namespace this project makes: mdt<pid>-n<i>, mdt<pid>-sw
IFACE = "mdt0"  # each node's interface
SUBNET = "10.213.0"
BURST_S = 0.004  # seconds of traffic a token bucket holds
# tc's token bucket: a byte a second at the least, and its burst (BURST_S of the rate) in 32 bits
MIN_RATE_BPS, MAX_RATE_BPS = 8e3, 1e12
RATES = {"unlimited": None, "10gbit": 10e9, "1gbit": 1e9, "100mbit": 100e6}
CLONE_NEWNET = 0x40000000  # setns(2): a network namespace
LOST_S = 10.0  # a node without an answer from node 0 this long has lost it (a busy link at its
# rate drops a probe now and then, never every one for this long)


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
    bps = float(match.group(1)) * scale
    if not MIN_RATE_BPS <= bps <= MAX_RATE_BPS:
        raise config.ConfigError(
            f"link rate {name!r}: give a rate from 8kbit to 1000gbit (tc's token bucket), or "
            "unlimited"
        )
    return bps


@dataclass
class Network:
    """`nodes` namespaces and their switch, tagged with this process's pid."""

    nodes: int
    rate: str = "unlimited"
    tag: str = ""

    def __post_init__(self):
        self.tag = self.tag or f"{PREFIX}{os.getpid()}"
        self.made: list[str] = []  # the namespaces this network made, to remove
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
        self._janitor = Janitor()
        try:
            self.create()
        except BaseException:
            self.remove()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.remove()

    def _add(self, name: str) -> None:
        """Namespace `name`, made, noted and handed to the janitor: one already there is not
        ours (`ip` refuses it), and neither `remove` nor the janitor touches it."""
        _ip("netns", "add", name)
        self.made.append(name)
        if janitor := getattr(self, "_janitor", None):
            janitor.hold(name)

    def create(self) -> None:
        """The switch, then each node's namespace, veth and address; the rate on both ends."""
        remove_stale()
        self._add(self.switch)
        _ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.switch, "link", "set", "br0", "up")
        for i in range(self.nodes):
            ns, port = self.ns(i), f"p{i}"
            self._add(ns)
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
        """Delete every namespace this network made (their interfaces go with them); the
        janitor then leaves, with nothing left to do."""
        while self.made:
            _ip("netns", "delete", self.made.pop(), check=False)
        if janitor := getattr(self, "_janitor", None):
            janitor.release()

    def link_problem(self) -> str | None:
        """Which node's link is down (its switch port without carrier), or which node has not
        reached node 0 for LOST_S (a bridge deleted or down, a port detached: the carrier
        stays, the link is gone all the same). Called about once a second."""
        out = _ip("-n", self.switch, "-o", "link", "show", check=False).stdout
        for i in range(self.nodes):
            line = next((x for x in out.splitlines() if re.search(rf"\bp{i}@", x)), "")
            if "LOWER_UP" not in line or "state DOWN" in line or "NO-CARRIER" in line:
                return f"node {i}'s link went down"
        return self._unreachable()

    def _unreachable(self) -> str | None:
        """Each node's echo request to node 0 (ICMP, from inside the node's namespace), and
        which node has had no answer for LOST_S: the first such, named."""
        if not hasattr(self, "_probes"):
            self._probes = {i: Echo(self.ns(i), self.address(0)) for i in range(1, self.nodes)}
        for i, probe in self._probes.items():
            if probe.silent_for() > LOST_S:
                return (
                    f"node {i} has not reached node 0 ({self.address(0)}) for {LOST_S:g} s: "
                    "the link or the switch between them is gone"
                )
        return None


# The janitor: names on its stdin, one a line; "." forgets them all (their maker removed them).
# At the end of its stdin, which comes when its maker ends however it ends (SIGKILL too), it
# ends the processes inside those it still holds and deletes them. Plain sh and ip: it starts
# in milliseconds, and needs nothing the machine may lack where namespaces can be made.
JANITOR = """
names=""
while read -r name; do
  if [ "$name" = . ]; then names=""; else names="$names $name"; fi
done
for name in $names; do
  ip netns pids "$name" 2>/dev/null | xargs -r kill -9 2>/dev/null
  ip netns delete "$name" 2>/dev/null
done
"""


class Janitor:
    """A process of its own (its own session: a signal to this command's group spares it)
    that removes the namespaces it was handed once this process is gone, killed outright too,
    where this process could not remove them itself."""

    def __init__(self):
        self.proc = subprocess.Popen(
            ["sh", "-c", JANITOR],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            text=True,
            start_new_session=True,
        )

    def hold(self, name: str) -> None:
        self._say(name)

    def release(self) -> None:
        """Forget every name and leave: this process removed them."""
        self._say(".")
        with contextlib.suppress(OSError):
            self.proc.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)

    def _say(self, line: str) -> None:
        with contextlib.suppress(OSError):  # a janitor gone: remove_stale is still there
            self.proc.stdin.write(f"{line}\n")
            self.proc.stdin.flush()


class Echo:
    """ICMP echo requests from inside namespace `ns` to `address`, and when the last answer
    came. The raw socket is made by a thread that enters the namespace (setns moves only the
    calling thread); a socket keeps the namespace it was made in."""

    def __init__(self, ns: str, address: str):
        made: list = []
        thread = threading.Thread(target=lambda: made.append(_raw_icmp_in(ns)), daemon=True)
        thread.start()
        thread.join(10)
        if not made or isinstance(made[0], Exception):
            raise NetnsError(f"no echo socket in namespace {ns}: {made[0] if made else 'hung'}")
        self.sock, self.address, self.seq = made[0], address, 0
        self.sock.setblocking(False)
        self.answered = time.monotonic()

    def silent_for(self) -> float:
        """Seconds since the last answer, after reading what came and sending one more."""
        with contextlib.suppress(BlockingIOError, InterruptedError):
            while True:
                packet, (source, _) = self.sock.recvfrom(2048)
                header = (packet[0] & 0x0F) * 4  # the IP header a raw socket hands over
                if source == self.address and packet[header] == 0:  # an echo reply
                    self.answered = time.monotonic()
        self.seq = (self.seq + 1) & 0xFFFF
        with contextlib.suppress(OSError):  # no route: the link is gone, silence says so
            self.sock.sendto(_echo_request(os.getpid() & 0xFFFF, self.seq), (self.address, 0))
        return time.monotonic() - self.answered


def _raw_icmp_in(ns: str):
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        with open(f"/var/run/netns/{ns}") as f:
            if libc.setns(f.fileno(), CLONE_NEWNET):
                raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
        return socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)
    except OSError as e:
        return e


def _echo_request(ident: int, seq: int) -> bytes:
    """An ICMP echo request (type 8) with its checksum (RFC 1071)."""
    body = struct.pack("!BBHHH", 8, 0, 0, ident, seq) + b"multidevice"
    total = sum(int.from_bytes(body[i : i + 2], "big") for i in range(0, len(body) - 1, 2))
    total += body[-1] << 8 if len(body) % 2 else 0
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return body[:2] + struct.pack("!H", ~total & 0xFFFF) + body[4:]


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
