"""`python -m cluster.train --frameworks torch jax mxnet --nodes 1 2 --links unlimited 1gbit`:
a cluster in one box (`make cluster`), each framework's own multi-node engine inside it.

Every node is a network namespace of its own (common/netns.py) on its own cores, joined to the
others by a link that exists only between them, at a rate `tc` sets; on it runs the command a
user would type on a real machine of a real cluster (resnet18, one device per node by default;
`--workload zero` runs lesson 4's sharded strategies, `--strategy` choosing one):

    python -m <framework>_impl --workload resnet18 --gpus G --cores-per-device K \\
        --nnodes N --node-rank R --rdzv-endpoint 10.213.0.1:29500 ...

torchrun's c10d rendezvous, jax.distributed's coordinator or ps-lite's scheduler on node 0,
each node giving its own address (never its host name, which resolves to loopback here). One
node runs the plain 1-device command in its namespace, on the same cores per device: the
compute that the others are measured against. Before a run of several nodes, the link's latency
and bandwidth are measured over TCP between nodes 0 and 1 (common/link.py).

The run is all or nothing, and ends in bounded time: the nodes are watched together
(common/supervise.py), and a node that fails, stops (SIGSTOP), or loses its link ends the run
within seconds, with one line naming it; every process is stopped and every namespace removed,
also on Ctrl-C, SIGTERM or SIGHUP, and by a janitor of its own when the command is killed
outright (common/netns.py). The cores are held while it runs (common/cores.py): a second
cluster on any of them is refused in one line naming the first. Only a run that ended well on
every node adds its record (the one node 0 or the engine's rank 0 wrote) to --results, with the
nodes, the link and the cores it ran on.
"""

# ruff: noqa: E402 (a stop while the modules import is handled before they import)
from __future__ import annotations

from common import signals

if __name__ == "__main__":
    signals.before_imports()

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from common import (
    checks,
    config,
    cores,
    flops,
    link,
    netns,
    processes,
    results,
    supervise,
    watchdog,
)

ROOT = Path(__file__).resolve().parents[1]
ENGINES = {  # framework: (strategy, what its nodes run)
    "torch": ("ddp", "ring all-reduce (gloo, torch DDP)"),
    "jax": ("sharding", "all-reduce (gloo, XLA)"),
    "mxnet": ("dist", "parameter server (ps-lite, kvstore dist_sync)"),
}
# zero's strategy on each node where --strategy names none: each engine's most sharded one.
ZERO_DEFAULT = {"torch": "zero3", "jax": "fsdp", "mxnet": "server"}
ZERO_ENGINES = {"torch": "gloo", "jax": "gloo, XLA", "mxnet": "ps-lite, kvstore dist_sync"}
PORT = 29500  # node 0's rendezvous port: inside the namespaces nothing else listens
PROBE_PORT = 29499
EXIT_WAIT_S = 60  # every node ends this soon after the first one that finished
STOP_GRACE_S = 5.0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m cluster.train", description=__doc__.split("\n")[0])
    p.add_argument("--frameworks", nargs="+", default=list(ENGINES), choices=list(ENGINES))
    p.add_argument("--nodes", nargs="+", type=int, default=[1, 2], help="node counts to run")
    p.add_argument("--links", nargs="+", default=["unlimited"], help="unlimited, 10gbit, ...")
    p.add_argument("--workload", default="resnet18", choices=config.RESNET18_WORKLOADS)
    p.add_argument(
        "--strategy", default=None, help="the strategy over the nodes (JAX resnet18: shard_map)"
    )
    p.add_argument("--gpus-per-node", type=int, default=1, help="devices on each node")
    p.add_argument("--cores-per-device", type=int, default=1)
    p.add_argument("--preset", default="cpu", choices=config.PRESETS)
    p.add_argument("--epochs", type=int, default=None)
    p.add_argument("--steps-per-epoch", type=int, default=None)
    p.add_argument(
        "--sync-bn", action="store_true", help="BatchNorm over the whole batch of all nodes"
    )
    p.add_argument("--results", default=str(results.DEFAULT_PATH))
    p.add_argument("--timeout", type=float, default=3600.0, help="seconds per cluster run")
    p.add_argument(
        "--peer-timeout",
        type=int,
        default=watchdog.PEER_TIMEOUT_S,
        help="each node's --peer-timeout: seconds it waits for a lost peer or link, and a node "
        "stopped (SIGSTOP) may stay so",
    )
    p.add_argument("--venv", default=str(ROOT / ".venv"))
    p.add_argument("--python", default=None, help="one interpreter for every framework")
    return p


def plan(args) -> list[tuple[str, int, str]]:
    """(framework, nodes, link) of every run: one node once per framework (no link), then
    each link at every larger node count."""
    runs = []
    for fw in args.frameworks:
        if 1 in args.nodes:
            runs.append((fw, 1, "none"))
        runs += [(fw, n, rate) for rate in args.links for n in sorted(args.nodes) if n > 1]
    return runs


def check(args) -> None:
    """Every setting, before any namespace is made: one line for the first that is wrong."""
    if not (math.isfinite(args.timeout) and args.timeout > 0):
        raise config.ConfigError(f"--timeout must be a number of seconds > 0, got {args.timeout}")
    checks.check_seconds("--peer-timeout", args.peer_timeout)
    check_strategy(args)
    nodes = max(args.nodes)  # each link carries a step's gradient within the nodes' bound
    ranks = nodes * args.gpus_per_node if nodes > 1 else 1  # one node's crosses no link
    gradient = flops.gradient_bytes("resnet18")
    check_links(args.links, gradient, ranks, args.peer_timeout, "a resnet18 step's gradient")
    if min(args.nodes) < 1 or args.gpus_per_node < 1 or args.cores_per_device < 1:
        raise config.ConfigError("--nodes, --gpus-per-node and --cores-per-device must be >= 1")
    wanted = max(args.nodes) * args.gpus_per_node * args.cores_per_device
    have = len(cores.allowed())
    if wanted > have:
        raise config.ConfigError(
            f"{max(args.nodes)} node(s) x {args.gpus_per_node} device(s) x "
            f"{args.cores_per_device} core(s) need {wanted} cores; this machine gives {have}"
        )
    results.check_writable(args.results)
    netns.check_can_make()


def check_strategy(args) -> None:
    """--strategy: one that each framework runs over several machines."""
    if args.strategy is None:
        return
    allowed = checks.node_strategies(args.workload)
    for fw in args.frameworks:
        if args.strategy not in allowed[fw]:
            raise config.ConfigError(
                f"{fw} runs {args.workload} over several machines as one of "
                f"{', '.join(allowed[fw])}, not {args.strategy!r}"
            )


def strategy_of(fw: str, nodes: int, args) -> str:
    """One node is the engine's compute alone: Gluon on its one device for MXNet's resnet18,
    whose dist on one node would add a local parameter server that no 1-device run has (torch's
    DDP and JAX's mesh of one device train the plain model). zero's one node runs the strategy
    itself: its sharding over one device is the baseline its nodes are measured against."""
    if args.workload == "zero":
        return args.strategy or ZERO_DEFAULT[fw]
    return args.strategy or (ENGINES[fw][0] if nodes > 1 or fw != "mxnet" else "gluon")


def check_links(rates, payload: int, ranks: int, peer_timeout: int, what: str) -> None:
    """Each link rate is one, and carries an all-reduce of `payload` bytes over `ranks` within
    the nodes' --peer-timeout: past it a node takes the slow link for a lost one (gloo's
    timeout, the watchdog). One line for the first that cannot."""
    for rate in rates:
        bps = netns.rate_bps(rate)
        seconds = link.crossing_s(payload, ranks, bps) if bps else 0.0
        if seconds > peer_timeout:
            raise config.ConfigError(
                f"link {rate}: {what} ({payload / 1e6:.1f} MB over {ranks} ranks) takes about "
                f"{seconds:.0f} s across it, past --peer-timeout {peer_timeout} s, after which a "
                f"node takes its peers for lost: give --peer-timeout {math.ceil(2 * seconds)} or "
                "more, or a faster link"
            )


def cluster_cores(args) -> list[int]:
    """Every core a run of the plan computes on: those of the most nodes."""
    return cores.allowed()[: max(args.nodes) * args.gpus_per_node * args.cores_per_device]


def node_cores(node: int, args) -> list[int]:
    per_node = args.gpus_per_node * args.cores_per_device
    return cores.allowed()[node * per_node : (node + 1) * per_node]


def node_command(fw: str, node: int, nodes: int, args, out: Path, net) -> list[str]:
    python = args.python or str(Path(args.venv) / fw / "bin" / "python")
    cmd = [python, "-m", f"{fw}_impl", "--workload", args.workload]
    cmd += ["--gpus", str(args.gpus_per_node)]
    cmd += ["--platform", "cpu", "--preset", args.preset, "--no-progress"]
    cmd += ["--cores-per-device", str(args.cores_per_device), "--results", str(out)]
    for flag, value in (("--epochs", args.epochs), ("--steps-per-epoch", args.steps_per_epoch)):
        if value is not None:
            cmd += [flag, str(value)]
    cmd += ["--strategy", strategy_of(fw, nodes, args)] + (["--sync-bn"] if args.sync_bn else [])
    if nodes > 1:
        endpoint = f"{net.address(0)}:{PORT}"
        cmd += ["--nnodes", str(nodes), "--node-rank", str(node), "--rdzv-endpoint", endpoint]
        cmd += ["--peer-timeout", str(args.peer_timeout)]
    return cmd


def node_env() -> dict:
    env = dict(os.environ)
    env[link.IFACE_ENV] = netns.IFACE
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env["TORCH_CPP_LOG_LEVEL"] = "ERROR"  # c10d's warning per peer it cannot name (no DNS here)
    env[signals.PARENT_ENV] = str(os.getpid())  # a node ends with this command, even killed
    return env


def measure_link(net: netns.Network) -> dict:
    """Latency and bandwidth between nodes 0 and 1 over their link, before the run."""
    py = [sys.executable, "-m", "common.link"]
    where = [net.address(1), str(PROBE_PORT), "--deadline", "30"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with supervise.Group("the link probe") as group:
        group.start("probe server", [*py, "serve", *where], env, netns=net.ns(1))
        done = subprocess.run(
            ["ip", "netns", "exec", net.ns(0), *py, "probe", *where],
            env=env,
            capture_output=True,
            text=True,
            timeout=90,
        )
    if done.returncode:
        raise supervise.Failed(f"error: the link probe failed: {done.stderr.strip()}")
    return json.loads(done.stdout)


def run_one(fw: str, nodes: int, rate: str, args) -> dict:
    """One cluster run, all or nothing: its record, with the cluster's fields."""
    what = f"{fw} on {nodes} node(s), link {rate}"
    with netns.Network(nodes, "unlimited" if rate == "none" else rate) as net:
        measured = measure_link(net) if nodes > 1 else {}
        with tempfile.TemporaryDirectory() as tmp, supervise.Group(what, prefix=True) as group:
            outs = [Path(tmp) / f"node{i}.jsonl" for i in range(nodes)]
            for i in range(nodes):
                cmd = node_command(fw, i, nodes, args, outs[i], net)
                group.start(f"node {i}", cmd, node_env(), node_cores(i, args), net.ns(i))
            stops = supervise.Stops(None, args.peer_timeout, lambda: node_pids(net, nodes))
            checks = [stops, net.link_problem]
            try:
                group.watch(checks, deadline=args.timeout, exit_wait=EXIT_WAIT_S)
            finally:
                group.stop(STOP_GRACE_S)
            written = [r for out in outs if out.is_file() for r in results.load(out)]
    if len(written) != 1:
        raise supervise.Failed(f"error: {what}: {len(written)} records written, expected one")
    return with_cluster_fields(written[0].to_dict(), fw, nodes, rate, measured, args)


def node_pids(net: netns.Network, nodes: int) -> list[tuple[int, str]]:
    """(pid, its node) of every process of the nodes: a stopped one holds the others in a
    collective (supervise.Stops)."""
    return [(pid, f"node {i}") for i in range(nodes) for pid in supervise.netns_pids(net.ns(i))]


def with_cluster_fields(rec: dict, fw: str, nodes: int, rate: str, measured: dict, args) -> dict:
    extra = rec.setdefault("extra", {})
    extra["nodes"] = nodes
    extra["engine"] = ENGINES[fw][1] if nodes > 1 else "one device"
    if args.workload == "zero" and nodes > 1:
        extra["engine"] = f"{strategy_of(fw, nodes, args)} ({ZERO_ENGINES[fw]})"
    extra["gradient_bytes"] = flops.gradient_bytes("resnet18")
    extra["cores_used"] = [c for i in range(nodes) for c in node_cores(i, args)]
    extra["link"] = {
        "name": rate,
        "rate_bps": None if rate == "none" else netns.rate_bps(rate),
        "measured_bps": measured.get("measured_bps"),
        "latency_s": measured.get("latency_s"),
    }
    return rec


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    return ended(lambda: run_all(args))


def run_all(args) -> None:
    check(args)
    runs = plan(args)
    with cores.held(cluster_cores(args), "cluster"), signals.as_interrupt():
        for i, (fw, nodes, rate) in enumerate(runs, start=1):
            what = f"{fw} {args.workload} on {nodes} node(s), link {rate}"
            print(f"[{i}/{len(runs)}] {what}", flush=True)
            rec = run_one(fw, nodes, rate, args)
            results.append_line(rec, args.results)
            print(f"[{i}/{len(runs)}] ok: {rec['sec_per_epoch']['median']:.3g} s/epoch", flush=True)


def ended(body) -> int:
    """Run `body`; its bad input, a failed run or a stop as one line and the exit code."""
    try:
        body()
    except (config.ConfigError, results.ResultsError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except supervise.Failed as e:
        print(e.line, file=sys.stderr)
        return e.code
    except KeyboardInterrupt as e:
        signals.say_stopped()
        return signals.exit_code(e)
    return 0


if __name__ == "__main__":
    # a stop before main takes its own (its checks, the first namespace) is one line too
    sys.exit(signals.main(lambda: processes.quiet_when_reader_stops(main)))
