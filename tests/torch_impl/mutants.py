"""Planted bugs for torch's numerics tests (run by tests/numerics_mutants.py)."""

from tests.numerics_mutants import Mutant

MUTANTS = [
    Mutant(
        "torch-r18-transposed-kernel",
        "torch",
        "tests/torch_impl/test_resnet18.py::test_float64_run_reproduces_the_fixture",
        "torch_impl/resnet18.py",
        "state = {k: torch.from_numpy(np.asarray(v)) for k, v in params.items()}",
        "state = {k: torch.from_numpy(np.asarray(v).swapaxes(-1, -2).copy() if np.ndim(v) == 4"
        " else np.asarray(v)) for k, v in params.items()}",
        "conv kernels loaded transposed (HW swapped) from the exchange format",
    ),
    Mutant(
        "torch-r18-autocast-conv1",
        "torch",
        "tests/torch_impl/test_resnet18.py::test_float32_gradients_match_float64[cpu]",
        "torch_impl/resnet18.py",
        "        y = F.relu(self.bn1(self.conv1(x)))",
        "        with torch.autocast(x.device.type, dtype=torch.bfloat16):\n"
        "            y = self.conv1(x)\n        y = F.relu(self.bn1(y.to(x.dtype)))",
        "each block's first conv under bf16 autocast (mixed precision hard-wired on)",
    ),
    Mutant(
        "torch-r18-amp-default",
        "torch",
        "tests/torch_impl/test_resnet18.py::test_float32_forward_matches_the_float64_fixture",
        "torch_impl/resnet18.py",
        "def train_step(net, optimizer, x, y, scale=1.0, amp=False):",
        "def train_step(net, optimizer, x, y, scale=1.0, amp=True):",
        "bf16 autocast on by default in the training step",
    ),
    Mutant(
        "torch-r18-ddp-scale",
        "torch",
        "tests/torch_impl/test_resnet18.py::test_ddp_two_gloo_ranks_equal_one_device",
        "torch_impl/resnet18.py",
        "    return part, len(part) * world / len(idx)",
        "    return part, 1.0",
        "uneven last batch: each rank's mean loss not weighted by its share of the global batch",
    ),
    Mutant(
        "torch-lenet-allreduce-term",
        "torch",
        "tests/torch_impl/test_lenet.py::test_matches_the_float64_reference_fixture[2]",
        "torch_impl/lenet.py",
        "    for i in range(1, len(data)):\n        data[0][:] += data[i].to(data[0].device)",
        "    for i in range(2, len(data)):\n        data[0][:] += data[i].to(data[0].device)",
        "allreduce misses device 1's gradient (an off-by-one in the sum)",
    ),
    Mutant(
        "torch-lenet-not-in-place",
        "torch",
        "tests/torch_impl/test_lenet.py::test_two_devices_train_like_one",
        "torch_impl/lenet.py",
        "        data[i][:] = data[0].to(data[i].device)  # `data[i] = ...` would update only the "
        "list",
        "        data[i] = data[0].to(data[i].device)",
        "the book's allreduce that rebinds list entries: device 1 never gets the sum",
    ),
    Mutant(
        "torch-lenet-flatten",
        "torch",
        "tests/torch_impl/test_lenet.py::test_float32_first_loss_matches_the_fixture",
        "torch_impl/lenet.py",
        "    h = h.reshape(h.shape[0], -1)  # NCHW flatten: 50 x 4 x 4 = 800",
        "    h = h.permute(0, 2, 3, 1).reshape(h.shape[0], -1)",
        "NHWC flatten order before fc1 (the fixture's weights are NCHW-ordered)",
    ),
]
