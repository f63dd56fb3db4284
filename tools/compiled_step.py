"""Where torch's compiled ResNet-18 step loses time on one GPU: the ceiling's step
(resnet18.train_step on one fixed batch, the model torch.compiled as --compile compiles it)
against the same step with one of the training loop's additions at a time, and against other
ways of running the loss and the SGD update. `python -m tools.compiled_step [--amp bf16]`,
with the torch environment; on a CPU `--batch 8 --steps 3 --rounds 1` checks that it runs.

Each variant is timed over `--steps` steps, queued without a barrier, then the device's barrier:
"ms/step" is the whole, "host ms/step" the time to queue the steps (near the whole: the host
holds the GPU back). Variants take turns over `--rounds` rounds; each line is a median. Prints a
table and, with `--results`, appends it as one JSON line (hardware, versions, commit). A probe,
not a benchmark of the loop: the training records (--ceiling) measure that.
"""

import argparse
import statistics
import sys
import time

import numpy as np
import torch

from common import config, data, processes, results, utilization
from torch_impl import devices as tdev
from torch_impl import resnet18


def partial_size(n_images, batch):
    """The epoch's last, partial batch (Fashion-MNIST at the full preset's 256: 60000 = 234 x
    256 + 96), or half a batch where `batch` divides the set: a second batch shape either way."""
    return n_images % batch or max(batch // 2, 1)


def _net(cfg, device, amp):
    """The ResNet-18 as the ceiling (and the training run) builds it on `device`."""
    net = resnet18.init_weights(resnet18.resnet18(amp=amp), cfg.init_std, cfg.seed).to(device)
    return tdev.gpu_layout(net, device)


def build(cfg, device, amp, fused=False, compiled=True):
    """(net, step, warm-up calls per batch shape) as the ceiling builds its step; `fused`:
    torch's fused SGD kernel in place of its default (one foreach kernel per group of tensors)."""
    net = _net(cfg, device, amp)
    calls = tdev.compile_model(net, device) if compiled else 1
    opt = torch.optim.SGD(net.parameters(), lr=cfg.lr, fused=fused or None)
    return net, (lambda x, y: resnet18.train_step(net, opt, x, y)), calls


def build_loss_in_graph(cfg, device, amp, compiled=True):
    """(net, step): the step with the loss compiled into the model's graph (its backward too),
    the model itself not compiled apart."""
    net = _net(cfg, device, amp)  # autocast inside the model's forward, as in training
    opt = torch.optim.SGD(net.parameters(), lr=cfg.lr)

    def loss(x, y):
        return resnet18.loss_fn(net(x), y)

    loss = tdev.compile_function(loss, device)[0] if compiled else loss

    def step(x, y):
        torch.compiler.cudagraph_mark_step_begin()
        opt.zero_grad(set_to_none=True)
        value = loss(x, y)
        value.backward()
        opt.step()
        return value.detach()

    return net, step


def inputs(cfg, device, steps, fm):
    """The training set and four batches of the test set (of `fm`, Fashion-MNIST) on the device,
    `steps` batch index tensors as the loop draws them, and the partial batch's indices."""
    n = 4 * cfg.batch_size
    ds = (fm.train_images, fm.train_labels, fm.test_images[:n], fm.test_labels[:n])
    # as the training loop puts them
    x_train, y_train, *test = tdev.to_device(data.as_float(ds, np.int64), device)
    order = data.batches(len(fm.train_labels), cfg.batch_size, cfg.seed, 0)
    sels = [torch.from_numpy(i).to(device) for i in order[:steps]]
    part = torch.arange(partial_size(len(fm.train_labels), cfg.batch_size), device=device)
    return x_train, y_train, test, sels, part


def variants(args, cfg, device, sampler, fm):
    """({name: (untimed preparation, timed run of n steps)}, warm-up calls, the steps to warm,
    the two batch shapes); the first variant is the ceiling's step itself."""
    amp, compiled = args.amp == "bf16", not args.eager
    net, step, calls = build(cfg, device, amp, compiled=compiled)
    x_train, y_train, (x_test, y_test), sels, part = inputs(cfg, device, args.steps, fm)
    x, y = x_train[sels[0]], y_train[sels[0]]
    _, other, _ = build(cfg, device, amp, compiled=compiled)  # a --ceiling run's 2nd model
    _, fused, _ = build(cfg, device, amp, fused=device.type == "cuda", compiled=compiled)
    _, in_graph = build_loss_in_graph(cfg, device, amp, compiled)

    def plain(n, step=step):
        for _ in range(n):
            step(x, y)

    def gather(n):  # the loop's batch: indexed from the training set, its loss summed
        total = torch.zeros((), device=device)
        for i in range(n):
            sel = sels[i % len(sels)]
            total += step(x_train[sel], y_train[sel]) * len(sel)

    def sampled(n):  # the loop's utilisation sampler (nvidia-smi every 0.2 s) running
        with sampler.measure():
            plain(n)

    def partial_batch(n):  # one step of the epoch's last batch shape among the full ones
        plain(n - 1)
        step(x_train[part], y_train[part])

    def evaluation():  # as the loop evaluates between epochs (untimed, eagerly)
        for i in range(0, len(y_test), 256):
            resnet18.evaluate(net, x_test[i : i + 256], y_test[i : i + 256])

    nothing = lambda: None  # noqa: E731
    runs = {"ceiling step": (nothing, plain), "+ batch gather, loss sum": (nothing, gather)}
    runs |= {"+ nvidia-smi sampler": (nothing, sampled)}
    runs |= {"+ partial batch": (nothing, partial_batch)}
    runs |= {"after 2nd model's step": (lambda: other(x, y), plain)}
    runs |= {"after eager evaluation": (evaluation, plain)}
    runs |= {"fused SGD": (nothing, lambda n: plain(n, fused))}
    runs |= {"loss in the graph": (nothing, lambda n: plain(n, in_graph))}
    shapes = (x, y, x_train[part], y_train[part])
    return runs, calls, (step, other, fused, in_graph), shapes


def warm(steps, shapes, calls):
    """Every model's graphs compiled and captured for both batch shapes before any timing."""
    x, y, xp, yp = shapes
    for step in steps:
        for _ in range(calls):
            step(x, y)
            step(xp, yp)


def time_runs(runs, n, rounds, sync):
    """{name: [(ms/step, host ms/step) per round]}, the variants taking turns."""
    out = {name: [] for name in runs}
    for _ in range(rounds):
        for name, (prepare, run) in runs.items():
            prepare()
            sync()
            t0 = time.perf_counter()
            run(n)
            t1 = time.perf_counter()
            sync()
            t2 = time.perf_counter()
            out[name].append((1e3 * (t2 - t0) / n, 1e3 * (t1 - t0) / n))
    return out


def table(times) -> list[dict]:
    base = statistics.median(t for t, _ in times["ceiling step"])
    rows = []
    for name, pairs in times.items():
        ms = statistics.median(t for t, _ in pairs)
        host = statistics.median(h for _, h in pairs)
        rows.append(
            {
                "variant": name,
                "ms_per_step": ms,
                "host_ms_per_step": host,
                "x_ceiling_step": ms / base,
                "rounds": len(pairs),
            }
        )
    return rows


def parse(argv):
    p = argparse.ArgumentParser(prog="python -m tools.compiled_step", description=__doc__)
    p.add_argument("--amp", choices=("none", "bf16"), default="none")
    p.add_argument("--batch", type=int, default=256, help="batch size (default: full preset's)")
    p.add_argument("--steps", type=int, default=200, help="steps per timed run")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--eager", action="store_true", help="no torch.compile (a quick check)")
    p.add_argument("--results", help="append the table as one JSON line to this file")
    args = p.parse_args(argv)
    if min(args.batch, args.steps, args.rounds) < 1:
        p.error("--batch, --steps and --rounds must be at least 1")
    try:
        if args.results:
            results.check_writable(args.results)  # before minutes of compiling, not after
        fm = data.load()
    except (results.ResultsError, data.DatasetError) as e:
        p.error(str(e))
    return args, fm


def main(argv=None):
    args, fm = parse(argv)
    cfg = config.get_config("resnet18", "full", batch_size=args.batch)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    sampler = utilization.sampler_for("gpu" if device.type == "cuda" else "cpu", 1)
    with sampler:
        runs, calls, steps, shapes = variants(args, cfg, device, sampler, fm)
        t0 = time.perf_counter()
        warm(steps, shapes, calls)
        tdev.sync([device])
        print(f"warm-up (compile, capture) {time.perf_counter() - t0:.1f} s", flush=True)
        rows = table(time_runs(runs, args.steps, args.rounds, lambda: tdev.sync([device])))
    for r in rows:
        ms, host, ratio = r["ms_per_step"], r["host_ms_per_step"], r["x_ceiling_step"]
        print(f"{r['variant']:<26} {ms:8.3f} ms/step  host {host:8.3f}  {ratio:.3f}x")
    if args.results:
        versions, hardware = results.environment(tdev.versions())
        line = {
            "probe": "tools.compiled_step",
            "amp": args.amp,
            "batch": args.batch,
            "steps": args.steps,
            "compiled": not args.eager,
            "rows": rows,
            "device": tdev.device_names([device])[0],
            "versions": versions,
            "hardware": hardware,
            "git_commit": results.git_commit(),
            "timestamp": results.utc_now(),
        }
        results.append_line(line, args.results)
    return 0


if __name__ == "__main__":
    sys.exit(processes.quiet_when_reader_stops(main))
