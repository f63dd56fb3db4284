"""Processes that run together and end together: started (pinned to cores, in a network
namespace, each in a session of its own), watched, stopped as a group, and ended with one line
(docs/design.md, "Traps"). Framework-free: MXNet's launcher runs ps-lite's scheduler, servers and
workers with it, and the cluster in one box (cluster/train.py) runs one command per node.

A group fails fast: the first member that fails, or a check that finds something wrong (a node
stopped, a link down), ends the run; every member is then stopped, and the line that says why
is the failed member's own `error:` line where it left one, else how it ended. Members run in
sessions of their own, so a Ctrl-C reaches the supervisor only, which stops them itself.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from common import config, processes

POLL_S = 0.2
CHECK_S = 1.0  # the checks (a namespace's processes, a link's state) run `ip`: once a second
TERM_GRACE_S = 5.0  # a member given SIGTERM has this long before SIGKILL
TRACEBACK_WAIT_S = 1.0  # a member's traceback waits this long for a failure it may follow from
# Checks of this process's own that every group it watches runs too (common/nodes.py: another
# node here claimed node 0's endpoint): a framework's launcher needs no word of them.
WATCH_ALSO: list[Callable[[], str | None]] = []


class Failed(Exception):
    """The group failed: `line` says why (one line), `code` is the exit code to end with."""

    def __init__(self, line: str, code: int = 1):
        super().__init__(line)
        self.line, self.code = line, code


@dataclass
class Member:
    name: str
    popen: subprocess.Popen
    netns: str | None = None
    last: list = field(default_factory=lambda: [""])  # its last line of output, to end on
    tee: threading.Thread | None = None
    first: bool = False  # its failure is named before the others' (those follow from it)
    ended: list = field(default_factory=lambda: [float("inf")])  # when it ended (monotonic)

    def alive(self) -> bool:
        return self.popen.poll() is None

    def note_end(self) -> None:
        """Wait, in a thread of its own, for the member to end and note when, leaving it to be
        reaped by `popen` (WNOWAIT): of members that failed between two looks, the one that
        ended first is the cause."""
        with contextlib.suppress(ChildProcessError):
            os.waitid(os.P_PID, self.popen.pid, os.WEXITED | os.WNOWAIT)
        self.ended[0] = time.monotonic()


class Group:
    """Members started with `start`, watched with `watch`, stopped with `stop` (and on leaving
    a `with` block). `what`: the run's name in the lines it ends with. `prefix`: pass members'
    output through with their name in front (several nodes), else as it is."""

    def __init__(self, what: str, prefix: bool = False):
        self.what, self.prefix = what, prefix
        self.members: list[Member] = []
        self.quiet = threading.Event()  # once failing: the members' dying words are not shown

    def __enter__(self) -> Group:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(
        self, name, cmd, env=None, cores=None, netns=None, capture="all", first=False, cwd=None
    ) -> Member:
        """Start `cmd` as member `name`: in a session of its own, on `cores` (None: this
        process's), inside network namespace `netns` (`ip netns exec`). `capture`: "all" its
        output, or "stderr" only, passes through this process (its last line kept to end on);
        None: it writes to the terminal. `first`: its failure is the one to name."""
        argv = ["ip", "netns", "exec", netns, *cmd] if netns else list(cmd)
        popen = subprocess.Popen(
            argv,
            env=env,
            cwd=cwd,
            stdout=subprocess.PIPE if capture == "all" else None,
            stderr={"all": subprocess.STDOUT, "stderr": subprocess.PIPE}.get(capture),
            text=True,
            errors="replace",
            start_new_session=True,
            preexec_fn=(lambda: os.sched_setaffinity(0, cores)) if cores else None,
        )
        member = Member(name, popen, netns, first=first)
        threading.Thread(target=member.note_end, daemon=True).start()
        if capture:
            stream = popen.stdout if capture == "all" else popen.stderr
            member.tee = threading.Thread(target=self._tee, args=(member, stream), daemon=True)
            member.tee.start()
        self.members.append(member)
        return member

    def _tee(self, m: Member, stream) -> None:
        """A member's output, passed through but for its error line (the group ends on it
        once) and anything after the group began to fail, or after a member failed."""
        for line in stream:
            if line.strip():
                m.last[0] = line.strip()
            if line.startswith("Traceback (most recent call last)"):
                self._await_failure(m)
            if self._any_failed():
                self.quiet.set()  # one failed, maybe before watch saw it: the rest is aftermath
            if self.quiet.is_set() or line.startswith("error:"):
                continue
            with contextlib.suppress(OSError, ValueError):  # our own stderr closed
                sys.stderr.write(f"[{m.name}] {line}" if self.prefix else line)
                sys.stderr.flush()

    def _any_failed(self, but: Member | None = None) -> bool:
        return any(o is not but and o.popen.poll() not in (None, 0) for o in self.members)

    def _await_failure(self, m: Member) -> None:
        """Hold `m`'s traceback until another member fails or TRACEBACK_WAIT_S pass: a killed
        peer's connections close as it dies, before it can be reaped (and before a launcher
        above it fails), so the survivor's dying words may come first."""
        end = time.monotonic() + TRACEBACK_WAIT_S
        while time.monotonic() < end and not self.quiet.is_set():
            if self._any_failed(but=m):
                return
            time.sleep(0.02)

    def watch(
        self,
        checks: Sequence[Callable[[], str | None]] = (),
        deadline: float | None = None,
        exit_wait: float | None = None,
    ) -> None:
        """Until every member has ended well; raise Failed on the first that fails, on a check
        that returns a reason, past `deadline` s, or (`exit_wait`) when members still run that
        long after the first ended well."""
        begun, first_done, checked = time.monotonic(), None, 0.0
        while True:
            running = any(m.alive() for m in self.members)  # before the codes: see _codes
            self._codes()
            if not running:
                return
            now = time.monotonic()
            if now - checked >= CHECK_S:
                checked = now
                for check in (*checks, *WATCH_ALSO):
                    if reason := check():
                        self.fail(f"error: {self.what}: {reason}; every process was stopped")
            if first_done is None and any(m.popen.poll() == 0 for m in self.members):
                first_done = now
            if exit_wait is not None and first_done is not None and now - first_done > exit_wait:
                late = ", ".join(m.name for m in self.members if m.alive())
                self.fail(
                    f"error: {self.what}: {late} did not exit within {exit_wait:.0f} s after "
                    "the others finished; stopped"
                )
            if deadline is not None and now - begun > deadline:
                self.fail(f"error: {self.what} did not finish within {deadline:.0f} s; stopped")
            time.sleep(POLL_S)

    def _codes(self) -> None:
        """Fail on the first member that ended badly. Every member may end between two looks
        (a failed worker, then the others that followed it): the codes are read after the look
        that saw none running too, so a failed run never reads as a finished one."""
        for m in sorted(self.members, key=lambda m: (not m.first, m.ended[0])):
            rc = m.popen.poll()
            if rc:
                self._failed(m, rc)

    def _failed(self, m: Member, rc: int) -> None:
        self.quiet.set()
        if m.tee is not None:
            m.tee.join(2)  # the rest of its output, up to its last line
        if m.last[0].startswith("error:"):
            self.fail(m.last[0], rc if rc in (2, 4) else 1)
        how = f"was killed by {signal.Signals(-rc).name}" if rc < 0 else f"exited with code {rc}"
        said = f" (its last line: {m.last[0]})" if m.last[0] else ""
        self.fail(
            f"error: {self.what} failed: {m.name} (pid {m.popen.pid}) {how}{said}; every "
            "other process was stopped"
        )

    def fail(self, line: str, code: int = 1) -> None:
        """End the group: its members' output is no longer shown, and Failed is raised (the
        `with` block stops the members)."""
        self.quiet.set()
        raise Failed(line, code)

    def stop(self, grace: float = 0.0) -> None:
        """Stop every member and everything it started: SIGTERM first where `grace` > 0, then
        SIGKILL to its session, and to every process left in its network namespace."""
        self.quiet.set()
        if grace > 0:
            for m in self.members:
                _signal(m, signal.SIGTERM)
                _signal(m, signal.SIGCONT)  # a stopped process acts on SIGTERM once continued
            end = time.monotonic() + grace
            while time.monotonic() < end and any(_left(m) for m in self.members):
                time.sleep(POLL_S)
        for m in self.members:
            _signal(m, signal.SIGKILL)
        for m in self.members:
            with contextlib.suppress(subprocess.TimeoutExpired):
                m.popen.wait(5)
            if m.tee is not None:
                m.tee.join(2)


# --- an engine's launcher of workers (torchrun), supervised from outside ------------------------
# Its workers tell this launcher, through files their environment names: that they are up (a
# run over several machines: every node has joined), their pids (to kill any that outlive the
# engine's launcher), and their one-line error (the run's line, said once for all).
READY_FILE_ENV = "MULTIDEVICE_WORKER_READY_FILE"
PIDS_FILE_ENV = "MULTIDEVICE_WORKER_PIDS_FILE"
ERROR_FILE_ENV = "MULTIDEVICE_WORKER_ERROR_FILE"
DONE_FILE_ENV = "MULTIDEVICE_WORKER_DONE_FILE"  # each worker's exit code, as it ends
WORKER_FILES = (READY_FILE_ENV, PIDS_FILE_ENV, ERROR_FILE_ENV, DONE_FILE_ENV)
LAUNCHER_STOP_S = 40.0  # after SIGTERM, torchrun gives its workers 30 s, then kills them
LAUNCHER_GRACE_S = 5.0  # a launcher whose workers have all ended, or one failed, ends this soon


def run_launcher(
    cmd, env: dict, workers: int, ready_within=None, not_ready="", cwd=None, stop_s=45.0
) -> int:
    """`cmd`, an engine's launcher of `workers` workers here, in a session of its own, to its
    end: its exit code. With `ready_within`, a worker must say it is up within that many
    seconds, else the run ends with `not_ready` (config.ConfigError; a function: the line it
    returns then). A worker stopped (SIGSTOP) for `stop_s` seconds ends the run in one line
    (Stops). Once every worker has ended, or one failed, the launcher has LAUNCHER_GRACE_S
    left: torchrun can wait minutes more for a node that is gone (its store, its exit barrier).
    However it ends (a Ctrl-C here too), the launcher gets SIGTERM to stop its workers, then
    SIGKILL, and any worker that outlived it is killed."""
    ended = None  # when every worker had ended, or one failed
    with Group("launcher") as group:
        member = group.start("launcher", cmd, env, capture=None, cwd=cwd)
        stops = Stops(group, stop_s)  # a stopped worker: its peers would wait for it
        try:
            if ready_within is not None:
                ready, deadline = Path(env[READY_FILE_ENV]), time.monotonic() + ready_within
                while member.alive() and not ready.exists():
                    if time.monotonic() > deadline:
                        raise config.ConfigError(not_ready() if callable(not_ready) else not_ready)
                    time.sleep(POLL_S)
            while True:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    return member.popen.wait(CHECK_S)
                if reason := stops():
                    group.stop()  # at once: a stopped worker would hold the launcher's own stop
                    print(f"error: {reason}; every process was stopped", file=sys.stderr)
                    raise SystemExit(1)
                codes = _done(env)
                if ended is None and (len(codes) >= workers or any(codes)):
                    ended = time.monotonic()
                if ended is not None and time.monotonic() - ended > LAUNCHER_GRACE_S:
                    return max(codes, default=1) if any(codes) else 0
        finally:  # its workers gone, a launcher has nothing left to stop: a short grace
            group.stop(LAUNCHER_STOP_S if ended is None else POLL_S)
            kill_noted(Path(env[PIDS_FILE_ENV]))


def _done(env: dict) -> list[int]:
    """The exit codes the workers noted as they ended."""
    path = Path(env[DONE_FILE_ENV])
    lines = path.read_text().split() if path.is_file() else []
    return [int(code) for code in lines if code.lstrip("-").isdigit()]


def worker_error(env: dict) -> tuple[int, str] | None:
    """(exit code, line) of the first worker that left its error, if one did."""
    said = Path(env[ERROR_FILE_ENV])
    if not said.is_file():
        return None
    code, line = said.read_text().splitlines()[0].split(" ", 1)
    return int(code), line


def kill_noted(pids_file: Path) -> None:
    """SIGKILL the workers that outlived their launcher (one SIGKILLed before it had stopped
    them): the pids they noted, each only if its environment still names that file (a pid may
    have been reused)."""
    mark = f"{PIDS_FILE_ENV}={pids_file}".encode()
    pids = pids_file.read_text().split() if pids_file.is_file() else []
    for pid in map(int, pids):
        with contextlib.suppress(OSError):  # gone already, or not ours to read
            if mark in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
                os.kill(pid, signal.SIGKILL)


def note(name: str, text: str = "") -> bool:
    """A worker's word to its launcher: `text` appended to the file `name` names (READY_FILE_ENV:
    just made), where there is one; whether there was."""
    path = os.environ.get(name)
    if path:
        with open(path, "a") as f:
            f.write(text)
    return bool(path)


def _signal(m: Member, sig: int) -> None:
    """`sig` to the member's session and, in a namespace, to every process there."""
    pids = netns_pids(m.netns) if m.netns else []
    if m.alive():  # a reaped pid may belong to someone else by now
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(m.popen.pid, sig)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def _left(m: Member) -> bool:
    return m.alive() or bool(m.netns and netns_pids(m.netns))


class Stops:
    """A check of `watch`: which member of `group`, or a process it started, has been stopped
    (SIGSTOP, SIGTSTP, a tracer's stop) for `bound` seconds on end (the peers' bound,
    --peer-timeout): its peers would wait for it in a collective until their engine's timeout,
    or for good (ps-lite). A shorter stop (Ctrl-Z and fg, a debugger's look, strace) is no
    fault. `find`: instead of the group's, (pid, who) of every process to look at."""

    def __init__(self, group: Group | None, bound: float, find=None):
        self.bound = bound
        self.find = find or (lambda: _members_pids(group))
        self.since: dict[int, float] = {}  # each stopped process: since when, as seen here

    def __call__(self) -> str | None:
        now, found = time.monotonic(), dict(self.find())
        self.since = {pid: self.since.get(pid, now) for pid in stopped(list(found))}
        for pid, since in self.since.items():
            if now - since >= self.bound:
                how = f"was stopped (SIGSTOP or SIGTSTP) for {now - since:.0f} s (pid {pid})"
                return f"{found[pid]} {how}"
        return None


def _members_pids(group: Group) -> list[tuple[int, str]]:
    """(pid, who) of every live member of `group` and every process it started."""
    found = []
    for m in group.members:
        if m.alive():
            found.append((m.popen.pid, m.name))
            found += [(p, f"a process of {m.name}") for p in processes.descendants(m.popen.pid)]
    return found


def netns_pids(netns: str) -> list[int]:
    """The processes inside network namespace `netns` (`ip netns pids`)."""
    out = subprocess.run(
        ["ip", "netns", "pids", netns], capture_output=True, text=True, timeout=10
    ).stdout
    return [int(p) for p in out.split() if p.isdigit()]


def stopped(pids: Sequence[int]) -> list[int]:
    """The processes of `pids` that are stopped (SIGSTOP, SIGTSTP): state T in /proc."""
    found = []
    for pid in pids:
        with contextlib.suppress(OSError, IndexError), open(f"/proc/{pid}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] in ("T", "t"):  # `pid (comm) state ...`
                found.append(pid)
    return found
