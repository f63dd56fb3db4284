"""torch's SyncBatchNorm (resnet18's --sync-bn: torch_impl/resnet18.py's main converts the net
with `_sync_batch_norm` before the `ddp` strategy wraps it in DDP) normalises over the whole
global batch: two ranks, each on its half of every batch, take the step of one process whose
plain BatchNorm sees the whole batch. Their forward outputs, gradients, weights and running
statistics agree (rule 1 of tests/fixtures/numerics.py, in float64).

GPU tier: torch's SyncBatchNorm runs on CUDA only. DDP refuses it in a CPU module ("SyncBatchNorm
layers only work with GPU modules"), the module refuses a CPU tensor in training ("SyncBatchNorm
expected input tensor to be on GPU ..."), and the kernels it calls (aten::batch_norm_stats and
the rest) have no CPU implementation. The two ranks share the one GPU and meet over gloo, which
all-gathers and all-reduces CUDA tensors (NCCL wants a GPU per rank). main itself is not called
(it loads Fashion-MNIST): `_net` builds the net as main does, with the lesson's own conversion."""

import datetime
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist

from common.devices import DevicePlan
from common.world import World, alone
from tests.fixtures import numerics
from torch_impl import devices as tdev
from torch_impl import guard
from torch_impl import resnet18 as r18

pytestmark = pytest.mark.gpu
DEVICE = "cuda:0"
RANKS, LR = 2, 0.1
STATS = ("running_mean", "running_var")


@pytest.fixture(autouse=True)
def _cuda():
    """A CUDA GPU, and cuDNN's autotuning as this process had it (the GPU layout sets it)."""
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA GPU")
    saved = torch.backends.cudnn.benchmark
    yield
    torch.backends.cudnn.benchmark = saved


def _batches():
    """12 zero-mean images (BatchNorm well conditioned), labels, and two global batches: 8 rows
    (4 per rank), then 4 (2 per rank)."""
    rng = np.random.default_rng(1)
    x, y = rng.standard_normal((12, 1, 8, 8)), rng.integers(0, 10, 12)
    return x, y, [np.arange(8), np.arange(8, 12)]


def _net(device, sync_bn):
    """The narrow net in float64 on `device`, as main builds it: --sync-bn converts its
    BatchNorms before DDP wraps it; then the GPU's layout."""
    net = r18.init_weights(r18.resnet18(width=4, residuals=1), 0.1, 0).double().to(device)
    if sync_bn:
        net = r18._sync_batch_norm(net)
    return tdev.gpu_layout(net, device)


def _steps(net, step, device, parts):
    """Take `step` on each of `parts`: each step's forward output (every call of the net, in
    order: DDP calls it once, a ghost batch once per part) and gradients (those the optimizer
    applied), then the weights and running statistics, as numpy under their names."""
    x, y, _ = _batches()
    x, y = torch.from_numpy(x).to(device), torch.from_numpy(y).to(device)
    outputs, got = [], {}
    hook = net.register_forward_hook(lambda m, i, out: outputs.append(out.detach().cpu()))
    for s, part in enumerate(parts):
        step(x, y, part)
        got[f"output {s}"] = torch.cat(outputs).numpy()
        outputs.clear()
        got |= {f"gradient {s} {k}": p.grad.cpu().numpy() for k, p in net.named_parameters()}
    hook.remove()
    return got | {f"final {k}": v for k, v in r18.get_weights(net).items()}


def _one_process(device, shares):
    """The steps in one process with plain BatchNorm: each batch in `shares` equal parts, each
    through the net alone with statistics of its own (1: the whole batch; 2: a ghost batch,
    DDP's BatchNorm without --sync-bn), the parts' losses weighed to the batch's mean."""
    net = _net(device, sync_bn=False)
    opt = r18.make_optimizer(net, LR)

    def step(x, y, idx):
        opt.zero_grad(set_to_none=True)
        for rows in np.split(idx, shares):
            (r18.loss_fn(net(x[rows]), y[rows]) / shares).backward()
        opt.step()

    return _steps(net, step, device, _batches()[2])


def _rank(rank, size, store, folder):
    """A rank of the lesson's DDP with --sync-bn: its half of each batch (the `ddp` strategy's
    shard and step), its record saved as rank<i>.npz in `folder`."""
    torch.set_num_threads(1)
    device = torch.device(DEVICE)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    timeout = datetime.timedelta(seconds=guard.COLLECTIVE_TIMEOUT_S)
    dist.init_process_group(
        "gloo", init_method=f"file://{store}", rank=rank, world_size=size, timeout=timeout
    )
    platform = "gpu" if device.type == "cuda" else "cpu"
    # The strategy's `total`, the one user of the world's sum, is not called here.
    world = World(rank, size, [device], alone, DevicePlan(size, platform, False), dist.group.WORLD)
    net = _net(device, sync_bn=True)
    _, shard, step, _, _ = r18.ddp(net, r18.make_optimizer(net, LR), world)
    got = _steps(net, step, device, shard(_batches()[2]))
    np.savez(Path(folder) / f"rank{rank}.npz", **got)
    del step, shard  # DDP's reducer goes before the group (as in the lesson's worker)
    guard.end_process_group()
    guard.exit_worker(0)


def _ranks(folder):
    """Every rank's record. Spawned where this process has set CUDA up (a forked child cannot
    use it), else forked."""
    how = "spawn" if torch.cuda.is_initialized() else "fork"
    store = str(Path(folder) / "store")
    torch.multiprocessing.start_processes(
        _rank, args=(RANKS, store, str(folder)), nprocs=RANKS, start_method=how
    )
    return [dict(np.load(Path(folder) / f"rank{r}.npz")) for r in range(RANKS)]


def _kind(record, prefix, stats=None):
    """The entries of `record` whose name starts with `prefix` (with `stats`: only the running
    statistics, or none of them)."""
    out = {k: v for k, v in record.items() if k.startswith(prefix)}
    if stats is not None:
        out = {k: v for k, v in out.items() if k.endswith(STATS) == stats}
    return out


@pytest.mark.slow  # two spawned processes, each starting torch and CUDA
@pytest.mark.numerics
@pytest.mark.multi_device
def test_sync_bn_two_ranks_equal_one_process_on_the_whole_batch(tmp_path):
    """Rule 1: in float64, each step's forward output (the ranks' halves put together), each
    rank's gradients, and at the end its weights and running statistics (the unbiased variance
    over the whole batch) against one process's plain BatchNorm on the whole batch, to 2**-24.
    The one process goes first: the ranks are spawned after it has set CUDA up."""
    device = torch.device(DEVICE)
    whole = _one_process(device, 1)
    ghost = _one_process(device, RANKS)
    ranks = _ranks(tmp_path)
    limit = 1e3 * numerics.SAME_MATH_LIMIT
    # The check can tell the whole batch from DDP's per-rank BatchNorm (a ghost batch of halves).
    assert numerics.rel_error(_kind(ghost, "gradient 0"), _kind(whole, "gradient 0")) > limit
    start = {f"final {k}": v for k, v in r18.get_weights(_net(device, False)).items()}
    assert numerics.rel_error(_kind(whole, "final", False), _kind(start, "final", False)) > limit
    for s in range(len(_batches()[2])):
        output = np.concatenate([r[f"output {s}"] for r in ranks])
        numerics.check_same_math(f"torch sync-bn step {s} output", output, whole[f"output {s}"])
        want = _kind(whole, f"gradient {s}")
        for r, got in enumerate(ranks):
            got = _kind(got, f"gradient {s}")
            numerics.check_same_math(f"torch sync-bn step {s} rank {r} gradients", got, want)
    for kind, stats in (("weights", False), ("running statistics", True)):
        want = _kind(whole, "final", stats)
        for r, got in enumerate(ranks):
            got = _kind(got, "final", stats)
            numerics.check_same_math(f"torch sync-bn rank {r} final {kind}", got, want)
