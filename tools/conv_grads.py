"""Where a training step's time goes: the workload's forward, its forward and backward, and the
same with the convolution weights frozen (their gradients, the weight-gradient convolutions, not
computed), on one device, in JAX, torch or MXNet. `python -m tools.conv_grads --framework jax
--workload resnet18`, run with the framework's environment (.venv/<framework>/bin/python);
`taskset -c 0` in front of it says what a second core adds (the record says `cores_allowed`).
With `--kernels` (torch, MXNet) it reads oneDNN's own log of the forward and backward instead:
the milliseconds of each kernel, named by its primitive, implementation, pass and problem.
`--compile` (torch) probes the model torch.compiled, as `--compile` trains it.

The probe behind the README's account of where the frameworks' CPU time goes; its records,
with hardware and versions, are in results/conv-grads-*.jsonl. Not a benchmark of the training
loop: one fixed random batch, no optimizer, BatchNorm in training mode, as in a step.
"""

import argparse
import ctypes
import functools
import importlib
import os
import statistics
import sys
import tempfile
import time

import numpy as np

from common import devices as cdevices
from common import processes, results

FRAMEWORKS = ("jax", "torch", "mxnet")
PASSES = ("forward", "forward+backward", "forward+backward, conv weights frozen")
# oneDNN's log of every kernel it runs, switched on by a variable it reads at its first use.
VERBOSE = {"torch": "ONEDNN_VERBOSE", "mxnet": "MKLDNN_VERBOSE"}
MARK = b"=== call\n"


def jax_passes(workload, batch):
    """({pass: a call of its jitted function}, the barrier). The frozen pass wraps the 4-d
    weights (conv kernels) in stop_gradient: XLA then leaves their gradients out."""
    import jax
    from jax import lax

    from jax_impl import lenet, resnet18

    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, 1, 28, 28)).astype("float32")
    y = jax.device_put(rng.integers(0, 10, batch).astype("int32"))
    if workload == "lenet":
        params = lenet.init_params(0.01, 0)

        def loss(p, x, y):
            return lenet.loss_fn(lenet.lenet(x, p), y)
    else:
        net = resnet18.resnet18()
        variables = resnet18.init_weights(net, 0.01, 0)
        params, x = variables["params"], x.transpose(0, 2, 3, 1)  # flax: NHWC

        def loss(p, x, y):
            v = {"params": p, "batch_stats": variables["batch_stats"]}
            return resnet18.loss_fn(net.apply(v, x, train=True, mutable=["batch_stats"])[0], y)

    def frozen(p, x, y):
        return loss(jax.tree.map(lambda w: lax.stop_gradient(w) if w.ndim == 4 else w, p), x, y)

    x = jax.device_put(x)  # an argument, as in a step: a closed-over array is a constant
    fns = (jax.jit(loss), jax.jit(jax.grad(loss)), jax.jit(jax.grad(frozen)))
    passes = {name: (lambda f=f: f(params, x, y)) for name, f in zip(PASSES, fns, strict=True)}
    return passes, jax.block_until_ready


def torch_passes(workload, batch, compiled=False):
    """The same three passes in eager torch, or with the model torch.compiled as `--compile`
    trains it: the frozen one sets requires_grad=False on the 4-d weights, so autograd asks
    oneDNN for no weight gradient (compiled: a graph of its own, compiled in the untimed
    call). A pass returns the gradients (the loss for the forward), as the jitted JAX ones do."""
    import torch

    from torch_impl import devices, lenet, resnet18

    rng = np.random.default_rng(0)
    x = torch.from_numpy(rng.standard_normal((batch, 1, 28, 28)).astype("float32"))
    y = torch.from_numpy(rng.integers(0, 10, batch))
    if workload == "lenet":
        params = lenet.get_params(lenet.init_params(0.01, 0), torch.device("cpu"))
        weights, mod = params, lenet
        forward = devices.compile_function(lenet.lenet, x.device)[0] if compiled else lenet.lenet

        def model(x):
            return forward(x, params)
    else:
        model = resnet18.resnet18()
        resnet18.init_weights(model, 0.01, 0)
        weights, mod = dict(model.named_parameters()), resnet18
        if compiled:
            devices.compile_model(model, torch.device("cpu"))

    def run(frozen=False, backward=True):
        for w in weights.values():
            w.grad = None
            w.requires_grad_(not (frozen and w.ndim == 4))
        with torch.set_grad_enabled(backward):
            loss = mod.loss_fn(model(x), y)
        if not backward:
            return loss
        loss.backward()
        return {name: w.grad for name, w in weights.items()}  # None where frozen

    fns = (lambda: run(backward=False), run, lambda: run(frozen=True))
    return dict(zip(PASSES, fns, strict=True)), lambda out: out


def mxnet_passes(workload, batch):
    """The same three passes in MXNet (resnet18 hybridized, as it trains): the frozen one runs
    a second copy of the model whose 4-d weights have grad_req "null" (toggling it on one
    hybridized block between calls would rebuild its cached graph inside the timing)."""
    import mxnet as mx
    from mxnet import autograd, nd

    from mxnet_impl import lenet, resnet18

    rng = np.random.default_rng(0)
    x = nd.array(rng.standard_normal((batch, 1, 28, 28)).astype("float32"))
    y = nd.array(rng.integers(0, 10, batch).astype("float32"))

    def copy(frozen):
        """(model, {name: weight}) with the 4-d weights' grad_req "null" when frozen."""
        if workload == "lenet":
            params = lenet.get_params(lenet.init_params(0.01, 0), mx.cpu())
            for p in params.values():
                p.attach_grad("null" if frozen and p.ndim == 4 else "write")
            return (lambda x: lenet.lenet(x, params)), params
        net = resnet18.resnet18()
        resnet18.init_weights(net, 0.01, 0)
        net.hybridize()
        params = net.collect_params()
        for p in params.values():
            p.grad_req = "null" if frozen and len(p.shape) == 4 else p.grad_req
        return net, {k: p.data() for k, p in params.items()}

    mod = lenet if workload == "lenet" else resnet18
    (model, weights), (frozen_model, frozen_weights) = copy(False), copy(True)

    def run(model, weights, backward=True):
        with autograd.record() if backward else autograd.train_mode():  # BN: batch statistics
            loss = mod.loss_fn(model(x), y)
        if not backward:
            return loss
        loss.backward()
        return {k: w.grad for k, w in weights.items()}  # None where frozen

    fns = (
        lambda: run(model, weights, backward=False),
        lambda: run(model, weights),
        lambda: run(frozen_model, frozen_weights),
    )
    return dict(zip(PASSES, fns, strict=True)), lambda out: (nd.waitall(), out)[1]


def measure(passes, sync, repeats, calls):
    """Seconds per call of each pass: `repeats` times the mean of `calls` calls in a row, each
    waited for (a step waits for the one before it), the passes taking turns so that a machine
    whose speed drifts slows them alike; one untimed call each first (compilation). Calls in a
    row, because a single call right after another pass runs slower than a step of a training
    loop does (caches and the allocator are cold)."""
    for f in passes.values():
        sync(f())
    times = {name: [] for name in passes}
    for _ in range(repeats):
        for name, f in passes.items():
            start = time.perf_counter()
            for _ in range(calls):
                sync(f())
            times[name].append((time.perf_counter() - start) / calls)
    return times


def logged_calls(step, sync, repeats):
    """oneDNN's log of `repeats` calls of `step` after an untimed one: ([each call's log text],
    [each call's wall seconds]). The log goes to fd 1 (C's stdout, from the framework's worker
    threads too), so fd 1 goes to a file meanwhile, a marker written between calls once C's
    buffers are flushed."""
    libc, walls = ctypes.CDLL(None), []
    with tempfile.TemporaryFile() as log:
        sys.stdout.flush()
        with processes.fd_redirected(1, log.fileno()):
            sync(step())
            for _ in range(repeats):
                libc.fflush(None)
                os.write(1, MARK)
                start = time.perf_counter()
                sync(step())
                walls.append(time.perf_counter() - start)
            libc.fflush(None)
        log.seek(0)
        text = log.read().decode(errors="replace")
    return text.split(MARK.decode())[1:], walls


def parse_kernels(text):
    """{kernel: milliseconds} of one call's log, a kernel named "primitive implementation pass
    problem" and its executions summed. oneDNN 2 (MXNet) writes `dnnl_verbose,exec,cpu,...`,
    oneDNN 3 (torch) `onednn_verbose,v1,primitive,exec,cpu,...`; both end in problem, ms."""
    ms = {}
    for line in text.splitlines():
        f = line.split(",")
        if len(f) < 9 or "exec" not in f[:4]:
            continue
        i = f.index("exec")
        name = " ".join((f[i + 2], f[i + 3], f[i + 4], f[-2]))
        ms[name] = ms.get(name, 0.0) + float(f[-1])
    return ms


def kernels(step, sync, repeats):
    """The record's part for --kernels: each kernel's median ms over the calls (largest
    first), their sum and the calls' wall time (what runs outside oneDNN is the rest)."""
    logs, walls = logged_calls(step, sync, repeats)
    calls = [parse_kernels(text) for text in logs]
    names = {name for call in calls for name in call}
    if not names:
        raise ValueError(
            "oneDNN logged no kernel: it reads its log switch at its first use, so run "
            "--kernels in a process of its own (python -m tools.conv_grads)"
        )
    med = {n: statistics.median(c.get(n, 0.0) for c in calls) for n in names}
    return {
        "pass": PASSES[1],
        "kernels_ms": [[n, med[n]] for n in sorted(names, key=med.get, reverse=True)],
        "onednn_ms": statistics.median(sum(c.values()) for c in calls),
        "wall_ms": statistics.median(walls) * 1e3,
    }


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m tools.conv_grads", description=__doc__[:69])
    p.add_argument("--framework", choices=FRAMEWORKS, required=True)
    p.add_argument("--workload", choices=("lenet", "resnet18"), default="lenet")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--calls", type=int, help="calls in a row per repeat (lenet 10, resnet18 1)")
    p.add_argument(
        "--kernels",
        action="store_true",
        help="torch, mxnet: oneDNN's log of each kernel of `repeats` forward and backward "
        "calls, instead of timing the passes",
    )
    p.add_argument(
        "--compile",
        action="store_true",
        help="torch: the model torch.compiled, as --compile trains it",
    )
    p.add_argument("--results", help="append the record (one JSON line) to this file")
    args = p.parse_args(argv)
    if args.calls is None:
        args.calls = 10 if args.workload == "lenet" else 1
    if min(args.batch, args.repeats, args.calls) < 1:
        p.error("--batch, --repeats and --calls must be at least 1")
    if args.compile and args.framework != "torch":
        p.error(
            "--compile: torch only, as in training (JAX always compiles, MXNet's resnet18 "
            "is hybridized)"
        )
    if args.kernels and args.framework not in VERBOSE:
        p.error(f"--kernels reads oneDNN's log: {' and '.join(VERBOSE)} only (XLA:CPU has none)")
    try:
        if args.results:
            results.check_writable(args.results)  # before minutes of measuring, not after
    except results.ResultsError as e:
        p.error(str(e))
    return p, args


def main(argv=None):
    p, args = parse_args(argv)
    if args.kernels:
        os.environ[VERBOSE[args.framework]] = "1"  # before the framework's first oneDNN call
    if args.framework == "mxnet":
        cdevices.set_mxnet_threads()  # before MXNet loads, as python -m mxnet_impl does
    try:
        devices = importlib.import_module(f"{args.framework}_impl.devices")
    except ModuleNotFoundError as e:
        p.error(f"{e.name} is not installed in this Python: run .venv/{args.framework}/bin/python")
    make = globals()[f"{args.framework}_passes"]
    if args.compile:  # torch only (parse_args)
        make = functools.partial(make, compiled=True)
    passes, sync = make(args.workload, args.batch)
    if args.kernels:
        try:
            measured = kernels(passes[PASSES[1]], sync, args.repeats)
        except ValueError as e:
            p.error(str(e))
    else:
        times = measure(passes, sync, args.repeats, args.calls)
        measured = {
            "seconds": {k: {"median": statistics.median(v), "all": v} for k, v in times.items()}
        }
    vers, hardware = results.environment(devices.versions())
    rec = {
        "probe": "conv_grads",
        **{k: getattr(args, k) for k in ("framework", "workload", "batch", "repeats", "calls")},
        "compiled": args.compile,
        "cores_allowed": cdevices.cores_allowed(),
        "threads": devices.threads(),
        **measured,
        "versions": vers,
        "hardware": hardware,
        "git_commit": results.git_commit(),
        "timestamp": results.utc_now(),
    }
    report(rec)
    if args.results:
        results.append_line(rec, args.results)  # locked, one write: never a half line


def report(rec):
    """Print the record's times: each pass's median, or the largest kernels."""
    head = f"{rec['framework']} {rec['workload']}"
    for name, s in rec.get("seconds", {}).items():
        print(f"{head} {name}: {s['median'] * 1e3:.1f} ms")
    if "kernels_ms" in rec:
        print(f"{head} {rec['pass']}: {rec['wall_ms']:.1f} ms, {rec['onednn_ms']:.1f} in oneDNN")
        for name, ms in rec["kernels_ms"][:12]:
            print(f"{ms:9.2f} ms  {name}")


if __name__ == "__main__":
    sys.exit(main())
