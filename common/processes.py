"""Several processes that must meet: their settings from the environment, the coordinator's
address and port, and a bounded wait (docs/design.md, "Devices"); a file descriptor sent
elsewhere for a while, for what C libraries write; a quiet end when stdout's reader stops; a
process stopped with everything it started; and the environment variables a framework reads as
it loads, checked before it is imported (check_environment).

A framework's own wait for its peers can end in a C++ abort or a silent hang; the run instead
checks what it can before the wait and gives the wait a deadline of its own that ends the
process with one line.
"""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from common import config


def env_int(name: str, default: str | None, low: int) -> int:
    """A whole number >= `low` from the environment variable `name` (else `default`)."""
    text = os.environ.get(name, default)
    try:
        value = int(text)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        value = None
    if value is None or value < low:
        raise config.ConfigError(f"{name} must be a whole number >= {low}, got {text!r}")
    return value


def port_of(address: str, name: str) -> int:
    """The port of `host:port` (the environment variable `name` holds it)."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise config.ConfigError(f"{name} must be host:port, got {address!r}")
    return int(port)


def check_port_free(port: int, name: str, taken: str | None = None) -> None:
    """Refuse a port that a server cannot bind on every address (as gRPC binds `[::]:port`,
    with SO_REUSEADDR): another program holds it. `taken`: the line to refuse it with."""
    try:
        probe = socket.socket(socket.AF_INET6)
    except OSError:  # no IPv6 here: probe IPv4's every address instead
        probe = socket.socket(socket.AF_INET)
    with probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("::" if probe.family == socket.AF_INET6 else "", port))
        except OSError as e:
            raise config.ConfigError(
                taken
                or f"port {port} of {name} cannot be used ({e.strerror}): another program "
                "holds it; choose a free port for every process"
            ) from None


def check_own_address(host: str, port: int, line: str) -> None:
    """Refuse, with `line`, a host that is not one of this machine's addresses: a server told
    to listen there cannot (JAX's coordinator then segfaults, ps-lite's scheduler says only
    "bind failed")."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror:
        return  # the caller's own check names an unknown host
    family, _, _, _, address = infos[0]
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as e:
            if e.errno == errno.EADDRNOTAVAIL:
                raise config.ConfigError(line) from None


@contextmanager
def deadline(seconds: float, line: str, code: int) -> Iterator[None]:
    """Run the body; if it has not finished after `seconds`, print `line` on stderr and end the
    process with `code`. The body may be blocked inside C++ (a framework's wait), where no
    exception can reach it: a timer thread ends the process instead."""

    def expire() -> None:
        # The streams may be gone with a killed launcher: the process ends all the same.
        with contextlib.suppress(OSError, ValueError):
            sys.stdout.flush()
            print(line, file=sys.stderr, flush=True)
        os._exit(code)

    timer = threading.Timer(seconds, expire)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


@contextmanager
def fd_redirected(fd: int, target: int) -> Iterator[None]:
    """File descriptor `fd` (1: stdout, 2: stderr) writes to descriptor `target` meanwhile: C
    libraries (oneDNN's log, MXNet's messages) write to the descriptor, past sys.stdout."""
    saved = os.dup(fd)
    try:
        os.dup2(target, fd)
        yield
    finally:
        os.dup2(saved, fd)
        os.close(saved)


def quiet_when_reader_stops(main: Callable[[], int]) -> int:
    """main()'s exit code; but where stdout's reader stops early (`| head`), exit 1 without
    Python's BrokenPipeError traceback, as its docs advise (signal module, "Note on SIGPIPE")."""
    try:
        code = main()
        sys.stdout.flush()  # here, where the error can be caught, not at exit
        return code
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # nothing left to flush
        return 1


STOP_WAIT_S = 60  # a run stops its workers within 45 s of a Ctrl-C (torch_impl/launch.py)


def stop(proc: subprocess.Popen, wait: float | None = None) -> None:
    """End `proc` as a Ctrl-C would: a run then stops the workers it started, which torchrun
    and MXNet's launcher put in sessions of their own, out of reach of a kill of `proc`. Where
    it has not ended within `wait` s (SIGINT ignored, or stuck), SIGKILL it and every process
    it started, found by their parents before any of them is killed. `wait`: STOP_WAIT_S."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(STOP_WAIT_S if wait is None else wait)
        return
    except subprocess.TimeoutExpired:
        pass
    for pid in [proc.pid, *descendants(proc.pid)]:
        with contextlib.suppress(ProcessLookupError):  # ended meanwhile
            os.kill(pid, signal.SIGKILL)
    proc.wait()


def alive(pid: int) -> bool:
    """Whether process `pid` exists (another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def descendants(pid: int) -> list[int]:
    """The processes `pid` started, and theirs, from /proc (Linux), whatever their sessions."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:  # `pid (comm) state ppid ...`; comm may hold spaces and parentheses
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile
        children.setdefault(ppid, []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        kids = children.get(todo.pop(), [])
        found += kids
        todo += kids
    return found


# --- the environment a framework reads as it loads ------------------------------------------------
# Some variables are read by a framework's C++ as it is imported, where a bad value ends the
# process in an abort or a fatal log, or makes it hang; they are checked here first.

PS_LITE_SKIPPED = ("DMLC_LOG_",)  # dmlc's own logging settings: harmless in any run


def check_environment(
    framework: str, workload: str, strategy: str | None, env: Mapping[str, str] | None = None
) -> None:
    """Refuse, in one line (config.ConfigError), an environment that would crash or hang
    `framework` running `workload` with `strategy` (None: the workload's default); called
    before the framework is imported. `env`: os.environ. Checks OMP_NUM_THREADS (every
    framework), XLA_FLAGS (JAX), GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME (torch) and
    ps-lite's DMLC_* (MXNet), DMLC_INTERFACE among them."""
    env = os.environ if env is None else env
    _check_omp_threads(env)
    if framework == "jax":
        _check_xla_flags(env)
    if framework == "torch":
        _check_interface(env, "GLOO_SOCKET_IFNAME")
        _check_interface(env, "NCCL_SOCKET_IFNAME", nccl=True)
    if framework == "mxnet":
        _check_interface(env, "DMLC_INTERFACE")
        _check_ps_lite(env, workload, strategy)


def _check_omp_threads(env: Mapping[str, str]) -> None:
    """MXNet aborts in C++ on a value that is not a whole number, libgomp ignores one below 1
    with a warning of its own: a thread count must be a whole number >= 1."""
    text = env.get("OMP_NUM_THREADS")
    if text is None:
        return
    # (at most a C int: MXNet parses it into one)
    if not (re.fullmatch(r"\s*[0-9]+\s*", text) and 1 <= int(text) < 1 << 31):
        raise config.ConfigError(
            f"OMP_NUM_THREADS must be a whole number >= 1 (threads per process), got {text!r}; "
            "set it to one, or unset it"
        )


# One flag of XLA_FLAGS: `--name` or `--name=value`. Only the syntax is checked: which names
# XLA knows changes with every jaxlib, and it ends the process on one it does not know.
XLA_FLAG = re.compile(r"--[A-Za-z_][A-Za-z0-9_]*(=.*)?", re.S)


def _check_xla_flags(env: Mapping[str, str]) -> None:
    """XLA reads XLA_FLAGS as flags (`--name[=value]` separated by spaces) when it starts with
    `-`, else as the name of a file of flags; it ends the process on anything else."""
    text = env.get("XLA_FLAGS", "").strip()
    if not text:
        return
    if not text.startswith("-"):
        if not os.path.isfile(text):
            raise config.ConfigError(
                f"XLA_FLAGS={text!r} is neither flags (--name=value ...) nor a file of them; "
                "fix it, or unset XLA_FLAGS"
            )
        return
    try:
        flags = shlex.split(text)
    except ValueError as e:  # an unclosed quote
        raise config.ConfigError(f"XLA_FLAGS cannot be read ({e}); fix it, or unset it") from None
    bad = [flag for flag in flags if not XLA_FLAG.fullmatch(flag)]
    if bad:
        raise config.ConfigError(
            f"XLA_FLAGS holds {bad[0]!r}, which is not --name or --name=value; XLA ends the "
            "process on it: fix it, or unset XLA_FLAGS"
        )


def _check_interface(env: Mapping[str, str], name: str, nccl: bool = False) -> None:
    """A network interface named by `name` (a comma-separated list) must exist here: gloo,
    NCCL and ps-lite otherwise fail in every worker, each with a traceback, or wait. NCCL's
    names are prefixes (`eth` is eth0 too), exact after `=`, and after `^` ones to avoid."""
    text = env.get(name)
    if text is None or (nccl and text.startswith("^")):
        return
    present = network_interfaces()
    if nccl and text.startswith("="):
        text, nccl = text[1:], False
    missing = [
        i
        for i in text.split(",")
        if not any(p == i.strip() or (nccl and p.startswith(i.strip())) for p in present)
    ]
    if missing or not text.strip():
        raise config.ConfigError(
            f"{name}={text} names no network interface of this machine "
            f"(it has: {', '.join(sorted(present)) or 'none'}); set it to one of those, "
            f"or unset it"
        )


def network_interfaces() -> set[str]:
    """The names of this machine's network interfaces."""
    try:
        return {name for _, name in socket.if_nameindex()}
    except OSError:
        with contextlib.suppress(OSError):
            return {p.name for p in Path("/sys/class/net").iterdir()}
    return set()


def _check_ps_lite(env: Mapping[str, str], workload: str, strategy: str | None) -> None:
    """ps-lite's variables make importing MXNet join a parameter server (DMLC_ROLE) or set one
    up: only `--strategy dist` uses them, as a worker (DMLC_ROLE=worker, started by the launcher
    or by hand) or as the launcher (DMLC_ROLE unset; DMLC_NUM_WORKER, DMLC_NUM_SERVER and
    DMLC_PS_ROOT_PORT are its settings). A run that is neither would crash or wait forever."""
    role = env.get("DMLC_ROLE")
    ps_lite = strategy == "dist" or (workload == "zero" and strategy == "server")
    if ps_lite and workload in ("resnet18", "zero", "allreduce"):
        if role is None or role == "worker":
            return
        raise config.ConfigError(
            f"DMLC_ROLE={role}: python -m mxnet_impl runs as a worker (DMLC_ROLE=worker) or, "
            "with DMLC_ROLE unset, starts every process itself; a scheduler or server is "
            "`python -c 'import mxnet'`"
        )
    found = sorted(k for k in env if k.startswith("DMLC_") and not k.startswith(PS_LITE_SKIPPED))
    if found:
        names = " ".join(found)
        raise config.ConfigError(
            f"{names} set (left from a kvstore dist run?): MXNet would join a parameter server, "
            f"which only --strategy dist uses; unset them (unset {names})"
        )


# --- a node's own address, where its host name may resolve to loopback ---------------------------


def route_to(host: str, port: int) -> tuple[str, str | None]:
    """(this machine's address toward `host`, the interface that holds it): what a node of a
    multi-node run advertises to the others and binds its collectives to. A host name can
    resolve to 127.0.0.1 (Debian's /etc/hosts maps it to 127.0.1.1), so engines that advertise
    the host name send their peers to themselves; the route to node 0 names the right one."""
    try:
        found = socket.getaddrinfo(host.strip("[]"), port, type=socket.SOCK_DGRAM)
        family, _, _, _, where = found[0]
        with socket.socket(family, socket.SOCK_DGRAM) as probe:  # no packet is sent
            probe.connect(where)
            address = probe.getsockname()[0]
    except OSError as e:
        raise config.ConfigError(
            f"no route from this machine to {host}:{port} ({e.strerror or e}); give node 0's "
            "address, reachable from here"
        ) from None
    return address, interface_of(address)


def loopback(host: str) -> str | None:
    """The address that `host` names where it is this machine's loopback (127.0.0.1, ::1,
    localhost), else None: nodes that meet there all run on this machine, and a run on one
    machine listens there only."""
    try:
        found = socket.getaddrinfo(host.strip("[]"), None, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError):
        return None
    addresses = [info[4][0] for info in found]
    if addresses and all(ipaddress.ip_address(a).is_loopback for a in addresses):
        return addresses[0]
    return None


def interface_of(address: str) -> str | None:
    """The name of the interface that holds the IPv4 `address` (None: none found)."""
    import fcntl
    import struct

    siocgifaddr = 0x8915
    for _, name in socket.if_nameindex():
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            try:
                raw = fcntl.ioctl(s.fileno(), siocgifaddr, struct.pack("256s", name.encode()[:15]))
            except OSError:  # no IPv4 address on it
                continue
        if socket.inet_ntoa(raw[20:24]) == address:
            return name
    return None
