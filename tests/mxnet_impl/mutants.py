"""Planted bugs for mxnet's numerics tests (run by tests/numerics_mutants.py).

Each fits its test: rule 1 (float64) tests get semantic bugs, which float32 and float64 share;
rule 2 (float32 against float64) tests get precision bugs, which a float64 run cannot show.
"""

from tests.numerics_mutants import Mutant

R18 = "tests/mxnet_impl/test_resnet18.py::"
LENET = "tests/mxnet_impl/test_lenet.py::"
R50 = "tests/mxnet_impl/test_resnet50.py::"
BN = "tests/mxnet_impl/test_batchnorm.py::"
ZERO = "tests/mxnet_impl/test_zero.py::"

MUTANTS = [
    Mutant(
        "mxnet-r18-transposed-kernel",
        "mxnet",
        R18 + "test_float64_run_reproduces_the_fixture",
        "mxnet_impl/weights.py",
        "        p.set_data(nd.array(params[k], dtype=p.dtype))",
        "        v = params[k].swapaxes(-1, -2) if params[k].ndim == 4 else params[k]\n"
        "        p.set_data(nd.array(v, dtype=p.dtype))",
        "conv kernels loaded transposed (HW swapped) from the exchange format",
    ),
    Mutant(
        "mxnet-r18-fp16-conv1",
        "mxnet",
        R18 + "test_float32_forward_matches_the_float64_fixture",
        "mxnet_impl/resnet18.py",
        "        y = self.conv1(x)\n",
        '        y = F.cast(F.cast(self.conv1(x), "float16"), "float32")\n',
        "each block's first conv output stored in float16 (an AMP-style cast left in)",
    ),
    Mutant(
        "mxnet-r18-step-batch-size",
        "mxnet",
        R18 + "test_two_contexts_equal_one_context",
        "mxnet_impl/resnet18.py",
        "        return mdev.add_up(train_step(net, trainer, xs, ys, len(idx)))",
        "        return mdev.add_up(train_step(net, trainer, xs, ys, xs[0].shape[0] * len(xs)))",
        "Trainer.step's batch size as context 0's part times the contexts (6 for 3 + 2)",
    ),
    Mutant(
        "mxnet-r18-dist-local-kvstore",
        "mxnet",
        "tests/mxnet_impl/test_dist.py::test_two_workers_equal_one_process_with_two_contexts",
        "mxnet_impl/resnet18.py",
        "gluon.Trainer(params, optimizer, kvstore=world.group, update_on_kvstore=False)",
        'gluon.Trainer(params, optimizer, kvstore="local", update_on_kvstore=False)',
        "each worker's Trainer made with kvstore 'local', not the dist_sync one: never synced",
    ),
    Mutant(
        "mxnet-r18-warmup-ctx0-only",
        "mxnet",
        R18 + "test_warm_up_steps_leave_the_initial_weights",
        "mxnet_impl/resnet18.py",
        "    set_weights(net, initial)",
        "    for k, v in initial.items():\n"
        "        mweights.named_params(net)[k].data(run.world.devices[0])[:] = v",
        "after warm-up, initial weights written into context 0's copy only, not context 1's",
    ),
    Mutant(
        "mxnet-lenet-not-in-place",
        "mxnet",
        LENET + "test_two_devices_train_like_one",
        "mxnet_impl/lenet.py",
        "        data[i][:] = data[0].copyto(data[i].context)",
        "        data[i] = data[0].copyto(data[i].context)",
        "the book's allreduce that rebinds list entries: device 1 never gets the sum",
    ),
    Mutant(
        "mxnet-lenet-shard-batch-size",
        "mxnet",
        LENET + "test_matches_the_float64_reference_fixture[2]",
        "mxnet_impl/lenet.py",
        "            p -= lr / X.shape[0] * p.grad",
        "            p -= lr / X_shards[0].shape[0] * p.grad",
        "the summed gradient divided by a device's shard size, not the batch size",
    ),
    Mutant(
        "mxnet-lenet-fp16-loss",
        "mxnet",
        LENET + "test_float32_first_loss_matches_the_fixture",
        "mxnet_impl/lenet.py",
        "    return -nd.pick(nd.log_softmax(y_hat), y).sum()",
        '    h = nd.log_softmax(y_hat.astype("float16"))\n'
        '    return -nd.pick(h, y.astype("float16")).astype(y_hat.dtype).sum()',
        "cross-entropy's log_softmax in float16 (an AMP-style cast in the loss)",
    ),
    Mutant(
        "mxnet-r50-toy-step-scale",
        "mxnet",
        R50 + "test_toy_model_one_step_matches_numpy",
        "mxnet_impl/resnet50.py",
        "        trainer.step(1)\n    return model, loss.asscalar()",
        "        trainer.step(inputs.shape[0])\n    return model, loss.asscalar()",
        "Trainer.step(batch size) on a loss that is a mean already: the step 20x too small",
    ),
    Mutant(
        "mxnet-r50-v1-stride",
        "mxnet",
        R50 + "test_float64_forward_reproduces_the_torch_fixture",
        "mxnet_impl/resnet.py",
        "        self.conv1 = nn.Conv2D(planes, 1, use_bias=False, in_channels=inplanes)\n"
        "        self.bn1 = batch_norm(planes)\n"
        "        self.conv2 = nn.Conv2D(planes, 3, stride, 1, use_bias=False, in_channels=planes)",
        "        self.conv1 = nn.Conv2D(planes, 1, stride, use_bias=False, in_channels=inplanes)\n"
        "        self.bn1 = batch_norm(planes)\n"
        "        self.conv2 = nn.Conv2D(planes, 3, 1, 1, use_bias=False, in_channels=planes)",
        "ResNet v1's stride on the 1x1 conv, not torchvision's v1.5 (on the 3x3)",
    ),
    Mutant(
        "mxnet-r50-fp16-stem",
        "mxnet",
        R50 + "test_float32_forward_matches_the_float64_fixture",
        "mxnet_impl/resnet.py",
        "        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))",
        "        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))\n"
        '        x = F.cast(F.cast(x, "float16"), "float32")',
        "the stem's output stored in float16 (an AMP-style cast left in)",
    ),
    Mutant(
        "mxnet-r50-bn-switch-shallow",
        "mxnet",
        R50 + "test_pipeline_equals_single_with_bn_on_running_stats[1]",
        "mxnet_impl/resnet50.py",
        "    model.apply(switch)",
        "    for child in model._children.values():\n        switch(child)",
        "use_running_stats switches only the stem's BatchNorm, not those inside the blocks",
    ),
    Mutant(
        "mxnet-r50-split-drops-relu",
        "mxnet",
        R50 + "test_model_parallel_equals_single_in_train_mode",
        "mxnet_impl/resnet50.py",
        '        "stem": [model.conv1, model.bn1, model.relu, model.maxpool],',
        '        "stem": [model.conv1, model.bn1, model.maxpool],',
        "the stage split leaves out the stem's ReLU",
    ),
    Mutant(
        "mxnet-bn-context-0-statistics",
        "mxnet",
        BN + "test_two_contexts_step_as_a_ghost_batch",
        "mxnet_impl/resnet18.py",
        "    trainer.step(batch_size)\n    return [loss.sum() for loss in losses]",
        "    trainer.step(batch_size)\n"
        '    for p in net.collect_params(".*running_(mean|var)").values():\n'
        "        p.set_data(p.data(xs[0].context))\n"
        "    return [loss.sum() for loss in losses]",
        "after each step every context's running statistics taken from context 0 (DDP's buffer "
        "broadcast), where each context keeps its own",
    ),
    Mutant(
        "mxnet-bn-evaluate-each-context",
        "mxnet",
        BN + "test_the_first_context_evaluates_the_test_batch_on_its_statistics",
        "mxnet_impl/resnet18.py",
        "        return _correct_on(net, devices[0], x, y, idx)\n",
        '        rows = nd.array(idx, ctx=devices[0], dtype="int64")\n'
        "        xs, ys = (split_and_load(a.take(rows), devices, even_split=False)"
        " for a in (x, y))\n"
        "        return mdev.add_up([evaluate(net, *xy) for xy in zip(xs, ys, strict=True)])\n",
        "the test batch split over the contexts, each on its own running statistics (d2l's "
        "evaluate_accuracy_gpus), not all on the first context's",
    ),
    Mutant(
        "mxnet-bn-dist-evaluate-each-worker",
        "mxnet",
        BN + "test_dist_sync_counts_the_test_batch_on_worker_0_alone[1]",
        "mxnet_impl/resnet18.py",
        "_correct_on(net, devices[0], x, y, idx) if world.rank == 0 else nd.zeros(1)",
        "_correct_on(net, devices[0], x, y, _rows_of(idx, world.rank, world.size, len(devices)))",
        "each dist worker counts its share of the test batch on its own first context's "
        "statistics, not worker 0's",
    ),
    Mutant(
        "mxnet-zero-adamw-decay-not-times-lr",
        "mxnet",
        ZERO + "test_adamw_takes_torchs_steps",
        "mxnet_impl/zero.py",
        "numbers = dict(lr=c2 / c1, eta=self.lr,",
        "numbers = dict(lr=self.lr * c2 / c1, eta=1.0,",
        "MXNet's adamw_update given torch's lr as its learning_rate and eta 1: the decay "
        "subtracts wd * p, not lr * wd * p",
    ),
    Mutant(
        "mxnet-zero-state-updated-twice",
        "mxnet",
        ZERO + "test_adamw_takes_torchs_steps",
        "mxnet_impl/zero.py",
        "        nd.contrib.adamw_update(weight, grad, m, v, out=weight, **numbers)",
        "        for _ in range(2):\n"
        "            nd.contrib.adamw_update(weight, grad, m, v, out=weight, **numbers)",
        "a state updated twice per step: the moments and the weight take the kernel twice",
    ),
    Mutant(
        "mxnet-zero-gradient-not-averaged",
        "mxnet",
        ZERO + "test_two_contexts_equal_one_context",
        "mxnet_impl/zero.py",
        "means = [loss.sum() / batch_size for loss in losses]",
        "means = [loss.mean() for loss in losses]",
        "each context's loss averaged over its own part, the parts' means summed: the gradient "
        "not averaged over the global batch",
    ),
    Mutant(
        "mxnet-zero-servers-keep-the-frozen-optimizer",
        "mxnet",
        ZERO + "test_the_update_on_the_servers_equals_the_update_on_the_workers",
        "mxnet_impl/zero.py",
        "            world.group.set_optimizer(optimizer)\n",
        "",
        "the optimizer changed after the warm-up but not sent again: the servers' copy stays "
        "frozen (Trainer sends it once) and never updates",
    ),
]
