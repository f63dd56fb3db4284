"""Planted bugs for torch's numerics tests (run by tests/numerics_mutants.py). Those of the GPU
tier's tests (GPU_MUTANTS) run where a CUDA GPU is visible: elsewhere their test is skipped, and a
skipped test would count as a bug not caught."""

from common import devices
from tests.numerics_mutants import Mutant

MUTANTS = [
    Mutant(
        "torch-r18-transposed-kernel",
        "torch",
        "tests/torch_impl/test_resnet18.py::test_float64_run_reproduces_the_fixture",
        "torch_impl/weights.py",
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
        "width=64, use_bn=True, residuals=2, amp=False):",
        "width=64, use_bn=True, residuals=2, amp=True):",
        "bf16 autocast on by default in the model's forward",
    ),
    Mutant(
        "torch-r18-ddp-unwrapped",
        "torch",
        "tests/torch_impl/test_resnet18.py::test_ddp_two_gloo_ranks_equal_one_device",
        "torch_impl/resnet18.py",
        "        wrapped = nn.parallel.DistributedDataParallel(net, device_ids=ids)\n",
        "        wrapped = net\n",
        "the model never wrapped in DDP: each rank trains alone on its half of the batch",
    ),
    Mutant(
        "torch-r18-ddp-whole-batch",
        "torch",
        "tests/torch_impl/test_resnet18.py::test_ddp_two_gloo_ranks_equal_one_device[per-device-bn]",
        "torch_impl/resnet18.py",
        "one_copy([data.shard_batch(idx, size)[rank] for idx in batches], device)",
        "one_copy(list(batches), device)",
        "every rank steps on the whole batch: BatchNorm's statistics are the batch's, not the "
        "rank's share's (without BatchNorm the averaged gradient would be the same)",
    ),
    Mutant(
        "torch-r18-ddp-no-buffer-broadcast",
        "torch",
        "tests/torch_impl/test_resnet18.py::test_ddp_two_gloo_ranks_equal_one_device[per-device-bn]",
        "torch_impl/resnet18.py",
        "        wrapped = nn.parallel.DistributedDataParallel(net, device_ids=ids)\n",
        "        wrapped = nn.parallel.DistributedDataParallel(\n"
        "            net, device_ids=ids, broadcast_buffers=False\n        )\n",
        "DDP without its buffer broadcast (a collective a step saved): each rank's running "
        "statistics drift from rank 0's",
    ),
    Mutant(
        "torch-r18-ddp-evaluates-local-module",
        "torch",
        "tests/torch_impl/test_resnet18.py::"
        "test_each_ddp_rank_evaluates_with_rank_0s_running_statistics",
        "torch_impl/resnet18.py",
        "        return evaluate(wrapped, x[rows], y[rows])",
        "        return evaluate(net, x[rows], y[rows])",
        "each rank evaluates its share on the module DDP wraps, with its own running statistics "
        "(DDP broadcasts rank 0's only in its own forward)",
    ),
    Mutant(
        "torch-r18-compiled-bf16-blocks",
        "torch",
        "tests/torch_impl/test_compile.py::test_compiled_steps_losses_match_eager_float64[cpu]",
        "torch_impl/resnet18.py",
        "        return F.relu(y + x)",
        "        if torch.compiler.is_compiling():  # (a round trip alone Inductor removes)\n"
        "            return F.relu((y + x).bfloat16()).to(x.dtype)\n"
        "        return F.relu(y + x)",
        "the compiled graph alone runs every block's residual add and ReLU in bf16",
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
    Mutant(
        "torch-lenet-compiled-bf16-fc1",
        "torch",
        "tests/torch_impl/test_lenet.py::test_compiled_float64_run_matches_the_fixture[cpu-1]",
        "torch_impl/lenet.py",
        '    h = F.relu(h @ params["fc1.weight"].T + params["fc1.bias"])',
        "    if torch.compiler.is_compiling():  # (a cast round trip alone Inductor removes)\n"
        '        h = (h.bfloat16() @ params["fc1.weight"].T.bfloat16()).to(X.dtype)\n'
        '        h = F.relu(h + params["fc1.bias"])\n'
        "    else:\n"
        '        h = F.relu(h @ params["fc1.weight"].T + params["fc1.bias"])',
        "the compiled graph alone runs fc1's matrix product in bf16",
    ),
    Mutant(
        "torch-lenet-generator-maxpool",
        "torch",
        "tests/torch_impl/test_lenet.py::test_the_generator_still_reproduces_the_fixture",
        "tests/fixtures/make_lenet_parity.py",
        "        nn.Conv2d(1, 20, 3),\n        nn.ReLU(),\n        nn.AvgPool2d(2),",
        "        nn.Conv2d(1, 20, 3),\n        nn.ReLU(),\n        nn.MaxPool2d(2),",
        "the reference LeNet with max-pooling (the classic LeNet) where d2l's uses average",
    ),
    Mutant(
        "torch-r18-warmup-not-restored",
        "torch",
        "tests/torch_impl/test_resnet18.py::test_warm_up_steps_leave_the_initial_weights",
        "torch_impl/resnet18.py",
        "    net.load_state_dict(initial)",
        "    pass  # the warm-up's steps are kept",
        "the warm-up steps' updates kept: training starts from moved weights",
    ),
    Mutant(
        "torch-r18-local-rank",
        "torch",
        "tests/torch_impl/test_multinode.py::test_two_nodes_on_localhost_match_one_node",
        "torch_impl/resnet18.py",
        "    device, rank, size = world.devices[0], world.rank, world.size",
        '    device, rank = world.devices[0], int(os.environ.get("LOCAL_RANK", 0))\n'
        "    size = world.size",
        "the batch sliced by LOCAL_RANK: on two nodes both ranks train on the same half",
    ),
    Mutant(
        "torch-toy-no-relu",
        "torch",
        "tests/torch_impl/test_resnet50.py::test_toy_model_one_step_matches_numpy",
        "torch_impl/resnet50.py",
        "        x = self.relu(self.net1(x.to(self.devices[0])))",
        "        x = self.net1(x.to(self.devices[0]))",
        "the toy model's ReLU left out",
    ),
    Mutant(
        "torch-r50-pipeline-order",
        "torch",
        "tests/torch_impl/test_resnet50.py::test_pipeline_equals_single_with_bn_on_running_stats[1]",
        "torch_impl/resnet50.py",
        "        return torch.cat(acts)",
        "        return torch.cat(acts[::-1])",
        "micro-batch outputs put back together in reverse order",
    ),
    Mutant(
        "torch-r50-bn-eps",
        "torch",
        "tests/torch_impl/test_resnet50.py::test_float64_forward_reproduces_the_fixture",
        "torch_impl/resnet50.py",
        "    return ResNet(Bottleneck, list(depths), num_classes=num_classes)",
        "    return ResNet(Bottleneck, list(depths), num_classes=num_classes,\n"
        "                  norm_layer=lambda c: nn.BatchNorm2d(c, eps=1e-3))",
        "BatchNorm eps 1e-3 (Keras' default) for torch's 1e-5",
    ),
    Mutant(
        "torch-r50-transposed-kernel",
        "torch",
        "tests/torch_impl/test_resnet50.py::test_float32_forward_matches_the_float64_fixture",
        "torch_impl/weights.py",
        "    state = {k: torch.from_numpy(np.asarray(v)) for k, v in params.items()}",
        "    state = {k: torch.from_numpy(np.asarray(v)) for k, v in params.items()}\n"
        "    state = {k: v.transpose(-1, -2) if v.dim() == 4 else v for k, v in state.items()}",
        "conv kernels loaded transposed (HW swapped) from the exchange format",
    ),
    Mutant(
        "torch-r50-gpipe-unscaled",
        "torch",
        "tests/torch_impl/test_resnet50.py::test_pipelining_engine_matches_single[gpipe]",
        "torch_impl/pipelining.py",
        "    return schedule_cls(stage, n_microbatches=n_micro, loss_fn=nn.MSELoss())",
        "    return schedule_cls(\n        stage, n_microbatches=n_micro, "
        "loss_fn=nn.MSELoss(), scale_grads=False\n    )",
        "gradients summed over micro-batches, not averaged (a step n_micro times too big)",
    ),
    Mutant(
        "torch-r50-stem-relu-dropped",
        "torch",
        "tests/torch_impl/test_resnet50.py::test_model_parallel_equals_single_exactly_in_train_mode",
        "torch_impl/resnet50.py",
        '        "stem": [model.conv1, model.bn1, model.relu, model.maxpool],',
        '        "stem": [model.conv1, model.bn1, model.maxpool],',
        "the first stage's stem without its ReLU (the tutorial's seq1 written out by hand)",
    ),
    Mutant(
        "torch-zero3-root-gradients-not-reduced",
        "torch",
        "tests/torch_impl/test_zero.py::test_each_sharded_strategy_equals_ddp_and_one_device",
        "torch_impl/zero.py",
        "    fully_shard(net, mesh=mesh, reshard_after_forward=True)\n",
        "    fully_shard(net, mesh=mesh, reshard_after_forward=True)\n"
        "    net.set_requires_gradient_sync(False)\n",
        "ZeRO-3's root group (stem and head) with FSDP's gradient-accumulation switch left on: "
        "its gradients are never reduce-scattered (averaged) over the ranks",
    ),
    Mutant(
        "torch-zero1-without-ddp",
        "torch",
        "tests/torch_impl/test_zero.py::test_each_sharded_strategy_equals_ddp_and_one_device",
        "torch_impl/zero.py",
        "    wrapped = nn.parallel.DistributedDataParallel(net) if size > 1 else net\n"
        "    optimizer = ZeroRedundancyOptimizer(",
        "    wrapped = net\n    optimizer = ZeroRedundancyOptimizer(",
        "ZeroRedundancyOptimizer taken for the whole of data parallelism, the model not wrapped "
        "in DDP: each rank steps its partition with its own rows' gradient, never averaged",
    ),
    Mutant(
        "torch-zero2-shard-stepped-twice",
        "torch",
        "tests/torch_impl/test_zero.py::test_each_sharded_strategy_equals_ddp_and_one_device",
        "torch_impl/zero.py",
        "    fully_shard(net, mesh=mesh, reshard_after_forward=False)\n"
        "    optimizer = optimizer(net.parameters())\n"
        "\n"
        "    def place(arrays):\n"
        "        return tdev.to_device(data.as_float(arrays, np.int64), device)\n"
        "\n"
        "    def shard(batches):\n"
        "        return tdev.one_copy([data.shard_batch(idx, size)[rank] for idx in batches], "
        "device)\n"
        "\n"
        "    def step(x, y, rows):\n"
        "        return r18.train_step(net, optimizer, x[rows], y[rows]) * len(rows)\n",
        "    fully_shard(net, mesh=mesh, reshard_after_forward=False)\n"
        "    optimizer = optimizer(net.parameters())\n"
        "\n"
        "    def place(arrays):\n"
        "        return tdev.to_device(data.as_float(arrays, np.int64), device)\n"
        "\n"
        "    def shard(batches):\n"
        "        return tdev.one_copy([data.shard_batch(idx, size)[rank] for idx in batches], "
        "device)\n"
        "\n"
        "    def step(x, y, rows):\n"
        "        loss = r18.train_step(net, optimizer, x[rows], y[rows])\n"
        "        optimizer.step()  # (a step left behind)\n"
        "        return loss * len(rows)\n",
        "ZeRO-2's AdamW steps each rank's shard twice on the same gradients",
    ),
    Mutant(
        "torch-zero1-local-step-not-broadcast",
        "torch",
        "tests/torch_impl/test_zero.py::test_each_sharded_strategy_equals_ddp_and_one_device",
        "torch_impl/zero.py",
        "    optimizer = ZeroRedundancyOptimizer(net.parameters(), optimizer_class=optimizer)\n",
        "    optimizer = ZeroRedundancyOptimizer(\n"
        "        net.parameters(), optimizer_class=optimizer\n    ).optim\n",
        "ZeRO-1's local AdamW stepped in place of ZeroRedundancyOptimizer: each rank updates its "
        "own partition, and the other ranks' updated shards are never broadcast (gathered)",
    ),
    Mutant(
        "torch-zero3-evaluates-own-statistics",
        "torch",
        "tests/torch_impl/test_zero.py::test_every_rank_evaluates_with_rank_0s_running_statistics",
        "torch_impl/zero.py",
        "    def correct(x, y, idx):\n        for buffer in net.buffers():\n"
        "            dist.broadcast(buffer, src=0)\n",
        "    def correct(x, y, idx):\n",
        "ZeRO-3's ranks evaluate with their own running statistics: FSDP never broadcasts buffers",
    ),
    Mutant(
        "torch-zero3-adamw-bound-before-sharding",
        "torch",
        "tests/torch_impl/test_zero.py::"
        "test_in_float32_each_sharded_strategy_stays_within_ddps_own_rounding",
        "torch_impl/zero.py",
        "    for stage in (net.layer1, net.layer2, net.layer3, net.layer4):\n"
        "        fully_shard(stage, mesh=mesh, reshard_after_forward=True)\n"
        "    fully_shard(net, mesh=mesh, reshard_after_forward=True)\n"
        "    optimizer = optimizer(net.parameters())\n",
        "    optimizer = optimizer(net.parameters())\n"
        "    for stage in (net.layer1, net.layer2, net.layer3, net.layer4):\n"
        "        fully_shard(stage, mesh=mesh, reshard_after_forward=True)\n"
        "    fully_shard(net, mesh=mesh, reshard_after_forward=True)\n",
        "ZeRO-3's AdamW bound to the parameters before fully_shard replaced them with shards: "
        "it steps tensors the model no longer uses",
    ),
]

GPU_MUTANTS = [
    Mutant(
        "torch-sync-bn-ddp-unwrapped",
        "torch",
        "tests/torch_impl/test_sync_bn.py::"
        "test_sync_bn_two_ranks_equal_one_process_on_the_whole_batch",
        "torch_impl/resnet18.py",
        "        wrapped = nn.parallel.DistributedDataParallel(net, device_ids=ids)\n",
        "        wrapped = net\n",
        "SyncBatchNorm taken for the whole synchronisation, the model not wrapped in DDP: the "
        "statistics are the whole batch's, the gradients each rank's own half's, never averaged",
    ),
]
if devices.count_accelerators() > 0:
    MUTANTS += GPU_MUTANTS
