"""zero in torch: ZeRO-1/2/3 equal DDP and one device, each rank's state bytes, the records."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.distributed.tensor import DTensor

from common import config, data, devices, flops
from tests.fixtures import numerics, runs
from torch_impl import guard, launch, zero
from torch_impl import resnet18 as r18

ROOT = Path(__file__).resolve().parents[2]
PSI = flops.PARAMETERS["resnet18"]  # Ψ: the whole ResNet-18's parameters (elements)
STATS = ("running_mean", "running_var")
F64 = 8  # bytes of a float64 element: the equality runs' parameters, gradients and moments
STEP_COUNT = 4  # bytes of AdamW's step count per parameter tensor (a float32 scalar tensor)


def _cfg():
    return config.get_config("zero", "smoke")  # AdamW's settings: torch's defaults


def _net(dtype=torch.float64):
    """float64 (rule 1 of tests/fixtures/numerics.py): the strategies against one mathematics;
    one residual block per stage, with BatchNorm, whose parameters the strategies shard too."""
    return r18.init_weights(r18.resnet18(width=4, residuals=1), 0.1, 0).to(dtype)


def _batches():
    rng = np.random.default_rng(3)
    x = torch.from_numpy(rng.random((16, 1, 8, 8)))
    y = torch.from_numpy(rng.integers(0, 10, 16))
    return x, y, [np.arange(8), np.arange(8, 12), np.arange(4, 16)]  # 4 + 4, 2 + 2, 6 + 6


def _full(t):
    return (t.full_tensor() if isinstance(t, DTensor) else t).detach().numpy().copy()


def _strategies_rank(rank, size, port, out):
    """Rank `rank` runs each strategy on a fresh float64 net: three steps, then its state bytes,
    then an evaluation after rank 1's running statistics were moved far from rank 0's; then the
    same steps in float32. Saves its parameters (whole: a DTensor gathered), state bytes and
    BatchNorm buffers after the evaluation."""
    torch.set_num_threads(1)  # as torchrun's ranks; a forked one has none of OpenMP's threads
    os.environ.update(runs.torchrun_env(rank, size, port))
    world = launch.join(devices.DevicePlan(1, "cpu", True))
    x, y, steps = _batches()
    found = {}
    for name in zero.STRATEGIES:
        net, bound = _net(), []
        adamw = zero._kept(zero.make_optimizer(_cfg()), bound)  # keeps the AdamW it binds
        _, shard, step, correct, _ = getattr(zero, name)(net, adamw, world)
        for part in shard(steps):
            step(x, y, part)
        found[f"{name} bytes"] = np.array(list(zero.state_bytes(net, bound).values()))
        with torch.no_grad():
            for key, b in net.named_buffers():
                if rank == 1 and key.endswith(STATS):
                    b.add_(3.0).mul_(2.0)
        correct(x, y, np.arange(8))
        found |= {f"{name} {k}": _full(p) for k, p in net.named_parameters()}
        found |= {f"{name} {k}": b.numpy().copy() for k, b in net.named_buffers()}
        net = _net(torch.float32)
        step = getattr(zero, name)(net, zero.make_optimizer(_cfg()), world)[2]
        for part in shard(steps):
            step(x.float(), y, part)
        found |= {f"float32 {name} {k}": _full(p) for k, p in net.named_parameters()}
        del step, shard, correct
    np.savez(f"{out}{rank}.npz", **found)
    guard.end_process_group()
    guard.exit_worker(0)


def _one_device():
    """The same steps on one device, each batch through the net as two halves one at a time,
    each normalised with its own BatchNorm statistics (each rank's own rows), their losses
    weighed to the batch's mean; AdamW as the strategies bind it."""
    x, y, steps = _batches()
    net = _net()
    opt = zero.make_optimizer(_cfg())(net.parameters())
    for idx in steps:
        opt.zero_grad(set_to_none=True)
        for rows in data.shard_batch(idx, 2):
            (r18.loss_fn(net(x[rows]), y[rows]) / 2).backward()
        opt.step()
    return {k: p.detach().numpy() for k, p in net.named_parameters()}


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    """What each of two gloo ranks saved (by rank), and the one device's parameters."""
    out = tmp_path_factory.mktemp("zero") / "rank"
    single = _one_device()  # first: the ranks, forked after, start with what it loaded
    how = "spawn" if torch.cuda.is_initialized() else "fork"
    torch.multiprocessing.start_processes(
        _strategies_rank, args=(2, runs.free_port(), str(out)), nprocs=2, start_method=how
    )
    return [dict(np.load(f"{out}{rank}.npz")) for rank in range(2)], single


def _of(saved, name, keys):
    return {k: saved[f"{name} {k}"] for k in keys}


@pytest.mark.numerics
@pytest.mark.multi_device
def test_each_sharded_strategy_equals_ddp_and_one_device(two_ranks):
    """Rule 1 (float64): after 3 AdamW steps, every rank's parameters under ZeRO-1, -2 and -3
    equal DDP's, and DDP's equal one device's that normalises each rank's rows alone. The steps
    moved the weights far more than the limit: the check can see a wrong step."""
    ranks, single = two_ranks
    start = {k: v for k, v in r18.get_weights(_net()).items() if k in single}
    assert numerics.rel_error(single, start) > 1e3 * numerics.SAME_MATH_LIMIT
    for rank, saved in enumerate(ranks):
        ddp = _of(saved, "ddp", single)
        numerics.check_same_math(f"torch zero ddp rank {rank} vs 1 device", ddp, single)
        for name in zero.STRATEGIES[1:]:
            got = _of(saved, name, single)
            numerics.check_same_math(f"torch zero {name} rank {rank} vs ddp", got, ddp)


@pytest.mark.numerics
@pytest.mark.multi_device
def test_in_float32_each_sharded_strategy_stays_within_ddps_own_rounding(two_ranks):
    """The workload's float32: a sharded strategy does DDP's float32 operations on the same rows
    (the same kernels; gradients summed over two ranks, which commute; AdamW's elementwise update
    on a shard of each tensor instead of the whole), so it may differ from DDP by rounding only,
    and by no more than float32's rounding moved DDP itself from its float64 steps: the limit is
    ||ddp32 - ddp64|| / ||ddp64||, measured here."""
    ranks, single = two_ranks
    for rank, saved in enumerate(ranks):
        ddp, ddp32 = _of(saved, "ddp", single), _of(saved, "float32 ddp", single)
        limit = numerics.rel_error(ddp32, ddp)
        assert 0 < limit < 1e-3  # float32's rounding, not a wrong step
        for name in zero.STRATEGIES[1:]:
            error = numerics.rel_error(_of(saved, f"float32 {name}", single), ddp32)
            numerics.report(f"torch zero float32 {name} rank {rank} vs ddp", error, limit)


@pytest.mark.multi_device
def test_every_rank_evaluates_with_rank_0s_running_statistics(two_ranks):
    """Rank 1's running statistics, moved far from rank 0's before `correct`, are rank 0's once
    it has evaluated: DDP's forward broadcasts them, the sharded strategies before evaluating."""
    ranks, _ = two_ranks
    stats = [k.split(" ", 1)[1] for k in ranks[0] if k.startswith("ddp ") and k.endswith(STATS)]
    for name in zero.STRATEGIES:
        mine, theirs = _of(ranks[1], name, stats), _of(ranks[0], name, stats)
        assert all(np.array_equal(mine[k], theirs[k]) for k in stats), name


@pytest.mark.multi_device
def test_each_rank_holds_what_its_zero_stage_shards(two_ranks):
    """The bytes read from each rank's local tensors after a step, against the net's Ψ
    (elements) and T (parameter tensors): DDP holds 4 + 4 + 8 bytes a parameter in float32 (8
    + 8 + 16 here, in float64) and a step count per tensor; ZeRO-1 splits the moments and step
    counts between the ranks, whole tensors each; ZeRO-2 and -3 split all three."""
    ranks, single = two_ranks
    psi, tensors = sum(v.size for v in single.values()), len(single)
    held = {n: np.array([saved[f"{n} bytes"] for saved in ranks]) for n in zero.STRATEGIES}
    moments = 2 * F64 * psi + STEP_COUNT * tensors
    for rank in range(2):
        assert held["ddp"][rank].tolist() == [F64 * psi, F64 * psi, moments]
    for name in zero.STRATEGIES[1:]:
        params, grads, state = held[name].T
        sharded = name != "zero1"  # FSDP: a step count for each rank's shard of a tensor
        assert state.sum() == moments + sharded * STEP_COUNT * tensors, name
        assert (state < moments).all(), name
        assert params.sum() == F64 * psi * (1 + (not sharded)), name
        assert grads.sum() == F64 * psi * (1 + (not sharded)), name
        if sharded:  # FSDP splits each tensor along its first dimension: nearly evenly
            assert abs(params[0] - params[1]) <= F64 * tensors, name


def test_make_optimizer_is_torchs_adamw_with_the_configs_settings():
    cfg = config.get_config("zero", "smoke")
    opt = zero.make_optimizer(cfg)([torch.nn.Parameter(torch.zeros(3))])
    assert type(opt) is torch.optim.AdamW
    group = opt.param_groups[0]
    want = {"lr": cfg.lr, "betas": (cfg.b1, cfg.b2), "eps": cfg.eps}
    assert {k: group[k] for k in want} == want and group["weight_decay"] == cfg.weight_decay


def _smoke(strategy, path, gpus=2):
    cmd = [sys.executable, "-m", "torch_impl", "--workload", "zero", "--no-progress"]
    cmd += ["--gpus", str(gpus), "--preset", "smoke", "--platform", "cpu"]
    cmd += ["--strategy", strategy, "--results", str(path)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=240, cwd=ROOT, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(Path(path).read_text().splitlines()[-1])


@pytest.fixture(scope="module")
def smoke_records(tmp_path_factory):
    """Each strategy's record of a smoke run on 2 CPU processes."""
    path = tmp_path_factory.mktemp("zero-smoke") / "results.jsonl"
    return {s: _smoke(s, path) for s in zero.STRATEGIES}


@pytest.mark.slow
@pytest.mark.multi_device
def test_smoke_runs_record_what_each_rank_holds_and_what_moves(smoke_records):
    """The records of the whole ResNet-18 on 2 ranks, against ZeRO's closed forms in float32
    (16Ψ, 8Ψ + 8Ψ/N, then 16Ψ/N) to within AdamW's step counts, 4 bytes a tensor. The bytes
    are read after a step, where FSDP has resharded every group after its backward: ZeRO-2
    (reshard_after_forward=False) holds whole parameters only from a group's forward to its
    backward, so after the step it holds what ZeRO-3 holds, not 4Ψ + 12Ψ/N; it differs in the
    all-gathers, one a step instead of two. The step's collectives as the engine made them:
    gloo reduces FSDP's reduce-scatter as an all-reduce of the whole input."""
    total = 4 * PSI  # bytes of every parameter in float32
    for strategy, rec in smoke_records.items():
        extra = rec["extra"]
        assert rec["devices"] == 2 and extra["parameters"] == PSI
        assert extra["optimizer"] == "adamw" and extra["state_on"] == "devices"
        assert extra["zero_stage"] == zero.STRATEGIES.index(strategy)
        held = extra["state_bytes"]
        per_rank = sum(sum(row.values()) for row in held) / 2
        closed = {"ddp": 16, "zero1": 8 + 8 / 2, "zero2": 16 / 2, "zero3": 16 / 2}[strategy]
        assert abs(per_rank - closed * PSI) < 0.01 * closed * PSI, (strategy, held)
        assert len(extra["peak_bytes"]["bytes"]) == 2 and extra["peak_bytes"]["includes"]
        assert all(b > per_rank for b in extra["peak_bytes"]["bytes"])
        assert extra["collectives_source"]
    ddp, z1, z2, z3 = (smoke_records[s]["extra"] for s in zero.STRATEGIES)
    assert z2["state_bytes"] == z3["state_bytes"]  # both resharded after the backward
    for mine, whole in zip(z1["state_bytes"], ddp["state_bytes"], strict=True):
        assert mine["opt_state"] < whole["opt_state"]
    tensors = len(list(r18.resnet18().parameters()))  # a step count each, on each rank
    assert sum(sum(row.values()) for row in z3["state_bytes"]) == 16 * PSI + 4 * 2 * tensors
    moved = {s: r["extra"]["step_collectives"] for s, r in smoke_records.items()}
    moved = {s: {c["op"]: c for c in ops} for s, ops in moved.items()}
    assert moved["ddp"]["all_reduce"]["bytes"] == total
    assert moved["zero1"]["broadcast"]["bytes"] >= total
    assert moved["zero2"]["all_gather"]["bytes"] == total
    assert moved["zero3"]["all_gather"]["bytes"] == 2 * total
    for name in ("zero2", "zero3"):  # gloo: the reduce-scatter's whole input, all-reduced
        assert moved[name]["all_reduce"]["bytes"] == total and "reduce_scatter" not in moved[name]
