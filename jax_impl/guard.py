"""The operations layer around jax_impl/launch.py's `join`: what keeps several JAX processes
robust, applied around the lesson's call (`joining`), not inside it (docs/design.md, "Traps").

- Settings: --nnodes sets JAX's own variables (one process per node); bad JAX_* values, and a
  strategy other than sharding over several processes, are one line each.
- A bound: `jax.distributed.initialize` cannot be interrupted, and past its own timeout it aborts
  the process with a C++ stack dump; its coordinator segfaults on a taken port. The port is
  probed first, and a timer thread (common.processes.deadline) ends the wait earlier, in one
  line (JAX_INIT_TIMEOUT, default 60 s).
- Sockets: the coordinator listens on the address it is given, not every interface (127.0.0.1:
  this machine only), and gloo, JAX's CPU collectives, binds to this machine's interface toward
  the coordinator; jax has no public setting for that, so its CPU backend factory is registered
  again with one (jax._src, before any backend starts).
- No preemption service: it takes SIGTERM for itself, where a SIGTERM stops this run as a
  Ctrl-C does.
- A goodbye: every process waits at exit for the others' (`jax.distributed.shutdown`); each
  says it once, also one ended by a stop its main thread could not take up (inside a
  collective), or the others abort.
"""

import functools
import os
import signal
import subprocess
import sys

from common import checks, cli, config, processes, signals

# jax's own limit on the wait: past it, it aborts the process
ABORT_AFTER_S = checks.MAX_TIMEOUT_S + 60
WRAPPED_ENV = "MULTIDEVICE_JAX_WRAPPED"  # this process is run_wrapped's child
# XLA's lines as its distributed service ends a process that lost another (a glog E and F line,
# then a C++ stack and Python's own dump): from the first, the rest is not shown.
ABORT_MARKS = ("coordination_service_agent.cc", "client.h:80]", "JAX distributed service detected")
# XLA's errors (JaxRuntimeError) when a collective or the coordinator's store waits for a peer
# that went, raised in the main thread with a traceback.
LOST_MARKS = ("DEADLINE_EXCEEDED", "UNAVAILABLE", "CoordinationServiceError")
MAX_INIT_S = checks.MAX_TIMEOUT_S  # JAX_INIT_TIMEOUT's bound, so that this one ends it first


def joining(join):
    """`launch.join` with JAX's settings checked and set before it, its wait bounded, and the
    goodbye registered after it, for a process of several."""

    @functools.wraps(join)
    def joined(plan, args=None):
        count = _processes(args)
        if count < 2:
            return join(plan, args)
        allowed = _over_processes(args)
        if getattr(args, "strategy", None) not in (None, *allowed):
            raise config.ConfigError(
                f"several JAX processes need --strategy {' or '.join(allowed)}, not {args.strategy}"
            )
        rank, address, timeout = _settings(count)
        _listen_where_told(address, plan.platform)
        with processes.deadline(
            timeout, _not_joined(rank, count, address, timeout), cli.EXIT_BAD_INPUT
        ):
            world = join(plan, args)
        import jax

        # The coordinator's count rules: jax would go on. Refused before the goodbye is
        # registered: the others train on and never come to its barrier.
        if jax.process_count() != count:
            raise config.ConfigError(
                f"this process was given {count} JAX processes (JAX_NUM_PROCESSES, --nnodes) and "
                f"{jax.process_count()} joined: give every process the same count"
            )
        signals.on_leaving(jax.distributed.shutdown)
        return world

    return joined


def _over_processes(args) -> tuple[str, ...]:
    """The strategies that run as one program over every process's devices: a Mesh of them all
    (lesson 2's sharding and shard_map; lesson 4's, which shard over the same Mesh)."""
    return checks.node_strategies(getattr(args, "workload", None))["jax"]


def wrapped(argv: list[str]) -> bool:
    """Whether this command is a process of several (--nnodes, JAX_NUM_PROCESSES > 1) that is
    not yet run_wrapped's child."""
    several = any(a == "--nnodes" or a.startswith("--nnodes=") for a in argv)
    count = os.environ.get("JAX_NUM_PROCESSES", "1")
    several = several or (count.isdigit() and int(count) > 1)
    return several and not os.environ.get(WRAPPED_ENV)


def run_wrapped(argv: list[str]) -> int:
    """This command again, as a child whose stderr passes through here: when JAX's distributed
    service ends it for a lost peer (an abort: a C++ stack and Python's dump, exit -6), the
    node's output ends in one line instead. The child runs in a session of its own: a stop
    signal to this process (a Ctrl-C at its terminal, `kill -INT`, SIGTERM, SIGHUP) is passed
    on to it once, and it says the line."""
    env = {**os.environ, WRAPPED_ENV: "1", signals.PARENT_ENV: str(os.getpid())}
    child = subprocess.Popen(
        [sys.executable, "-m", "jax_impl", *argv],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
        errors="replace",
        start_new_session=True,
    )
    for sig in (signal.SIGINT, *signals.STOPS):
        if signal.getsignal(sig) is not signal.SIG_IGN:  # `nohup`'s stays ignored, as the child's
            signal.signal(sig, lambda signum, _: child.send_signal(signum))
    aborted, held = False, []
    for line in child.stderr:
        aborted = aborted or any(mark in line for mark in ABORT_MARKS)
        held += [line] if held or line.startswith("Traceback (most recent call last)") else []
        if not aborted and not held:
            sys.stderr.write(line)
            sys.stderr.flush()
    code = child.wait()
    lost = _lost_a_peer(held)
    if code and (aborted or lost):
        what = f"XLA said: {lost}" if lost else "JAX's distributed service ended this process"
        print(
            f"error: {what}: another process of the run, or the link to it, went (that node's "
            "output says which)",
            file=sys.stderr,
        )
        return 1
    sys.stderr.writelines(held)  # any other traceback is a bug's: shown as it came
    return 128 - code if code < 0 else code


def _lost_a_peer(traceback: list[str]) -> str | None:
    """What the error a traceback ends with says, where it is XLA's for a peer that went: a
    collective or the coordinator's store timed out, or the peer is unreachable."""
    for line in traceback:
        kind, _, said = line.partition(": ")
        if kind.endswith("RuntimeError") and any(mark in said for mark in LOST_MARKS):
            said = said.split(" [type.googleapis", 1)[0].strip()
            return said.removeprefix("UNKNOWN: ")
    return None


def _processes(args) -> int:
    """How many processes the run has: JAX_NUM_PROCESSES, which --nnodes sets with the rest of
    jax.distributed's settings (one process per node)."""
    if getattr(args, "nnodes", None):
        os.environ.update(
            JAX_COORDINATOR_ADDRESS=args.rdzv_endpoint,
            JAX_NUM_PROCESSES=str(args.nnodes),
            JAX_PROCESS_ID=str(args.node_rank),
            JAX_INIT_TIMEOUT=str(args.rdzv_timeout or cli.RDZV_TIMEOUT_S),
        )
    return processes.env_int("JAX_NUM_PROCESSES", "1", 1)


def _settings(count: int) -> tuple[int, str, int]:
    """(this process's id, the coordinator's address, the seconds to wait for the others),
    checked: one line for each bad value."""
    if "JAX_COORDINATOR_ADDRESS" not in os.environ or "JAX_PROCESS_ID" not in os.environ:
        raise config.ConfigError(
            "JAX_NUM_PROCESSES is set: also set JAX_COORDINATOR_ADDRESS and JAX_PROCESS_ID"
        )
    rank = processes.env_int("JAX_PROCESS_ID", None, 0)
    if rank >= count:
        raise config.ConfigError(
            f"JAX_PROCESS_ID={rank} of {count} processes: use 0 to {count - 1}"
        )
    address = os.environ["JAX_COORDINATOR_ADDRESS"]
    port = processes.port_of(address, "JAX_COORDINATOR_ADDRESS")
    if rank == 0:  # jax segfaults when its coordinator cannot bind the address or the port
        host = address.rpartition(":")[0].strip("[]")
        processes.check_own_address(
            host,
            port,
            f"process 0 runs the coordinator at JAX_COORDINATOR_ADDRESS={address}, but {host} "
            "is not this machine's address: start process 0 (--node-rank 0) where it is",
        )
        processes.check_port_free(port, "JAX_COORDINATOR_ADDRESS")
    timeout = processes.env_int("JAX_INIT_TIMEOUT", "60", 1)
    if timeout > MAX_INIT_S:
        raise config.ConfigError(f"JAX_INIT_TIMEOUT={timeout}: at most {MAX_INIT_S} s")
    return rank, address, timeout


def _listen_where_told(address: str, platform: str) -> None:
    """The coordinator on `address` only, no preemption service, and (CPU) gloo toward it."""
    import jax

    os.environ["JAX_COORDINATOR_BIND_ADDRESS"] = address
    jax.config.update("jax_enable_preemption_service", False)
    if platform == "cpu":
        _gloo_towards(address)


def _not_joined(rank, count, address, timeout):
    """What to do when the processes did not all meet in time, as seen from process `rank`."""
    if rank == 0:
        ids = "1" if count == 2 else f"1 to {count - 1}"
        what = f"process {ids} of {count} did not join within {timeout} s; start it"
    else:
        ids = f"0 (the coordinator) to {count - 1}"
        what = f"process {rank} of {count} waited {timeout} s for the others; start them"
    return (
        f"error: {what} with JAX_PROCESS_ID={ids}, JAX_NUM_PROCESSES={count} and "
        f"JAX_COORDINATOR_ADDRESS={address} (or raise JAX_INIT_TIMEOUT)"
    )


def _gloo_towards(address: str) -> None:
    """Bind the CPU collectives (gloo) to this machine's interface toward the coordinator: by
    default gloo listens on, and advertises, the address the host name resolves to, which can
    be loopback (peers on other machines then reach themselves) or another network than the
    one the run was given."""
    from jax._src import distributed, xla_bridge
    from jaxlib import _jax

    _, interface = processes.route_to(*address.rsplit(":", 1))

    def cpu_client():
        client = distributed.global_state.client
        gloo = _jax.make_gloo_tcp_collectives(distributed_client=client, interface=interface)
        return xla_bridge.make_cpu_client(collectives=gloo)

    xla_bridge.register_backend_factory("cpu", cpu_client, priority=0, fail_quietly=False)
