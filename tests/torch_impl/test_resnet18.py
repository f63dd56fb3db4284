"""resnet18 in torch: model, weights, parity fixture, DDP == one device, launcher, smoke runs."""

import concurrent.futures
import contextlib
import dataclasses
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from common import cli, config, data, devices, flops, weights
from tests.fixtures import gpu_checks, numerics, runs
from torch_impl import devices as tdev
from torch_impl import guard, launch
from torch_impl import resnet18 as r18

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"
PARAMS = flops.PARAMETERS["resnet18"]  # d2l's ResNet-18 (conv biases, no shortcut BN)
STATS = ("running_mean", "running_var")
sys.path.insert(0, str(FIXTURES))
import make_resnet18_parity as parity  # noqa: E402


def test_parameter_count_and_names():
    net = r18.resnet18()
    assert sum(p.numel() for p in net.parameters()) == PARAMS
    shapes = r18.weight_shapes(net)
    names = [name for name, _ in net.named_parameters()]  # the order DDP buckets them in
    assert [(n, shapes[n]) for n in names] == list(flops.parameter_shapes("resnet18").items())
    assert shapes["stem.conv.weight"] == (64, 1, 3, 3)
    assert shapes["layer2.0.shortcut.weight"] == (128, 64, 1, 1)
    assert shapes["layer1.0.bn1.running_mean"] == (64,)
    assert shapes["fc.weight"] == (10, 512)
    assert "layer1.0.shortcut.weight" not in shapes  # stage 1 keeps the shape: identity


def test_init_is_d2l_normal_and_round_trips():
    net = r18.init_weights(r18.resnet18(width=8), 0.01, seed=3)
    w = r18.get_weights(net)
    assert abs(float(w["layer4.1.conv2.weight"].std()) - 0.01) < 1e-3
    assert not w["fc.bias"].any() and (w["stem.bn.weight"] == 1).all()
    other = r18.set_weights(r18.resnet18(width=8), w)
    for k, v in r18.get_weights(other).items():
        np.testing.assert_array_equal(v, w[k])


def test_float64_run_reproduces_the_fixture():
    """Rule 1 (tests/fixtures/numerics.py): the fixture is this program's float64 output, so a
    float64 run must give it back on any machine; this also checks the generator."""
    ref = np.load(FIXTURES / "resnet18_parity.npz")
    got = parity.outputs(_parity_weights(), ref["x"], ref["y"].astype(np.int64), torch.float64)
    for key in parity.OUTPUTS:
        numerics.check_same_math(f"torch resnet18 float64 {key}", got[key], ref[key])


def test_float32_forward_matches_the_float64_fixture():
    """Rule 2: float32 forward outputs within the rounding factor times their sensitivity."""
    ref = np.load(FIXTURES / "resnet18_parity.npz")
    got = parity.outputs(_parity_weights(), ref["x"], ref["y"].astype(np.int64), torch.float32)
    for key in parity.FORWARD:
        numerics.check_float32(
            f"torch resnet18 float32 {key}",
            got[key],
            ref[key],
            float(ref[f"{key}.sensitivity"]),
            parity.STAGES,
            parity.REDUCTION,
        )


def _parity_weights():
    return weights.init_normal(r18.weight_shapes(r18.resnet18()), parity.STD, parity.SEED)


def _net(use_bn=False):
    """float64 (rule 1 of tests/fixtures/numerics.py): N ranks against one compare mathematics."""
    return r18.init_weights(r18.resnet18(width=4, use_bn=use_bn, residuals=1), 0.1, 0).double()


def _batches():
    rng = np.random.default_rng(1)
    x = rng.random((12, 1, 8, 8))
    y = rng.integers(0, 10, 12)
    return x, y, [np.arange(8), np.arange(8, 12)]  # a short last batch, split 2 + 2


def _join(rank, size, port):
    """Rank `rank` of `size` joins its group as a worker of torchrun does (launch.join)."""
    torch.set_num_threads(1)  # as torchrun's ranks; a forked one has none of OpenMP's threads
    os.environ.update(runs.torchrun_env(rank, size, port))
    return launch.join(devices.DevicePlan(1, "cpu", True))


def _ranks(fn, size, *args):
    """`fn(rank, size, port, *args)` in `size` processes forked from this one: they start with
    its modules loaded, where spawned ones would import torch (and what it loads on a first
    training step) again, each. Spawned where this process has set CUDA up (the GPU tier): a
    forked child cannot use CUDA then."""
    args = (size, runs.free_port(), *args)
    how = "spawn" if torch.cuda.is_initialized() else "fork"
    torch.multiprocessing.start_processes(fn, args=args, nprocs=size, start_method=how)


def _ddp_rank(rank, size, port, out, use_bn):
    world = _join(rank, size, port)
    assert (world.rank, world.size, world.plan.count) == (rank, size, size)
    assert world.sum(np.array([rank, 1.0])).tolist() == [sum(range(size)), size]
    x, y, steps = _batches()
    net = _net(use_bn)
    _, shard, step, _, _ = r18.ddp(net, r18.make_optimizer(net, 0.1), world)
    for part in shard(steps):  # this rank's row of each global batch
        step(torch.from_numpy(x), torch.from_numpy(y), part)
    np.savez(f"{out}{rank}.npz", **r18.get_weights(net))
    # As in the worker: DDP (its reducer) goes before the group, the ranks meet first, and the
    # rank leaves without the interpreter's shutdown, which gloo's threads can abort.
    del step, shard
    guard.end_process_group()
    guard.exit_worker(0)


def _ghost_batch_steps(net, x, y, steps, shares):
    """d2l's steps on one device, each batch through the net as `shares` parts one at a time,
    each with BatchNorm statistics of its own (a "ghost batch": what DDP's per-rank BatchNorm
    computes), the parts' losses weighed to the batch's mean. With 1: the plain step. Each part
    starts from part 0's running statistics (DDP broadcasts rank 0's buffers before every
    forward), part 0's go on: the buffers each part leaves at the last step, as numpy."""
    opt = r18.make_optimizer(net, 0.1)
    x, y = torch.from_numpy(x), torch.from_numpy(y)
    for idx in steps:
        opt.zero_grad(set_to_none=True)
        first, left = _buffers(net), []
        for rows in data.shard_batch(idx, shares):
            _load_buffers(net, first)
            (r18.loss_fn(net(x[rows]), y[rows]) / shares).backward()
            left.append(_buffers(net))
        _load_buffers(net, left[0])
        opt.step()
    return [{k: v.numpy() for k, v in part.items()} for part in left]


def _buffers(net):
    return {k: b.detach().clone() for k, b in net.named_buffers()}


def _load_buffers(net, saved):
    with torch.no_grad():
        for k, b in net.named_buffers():
            b.copy_(saved[k])


@pytest.mark.numerics
@pytest.mark.multi_device
@pytest.mark.parametrize("use_bn", [False, True], ids=["no-bn", "per-device-bn"])
def test_ddp_two_gloo_ranks_equal_one_device(tmp_path, use_bn):
    """Two ranks equal one device that normalises each rank's share of the batch alone (DDP's
    per-rank BatchNorm; without BatchNorm, the plain one-device step). Two steps: 4 + 4, then
    2 + 2. Each rank's parameters against the one device's; its running statistics against
    its part's, each part starting every step from part 0's (DDP broadcasts rank 0's buffers
    before every forward: rank 0's are its own share's alone, rank 1's rank 0's moved on by its
    last batch). The one-device run goes first: the ranks, forked after it, start with what its
    steps loaded."""
    x, y, steps = _batches()
    net = _net(use_bn)
    start = r18.get_weights(net)
    parts = _ghost_batch_steps(net, x, y, steps, 2)
    out = tmp_path / "ddp"
    _ranks(_ddp_rank, 2, str(out), use_bn)
    params = {name for name, _ in net.named_parameters()}
    single = {k: v for k, v in r18.get_weights(net).items() if k in params}
    limit = 1e3 * numerics.SAME_MATH_LIMIT
    # The steps moved the weights far more than the limit: the check can see a wrong step.
    assert numerics.rel_error(single, {k: start[k] for k in single}) > limit
    name = f"torch resnet18 ddp 2 ranks vs 1 device ({use_bn=})"
    for rank, part in enumerate(parts):
        got = dict(np.load(f"{out}{rank}.npz"))
        numerics.check_same_math(f"{name} rank {rank}", {k: got[k] for k in single}, single)
        stats = {k: v for k, v in part.items() if k.endswith(STATS)}
        if stats:  # the parts' statistics differ: the check can tell a rank's from another's
            assert numerics.rel_error(stats, {k: parts[1 - rank][k] for k in stats}) > limit
            mine = {k: got[k] for k in stats}
            numerics.check_same_math(f"{name} rank {rank} statistics", mine, stats)


def _evaluating_rank(rank, size, port, out):
    """Rank `rank` counts its share of a test batch through the `ddp` strategy's `correct`, its
    own running statistics set far from rank 0's (rank 1); the labels are the predictions with
    rank 0's. Rank 0 saves the sum over the ranks and whether rank 1's own statistics would have
    predicted its share otherwise."""
    world = _join(rank, size, port)
    net = _net(use_bn=True)
    x = torch.from_numpy(np.random.default_rng(6).standard_normal((8, 1, 8, 8)))
    with torch.no_grad():
        labels = net.eval()(x).argmax(dim=1)
    _, _, _, correct, total = r18.ddp(net.train(), r18.make_optimizer(net, 0.1), world)
    far = np.random.default_rng(7)
    with torch.no_grad():
        for name, b in net.named_buffers():
            if rank and name.endswith(STATS):
                b.copy_(torch.from_numpy(np.abs(b.numpy() + 2 * far.standard_normal(b.shape))))
        own = (net.eval()(x[4:]).argmax(dim=1) != labels[4:]).any().item()
    hits = correct(x, labels, np.arange(8))
    counted, differs = total([], [hits])[1], world.sum(np.array([float(own)]))[0]
    if rank == 0:
        Path(out).write_text(f"{counted} {differs}")
    del correct, total
    guard.end_process_group()
    guard.exit_worker(0)


@pytest.mark.multi_device
def test_each_ddp_rank_evaluates_with_rank_0s_running_statistics(tmp_path):
    """`correct` counts this rank's share of a test batch through DDP, whose forward broadcasts
    rank 0's buffers first (its default): rank 1's own statistics, set far from rank 0's, are not
    the ones it evaluates with. The labels are the predictions with rank 0's: every row counts.
    With rank 1's own for its share (the local module), some do not."""
    out = tmp_path / "counted.txt"
    _ranks(_evaluating_rank, 2, str(out))
    counted, differs = map(float, out.read_text().split())
    assert differs == 1  # rank 1's own statistics would predict its share otherwise
    assert counted == 8


def _wrapped(rank, size, port, out):
    world = _join(rank, size, port)
    net = _net()
    step = r18.ddp(net, r18.make_optimizer(net, 0.1), world)[2]
    trains = [c.cell_contents for c in step.__closure__ if isinstance(c.cell_contents, nn.Module)]
    if rank == 0:
        Path(out).write_text(type(trains[0]).__name__ if trains[0] is not net else "plain")
    del step, trains
    guard.end_process_group()
    guard.exit_worker(0)


@pytest.mark.parametrize(("world", "expected"), [(1, "plain"), (2, "DistributedDataParallel")])
def test_ddp_wraps_the_module_only_when_there_is_something_to_all_reduce(tmp_path, world, expected):
    """One rank trains the plain module (DDP's buckets and all-reduce would be pure overhead);
    two ranks get DDP (test_ddp_two_gloo_ranks_equal_one_device checks its arithmetic)."""
    out = tmp_path / "kind.txt"
    _ranks(_wrapped, world, str(out))
    assert out.read_text() == expected


def test_an_epochs_indices_come_from_one_host_to_device_copy():
    rows = [data.shard_batch(b, 2)[1] for b in (np.array([7, 1, 4, 0]), np.array([2, 9]))]
    got = tdev.one_copy(rows, torch.device("cpu"))
    assert [sel.tolist() for sel in got] == [[4, 0], [9]]
    assert got[0].untyped_storage().data_ptr() == got[1].untyped_storage().data_ptr()


def _args(**kw):
    return runs.command_args("resnet18", **{"results": "/nonexistent/never-written.jsonl", **kw})


def test_dataparallel_is_refused_without_cuda():
    plan = devices.DevicePlan(2, "cpu", True)
    with pytest.raises(config.ConfigError, match="needs CUDA"):
        args = _args(strategy="dataparallel")
        r18.main(args, plan, cli.config_of(args), None)
    with pytest.raises(config.ConfigError, match="unknown resnet18 strategy"):
        r18.main(_args(strategy="pmap"), plan, cli.config_of(_args()), None)


def test_bf16_autocast_step_runs_and_learns():
    x, y, _ = _batches()
    net = r18.init_weights(r18.resnet18(width=4, amp=True), 0.1, 0)
    opt = r18.make_optimizer(net, 0.5)
    xt, yt = torch.from_numpy(x).float(), torch.from_numpy(y)
    assert net(xt).dtype == torch.bfloat16  # autocast around the forward
    losses = [float(r18.train_step(net, opt, xt, yt)) for _ in range(5)]
    assert np.isfinite(losses).all() and losses[-1] < losses[0]


def _cli(args, env=None, timeout=240):
    return subprocess.run(
        [sys.executable, "-m", "torch_impl", "--workload", "resnet18", "--no-progress", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env={**os.environ, **(env or {})},
    )


@pytest.mark.slow
@pytest.mark.multi_device
def test_smoke_ddp_end_to_end(smoke_ddp):
    out, rec = smoke_ddp
    assert rec["strategy"] == "ddp" and rec["devices"] == 2 and rec["batch_size"] == 32
    assert rec["extrapolated"] is True and rec["steps_timed"] == 2
    assert rec["images_per_sec"] > 0 and len(rec["train_loss"]) == 1
    extra = rec["extra"]
    assert extra["utilization_source"] == "cpu_time" and len(extra["utilization"]) == 2
    assert len(extra["peak_memory_bytes"]) == 2 and extra["omp_num_threads_env"] == "1"
    assert extra["threads"] == 1  # torchrun's one thread per rank, read back from torch
    assert "sec/epoch (extrapolated) on [2 x cpu (virtual)]" in out.stdout.splitlines()[-1]
    assert out.stdout.count("test acc:") == 1  # only rank 0 reports
    assert extra["compiled"] is False  # eager: --compile not given
    assert extra["ddp_wrapper"] is True  # two ranks: DDP all-reduces their gradients
    assert rec["flops"]["achieved_tflops"] > 0 and rec["flops"]["fraction_of_peak"] is None


@pytest.mark.slow
@pytest.mark.multi_device
def test_a_dying_worker_fails_the_run_without_hanging(tmp_path):
    """Rank 1 is killed (SIGKILL, as the OOM killer would) as soon as it exists."""
    path = tmp_path / "r.jsonl"
    start = time.monotonic()
    argv = ["--gpus", "2", "--preset", "smoke", "--platform", "cpu", "--results", str(path)]
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        killed = pool.submit(_kill_rank, 1, str(path), 120)
        out = _cli(argv, timeout=180)
    assert killed.result(), "rank 1 was never seen"
    assert out.returncode != 0
    assert "error: DDP training failed" in out.stderr
    assert not path.exists()  # no record from a failed run
    assert time.monotonic() - start < 120


def _kill_rank(rank, marker, timeout):
    """SIGKILL the DDP worker of `rank` whose command line holds `marker`; False if none came."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for proc in Path("/proc").glob("[0-9]*"):
            try:
                cmd = (proc / "cmdline").read_bytes().split(b"\0")
                env = (proc / "environ").read_bytes().split(b"\0")
            except OSError:
                continue  # gone, or not ours to read
            worker = b"torch_impl" in cmd and marker.encode() in cmd
            if worker and f"RANK={rank}".encode() in env:
                os.kill(int(proc.name), signal.SIGKILL)
                return True
        time.sleep(0.05)
    return False


def test_warm_up_steps_leave_the_initial_weights():
    """`train` warms up on the batch shapes it will use, then restores the initial weights:
    its first epoch's loss is that of the same steps taken from the initial weights."""
    rng = np.random.default_rng(2)
    images = rng.integers(0, 256, (20, 28, 28), dtype=np.uint8)
    labels = rng.integers(0, 10, 20)
    cfg = config.get_config("resnet18", "smoke", batch_size=8, lr=0.5, epochs=1)
    cfg = dataclasses.replace(cfg, steps_per_epoch=None)  # 8 + 8 + 4: two batch shapes

    def fresh():
        return r18.init_weights(r18.resnet18(width=4, residuals=1), 0.1, 0)

    net, cpu, ds = fresh(), torch.device("cpu"), (images, labels, images, labels)
    # One CPU "device" under nn.DataParallel without CUDA: the plain module, as the test wants.
    run = runs.run_for("resnet18", cfg, ds, [cpu])
    r18.train(net, cfg, ds, r18.data_parallel, run)
    log = run.epoch_log
    ref = fresh()
    opt = r18.make_optimizer(ref, cfg.lr)
    x = torch.from_numpy(data.to_float(images))
    y = torch.from_numpy(labels.astype(np.int64))
    steps = data.batches(20, 8, cfg.seed, 0)
    total = sum(float(r18.train_step(ref, opt, x[sel], y[sel])) * len(sel) for sel in steps)
    assert log.timed_steps == [3] and len(log.sec_per_epoch) == 1
    # The same float32 steps from the same weights: the weights are bitwise those of `ref`; the
    # epoch loss sums 3 float32 step losses where `total` sums float64s (rule 3).
    loss_error = abs(log.train_loss[0] - total / 20) / (total / 20)
    numerics.report(
        "torch resnet18 warm-up epoch loss", loss_error, numerics.reordered_sum_limit(3)
    )
    for k, v in r18.get_weights(ref).items():
        np.testing.assert_array_equal(r18.get_weights(net)[k], v, err_msg=k)


@contextlib.contextmanager
def relu_decisions(record=None, impose=None):
    """Record which ReLU inputs are > 0 (in call order), or impose recorded decisions instead of
    computing them: the float64 reference then takes float32's side of every kink (numerics.py,
    rule 1), so the comparison sees rounding only. The model calls F.relu at run time."""
    original, imposed = F.relu, iter(impose or ())

    def relu(z, inplace=False):
        if impose is not None:
            return z * next(imposed).to(z.device, z.dtype)
        if record is not None:
            record.append((z > 0).detach().cpu())
        return original(z)

    F.relu = relu
    try:
        yield
    finally:
        F.relu = original


def _gradients(device, dtype, w, x, decisions=None, record=None):
    """Loss gradients of the full ResNet-18 (train-mode BatchNorm) from exchange-format weights
    `w` on inputs `x`, in `dtype` on `device`."""
    y = torch.from_numpy(np.arange(len(x)) % 10).to(device)
    net = r18.set_weights(r18.resnet18().to(dtype), w).to(device)
    if device.type == "cuda":
        net = net.to(memory_format=torch.channels_last)  # as `run` trains on a GPU
    with relu_decisions(record, decisions):
        r18.loss_fn(net(torch.from_numpy(np.asarray(x)).to(device, dtype)), y).backward()
    return {k: p.grad.double().cpu().numpy() for k, p in net.named_parameters()}


@pytest.mark.numerics
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_float32_gradients_match_float64(device):
    """Rule 2 per tensor: the float32 gradients, on the CPU and (where there is one) on a GPU
    with TF32 off, against float64 on the CPU with float32's ReLU decisions. The input is
    zero-mean: with [0, 1) pixels BatchNorm cancels most of the stem's and layer1's gradients.
    Conv biases feeding a BatchNorm have an exact gradient of 0 and are left out."""
    w = _parity_weights()
    x = np.random.default_rng(0).standard_normal((8, 1, 28, 28))
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    decisions = []
    try:
        got = _gradients(torch.device(device), torch.float32, w, x, record=decisions)
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved
    cpu = torch.device("cpu")
    want = _gradients(cpu, torch.float64, w, x, decisions)
    moved = numerics.perturb({**w, "input": x})
    off = _gradients(cpu, torch.float64, moved, moved.pop("input"), decisions)
    gpu_checks.check_float32_gradients(f"torch resnet18 {device} float32 gradient", got, want, off)
