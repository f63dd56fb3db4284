"""`python -m cluster.allreduce --frameworks torch jax mxnet --ranks 2 4 8 --links unlimited
1gbit` (`make collectives`): each engine's all-reduce alone (`<framework>_impl/allreduce.py`),
measured the way nccl-tests measures NCCL's (common/collectives.py).

Every rank is a node of its own, started with the command a user types on a machine of a
cluster (`python -m <framework>_impl --workload allreduce --gpus 1 --nnodes N --node-rank R
--rdzv-endpoint HOST:PORT`), so that the three engines run the same topology: torchrun's c10d
rendezvous and a gloo ring, JAX processes under one coordinator, and ps-lite with a server on
every node. `--ranks`: N nodes on this machine's loopback, sharing its cores (a collective
needs little compute; the records say so). `--links`: 2 nodes, each on a core of its own, in the
cluster in one box (cluster/train.py) at each link rate.

The records go to --results (one line per run, `workload: allreduce`); compare/collectives.py
fits the cost model t(S) = alpha + (2(n - 1)/n) S / busbw to each and draws them.
"""

from __future__ import annotations

import argparse
import math
import socket
import sys
import tempfile
from pathlib import Path

from cluster import train as cluster
from common import checks, config, cores, netns, results, signals, supervise, watchdog
from compare.collectives import fit, fit_text, load

PORT = cluster.PORT
TIMEOUT_S = 900.0  # one run, all its sizes; a lost peer ends it sooner (--peer-timeout)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m cluster.allreduce", description=__doc__.split("\n")[0]
    )
    p.add_argument(
        "--frameworks", nargs="+", default=list(cluster.ENGINES), choices=cluster.ENGINES
    )
    p.add_argument("--ranks", nargs="*", type=int, default=[2, 4, 8], help="loopback rank counts")
    p.add_argument("--links", nargs="*", default=[], help="2 nodes at each: unlimited, 1gbit, ...")
    p.add_argument("--preset", default="cpu", choices=config.PRESETS)
    p.add_argument("--results", default=str(results.DEFAULT_PATH))
    p.add_argument("--timeout", type=float, default=TIMEOUT_S, help="seconds per run")
    p.add_argument(
        "--peer-timeout",
        type=int,
        default=watchdog.PEER_TIMEOUT_S,
        help="each node's --peer-timeout: seconds it waits for a lost peer or link",
    )
    p.add_argument("--venv", default=str(cluster.ROOT / ".venv"))
    p.add_argument("--python", default=None, help="one interpreter for every framework")
    return p


def check(args) -> None:
    """Every setting before anything starts: one line for the first that is wrong."""
    if not (math.isfinite(args.timeout) and args.timeout > 0):
        raise config.ConfigError(f"--timeout must be a number of seconds > 0, got {args.timeout}")
    if any(n < 2 for n in args.ranks):
        raise config.ConfigError(f"--ranks must each be at least 2, got {args.ranks}")
    if not args.ranks and not args.links:
        raise config.ConfigError("nothing to run: give --ranks, --links or both")
    checks.check_seconds("--peer-timeout", args.peer_timeout)
    largest = config.get_config("allreduce", args.preset).max_bytes  # crosses in the bound
    cluster.check_links(args.links, largest, 2, args.peer_timeout, "its largest all-reduce")
    if args.links:
        if len(cores.allowed()) < 2:
            raise config.ConfigError("--links runs 2 nodes of a core each: this machine gives 1")
        netns.check_can_make()
    results.check_writable(args.results)


def node_command(fw: str, node: int, nodes: int, host: str, port: int, out: Path, args):
    python = args.python or str(Path(args.venv) / fw / "bin" / "python")
    cmd = [python, "-m", f"{fw}_impl", "--workload", "allreduce", "--gpus", "1"]
    cmd += ["--platform", "cpu", "--preset", args.preset, "--no-progress", "--results", str(out)]
    return cmd + [
        "--nnodes",
        str(nodes),
        "--node-rank",
        str(node),
        "--rdzv-endpoint",
        f"{host}:{port}",
        "--peer-timeout",
        str(args.peer_timeout),
    ]


def run_nodes(fw: str, nodes: int, args, net: netns.Network | None) -> dict:
    """One run of `nodes` ranks, all or nothing: the record rank 0 wrote."""
    where = f"link {net.rate}" if net else "loopback"
    what = f"{fw} all-reduce on {nodes} node(s), {where}"
    host = net.address(0) if net else "127.0.0.1"
    port = PORT if net else _free_port()
    with tempfile.TemporaryDirectory() as tmp, supervise.Group(what, prefix=True) as group:
        outs = [Path(tmp) / f"node{i}.jsonl" for i in range(nodes)]
        for i in range(nodes):
            cmd = node_command(fw, i, nodes, host, port, outs[i], args)
            pinned = cores.allowed()[i : i + 1] if net else None  # a core per node
            group.start(f"node {i}", cmd, cluster.node_env(), pinned, net.ns(i) if net else None)
        faults = [supervise.Stops(group, args.peer_timeout)]  # a node stopped: its peers wait
        if net:
            faults.append(net.link_problem)
        try:
            group.watch(faults, deadline=args.timeout, exit_wait=cluster.EXIT_WAIT_S)
        finally:
            group.stop(cluster.STOP_GRACE_S)
        written = [r for out in outs if out.is_file() for r in load(out)]
    if len(written) != 1:
        raise supervise.Failed(f"error: {what}: {len(written)} records written, expected one")
    rec = written[0]
    rec["nodes"] = nodes
    rec["link"] = {
        "name": net.rate if net else "loopback",
        "rate_bps": net and netns.rate_bps(net.rate),
    }
    rec["extra"]["cores"] = (
        "a core per node" if net else f"{nodes} ranks share {len(cores.allowed())} core(s)"
    )
    return rec


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def plan(args) -> list[tuple[str, int, str | None]]:
    """(framework, nodes, link) of every run: loopback rank counts, then 2 nodes per link."""
    runs = []
    for fw in args.frameworks:
        runs += [(fw, n, None) for n in sorted(args.ranks)]
        runs += [(fw, 2, rate) for rate in args.links]
    return runs


def held_cores(args) -> list[int]:
    """Every core the plan's runs compute on, held while the command runs, so that no other
    cluster or all-reduce computes there meanwhile (one run at a time, as cluster.train holds
    its own): the loopback ranks share every core this process may use, the 2 linked nodes
    take a core each."""
    return cores.allowed() if args.ranks else cores.allowed()[:2]


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    return cluster.ended(lambda: run_all(args))


def run_all(args) -> None:
    check(args)
    runs = plan(args)
    with cores.held(held_cores(args), "collectives"), signals.as_interrupt():
        for i, (fw, nodes, rate) in enumerate(runs, start=1):
            print(f"[{i}/{len(runs)}] {fw} all-reduce, {nodes} nodes, {rate or 'loopback'}")
            if rate is None:
                rec = run_nodes(fw, nodes, args, None)
            else:
                with netns.Network(nodes, rate) as net:
                    rec = run_nodes(fw, nodes, args, net)
            results.append_line(rec, args.results)
            print(f"[{i}/{len(runs)}] ok: {fit_text(*fit(rec['rows'], rec['ranks']))}", flush=True)


if __name__ == "__main__":
    sys.exit(signals.main(main))
