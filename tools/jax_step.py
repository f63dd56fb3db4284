"""JAX's ResNet-18 step three ways, on one device: the project's (jax_impl/resnet18.py: `sharding`'s
jitted step, the state donated, the batch gathered on the device, flax's one-pass variance in
BatchNorm, E[x^2] - E[x]^2), the same with torch's two-pass variance, and the book's program (d2l
13.6's JAX code: `jax.pmap`, each batch copied from the host, flax's default BatchNorm, optax's
SGD). `python -m tools.jax_step [--batch 256] [--steps 50] [--rounds 3]`, with JAX's
environment; on a CPU `--width 8 --residuals 1 --batch 16 --steps 2 --rounds 1` checks that it runs
(`--residuals`: blocks per stage, d2l's 2 by default).

For each variant: XLA's own cost analysis of the compiled step (FLOPs, bytes accessed), the
instructions of its optimized program's entry computation by opcode (each fusion, convolution or
custom call a kernel on a GPU: the HLO's difference in a few numbers; `--hlo DIR` writes each
program whole, to diff) and the milliseconds per step, the variants taking turns over `--rounds`
rounds (a median each). A probe of where the project's step differs from the book's, not a
benchmark of the loop; with `--results` it appends one JSON line (hardware, versions, commit).
Then what the one-pass variance costs in float32 digits at each BatchNorm input.
"""

from __future__ import annotations

import argparse
import collections
import re
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from common import results

VARIANTS = ("project", "two-pass variance", "d2l program")


def _two_pass(train, use_bn, axis_name, dtype, name):
    """jax_impl.resnet18.batch_norm with torch's two-pass variance, E[(x - E[x])^2]: what the
    variance alone changes."""
    from flax import linen as nn

    kw = {"momentum": 0.9, "epsilon": 1e-5, "axis_name": axis_name, "dtype": dtype}
    return nn.BatchNorm(use_running_average=not train, name=name, use_fast_variance=False, **kw)


def _project_step(net, batch: int, x_all, y_all):
    """The project's step, as `sharding` builds it on one device, and its first state."""
    import jax

    from jax_impl import resnet18

    optimizer = resnet18.make_optimizer(0.1)
    variables = resnet18.init_weights(net, 0.01, 0)
    state = dict(variables, opt_state=optimizer.init(variables["params"]))

    def step(state, idx):
        return resnet18.train_step(net, optimizer, state, x_all[idx], y_all[idx])

    step = jax.jit(step, donate_argnums=0)
    idx = jax.device_put(np.arange(batch, dtype=np.int32))
    return (lambda s: step(s, idx)[0]), step.lower(state, idx), state


def _book_step(net, batch: int, x_host, y_host):
    """The book's step: pmap over one device, the batch copied from the host every step."""
    import jax
    from jax import lax

    from jax_impl import resnet18

    optimizer = resnet18.make_optimizer(0.1)
    variables = resnet18.init_weights(net, 0.01, 0)
    state = dict(variables, opt_state=optimizer.init(variables["params"]))
    state = jax.tree.map(lambda a: np.asarray(a)[None], state)  # one copy per device: one

    def step(state, x, y):
        new, loss = resnet18.train_step(net, optimizer, state, x, y)
        return new, lax.pmean(loss, "data")

    step = jax.pmap(step, "data", donate_argnums=0)
    x, y = x_host[None, :batch], y_host[None, :batch]
    return (lambda s: step(s, x, y)[0]), step.lower(state, x, y), state


def probe_batch(n: int):
    """The probe's batch: `n` images of [0, 1) pixels, as Fashion-MNIST's, and their labels."""
    rng = np.random.default_rng(0)
    return rng.random((n, 28, 28, 1), dtype=np.float32), rng.integers(0, 10, n).astype(np.int32)


def build(args, x_host, y_host) -> dict:
    """{variant: (step, lowered, state)} on the probe's batch, each step called first (it
    compiles; the two-pass variant while its BatchNorm is in place, since flax looks
    `batch_norm` up when it traces)."""
    import jax

    from jax_impl import resnet18

    x_all, y_all = jax.device_put((x_host, y_host))
    net = resnet18.resnet18(width=args.width, residuals=args.residuals)
    steps = {"project": _project_step(net, args.batch, x_all, y_all)}
    steps["d2l program"] = _book_step(net, args.batch, x_host, y_host)
    one_pass, resnet18.batch_norm = resnet18.batch_norm, _two_pass
    try:
        two_pass = resnet18.resnet18(width=args.width, residuals=args.residuals)
        steps["two-pass variance"] = _project_step(two_pass, args.batch, x_all, y_all)
        # Twice: pmap compiles again once its state comes back as device arrays.
        return {k: (f, low, jax.block_until_ready(f(f(s)))) for k, (f, low, s) in steps.items()}
    finally:
        resnet18.batch_norm = one_pass


# An instruction of HLO text: `%name = shape opcode(operands), ...`, ROOT marking the last.
_INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%?[\w.\-]+ = .*? ([a-z][a-z0-9\-]*)\(")
# What the entry computation only passes around, not what it computes.
_PLUMBING = {"parameter", "get-tuple-element", "tuple", "constant", "bitcast"}


def entry_opcodes(text: str) -> dict:
    """The optimized program's entry computation, its instructions counted by opcode (plumbing
    left out). Fused computations are skipped: each fusion counts once, as its kernel runs."""
    counts, inside = collections.Counter(), False
    for line in text.splitlines():
        if line.startswith("ENTRY "):
            inside = True
        elif inside and line.startswith("}"):
            break
        elif inside and (match := _INSTRUCTION.match(line)):
            counts[match.group(1)] += 1
    return dict(sorted((k, n) for k, n in counts.items() if k not in _PLUMBING))


def analyse(name: str, lowered, hlo_dir: Path | None) -> dict:
    """XLA's cost analysis of the compiled step (None where the backend gives none) and its
    entry opcodes; the optimized HLO written to `hlo_dir` when given."""
    compiled = lowered.compile()
    analysis = compiled.cost_analysis()
    analysis = analysis[0] if isinstance(analysis, list) else analysis or {}
    text = compiled.as_text()
    if hlo_dir is not None:
        hlo_dir.mkdir(parents=True, exist_ok=True)
        (hlo_dir / f"{name.replace(' ', '-')}.hlo.txt").write_text(text)
    flops, moved = analysis.get("flops"), analysis.get("bytes accessed")
    return {"flops": flops, "bytes_accessed": moved, "entry_opcodes": entry_opcodes(text)}


def _relative_error(got, want) -> float:
    return float(np.max(np.abs(np.asarray(got, np.float64) - want) / want))


def variance_errors(x_host, width: int, residuals: int = 2) -> dict:
    """BatchNorm's batch variance on the probe's batch ([0, 1) pixels, as Fashion-MNIST's), at
    every BatchNorm input of the project's model in train mode: per layer, the condition
    number of the one-pass form (max over channels of (mean^2 + var) / var) and the largest
    relative error of float32's one-pass and two-pass variances against float64's on the same
    float32 inputs."""
    import jax
    import jax.numpy as jnp
    from flax import linen as nn

    from jax_impl import resnet18

    net = resnet18.resnet18(width=width, residuals=residuals)
    variables = resnet18.init_weights(net, 0.01, 0)

    def is_conv(module, _):
        return isinstance(module, nn.Conv)

    mutable = ["batch_stats", "intermediates"]
    _, state = net.apply(variables, x_host, True, mutable=mutable, capture_intermediates=is_conv)
    rows, axes = {}, (0, 1, 2)
    for path, out in jax.tree_util.tree_flatten_with_path(state["intermediates"])[0]:
        name = ".".join(str(getattr(k, "key", k)) for k in path[:-2])
        if "shortcut" in name:  # the 1x1 shortcut feeds no BatchNorm
            continue
        x64 = np.asarray(out, np.float64)
        mean, var = x64.mean(axis=axes), x64.var(axis=axes)
        mean32 = jnp.mean(out, axis=axes)
        one = jnp.mean(out * out, axis=axes) - mean32**2
        two = jnp.mean(jnp.square(out - mean32), axis=axes)
        kappa = float(np.max((mean**2 + var) / var))
        rows[name] = {
            "kappa": kappa,
            "one_pass": _relative_error(one, var),
            "two_pass": _relative_error(two, var),
        }
    return rows


def measure(steps: dict, n: int, rounds: int) -> dict:
    """Milliseconds per step of each variant: `rounds` rounds taking turns, each `n` steps
    queued then waited for."""
    import jax

    states = {k: state for k, (_, _, state) in steps.items()}
    times = {k: [] for k in steps}
    for _ in range(rounds):
        for k, (step, _, _) in steps.items():
            start = time.perf_counter()
            for _ in range(n):
                states[k] = step(states[k])
            jax.block_until_ready(states[k])
            times[k].append((time.perf_counter() - start) / n * 1e3)
    return {k: statistics.median(v) for k, v in times.items()}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m tools.jax_step", description=__doc__[:80])
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--width", type=int, default=64, help="ResNet-18's first width (d2l: 64)")
    p.add_argument("--residuals", type=int, default=2, help="residual blocks per stage (d2l: 2)")
    p.add_argument("--steps", type=int, default=50, help="steps per timed round")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--results", default=None, help="JSON Lines file to append the table to")
    p.add_argument("--hlo", type=Path, default=None, help="folder for each optimized program")
    return p


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    if min(args.batch, args.width, args.residuals, args.steps, args.rounds) < 1:
        what = "--batch, --width, --residuals, --steps and --rounds"
        print(f"error: {what} must be at least 1", file=sys.stderr)
        return 2
    import jax

    from jax_impl import devices

    x_host, y_host = probe_batch(args.batch)
    steps = build(args, x_host, y_host)
    ms = measure(steps, args.steps, args.rounds)
    rows = {k: {"ms_per_step": ms[k], **analyse(k, steps[k][1], args.hlo)} for k in VARIANTS}
    device = jax.devices()[0]
    for k, row in rows.items():
        flops, moved = row["flops"], row["bytes_accessed"]
        print(f"{k:>18}: {row['ms_per_step']:.3f} ms/step, {flops} FLOPs, {moved} bytes accessed")
        print(f"{'':>18}  entry: {row['entry_opcodes']}")
    print(f"on {device.device_kind} ({device.platform}), batch {args.batch}")
    variance = variance_errors(x_host, args.width, args.residuals)
    worst = {k: max(row[k] for row in variance.values()) for k in ("kappa", "one_pass", "two_pass")}
    print(
        f"BatchNorm variance at {len(variance)} inputs: condition up to {worst['kappa']:.3g}, "
        f"float32 relative error up to {worst['one_pass']:.2e} one-pass, "
        f"{worst['two_pass']:.2e} two-pass"
    )
    if args.results:
        versions, hardware = results.environment(devices.versions())
        line = {"probe": "tools.jax_step", "batch": args.batch, "width": args.width}
        line |= {"residuals": args.residuals}
        line |= {"steps": args.steps, "rounds": args.rounds, "variants": rows}
        line |= {"batch_norm_variance": variance}
        line |= {"device": device.device_kind, "versions": versions, "hardware": hardware}
        line |= {"git_commit": results.git_commit(), "timestamp": results.utc_now()}
        results.append_line(line, args.results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
