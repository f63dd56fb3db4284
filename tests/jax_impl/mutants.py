"""Planted bugs for jax's numerics tests (run by tests/numerics_mutants.py)."""

from tests.numerics_mutants import Mutant

R18, LENET = "tests/jax_impl/test_resnet18.py", "tests/jax_impl/test_lenet.py"
R50 = "tests/jax_impl/test_resnet50.py"
ZERO = "tests/jax_impl/test_zero.py"
# pmap's bucketed pmean of the gradients and the loss (shard_map's is followed by its statistics)
PMAP_PMEAN = (
    "grads, loss = unravel(lax.pmean(flat, AXIS))  # every device's, averaged\n        return apply"
)

MUTANTS = [
    Mutant(
        "jax-r18-transposed-kernel",
        "jax",
        f"{R18}::test_float64_run_reproduces_the_fixture",
        "jax_impl/weights.py",
        "return a.transpose(2, 3, 1, 0) if a.ndim == 4",
        "return a.transpose(3, 2, 1, 0) if a.ndim == 4",
        "conv kernels loaded transposed (HW swapped) from the exchange format",
    ),
    Mutant(
        "jax-r18-bn-momentum",
        "jax",
        f"{R18}::test_batchnorm_running_statistics_use_torchs_momentum",
        "jax_impl/resnet18.py",
        "partial(nn.BatchNorm, momentum=0.9,",
        "partial(nn.BatchNorm, momentum=0.1,",
        "torch's BatchNorm momentum 0.1 written as flax's momentum (which weighs the old value)",
    ),
    Mutant(
        "jax-r18-bf16-block-convs",
        "jax",
        f"{R18}::test_float32_forward_matches_the_float64_fixture",
        "jax_impl/resnet18.py",
        "        conv = partial(nn.Conv, dtype=self.dtype)",
        "        conv = partial(nn.Conv, dtype=jnp.bfloat16)",
        "each residual block's convs hard-wired to bf16 compute (mixed precision left on)",
    ),
    Mutant(
        "jax-r18-pmap-local-bn",
        "jax",
        f"{R18}::test_two_devices_with_sync_bn_equal_one_device_on_the_whole_batch[pmap]",
        "jax_impl/resnet18.py",
        "        norm = partial(batch_norm, train, self.use_bn, self.axis_name, self.dtype)",
        "        norm = partial(batch_norm, train, self.use_bn, None, self.dtype)",
        "--sync-bn's axis not given to the blocks' BatchNorms: per-device batch statistics",
    ),
    Mutant(
        "jax-r18-pmap-no-pmean",
        "jax",
        f"{R18}::test_two_devices_equal_one_device_normalising_each_share[pmap]",
        "jax_impl/resnet18.py",
        PMAP_PMEAN,
        "grads, loss = unravel(flat)  # every device's, averaged\n        return apply",
        "pmap without the gradient all-reduce: each device steps on its own half-batch gradient",
    ),
    Mutant(
        "jax-r18-pmap-psum",
        "jax",
        f"{R18}::test_two_devices_equal_one_device_normalising_each_share[pmap]",
        "jax_impl/resnet18.py",
        PMAP_PMEAN,
        PMAP_PMEAN.replace("lax.pmean", "lax.psum"),
        "gradients psum'd instead of pmean'd: every step N times too large",
    ),
    Mutant(
        "jax-r18-shard-map-replicated-grad",
        "jax",
        f"{R18}::test_two_devices_equal_one_device_normalising_each_share[shard_map]",
        "jax_impl/resnet18.py",
        'mine = lax.pcast(state["params"], AXIS, to="varying")',
        'mine = state["params"]',
        "the replicated weights differentiated, not each device's copy: grad sums their "
        "gradients over the devices already, and the pmean leaves N times the gradient",
    ),
    Mutant(
        "jax-r18-sharding-whole-batch-bn",
        "jax",
        f"{R18}::test_two_devices_equal_one_device_normalising_each_share[sharding]",
        "jax_impl/resnet18.py",
        "loss, grads, stats = gradients(net, state, x, y[idx], shares=n)",
        "loss, grads, stats = gradients(net, state, x, y[idx])",
        "sharding's batch through BatchNorm whole: the global batch's statistics, not each "
        "device's share's",
    ),
    Mutant(
        "jax-r18-pmap-stats-averaged",
        "jax",
        f"{R18}::test_two_devices_equal_one_device_normalising_each_share[pmap]",
        "jax_impl/resnet18.py",
        PMAP_PMEAN,
        "grads, loss = unravel(lax.pmean(flat, AXIS))  # every device's, averaged\n"
        "        stats = lax.pmean(stats, AXIS)\n        return apply",
        "the running statistics pmean'd with the gradients: every device's the average, not its "
        "own share's",
    ),
    Mutant(
        "jax-r18-sharding-stats-averaged",
        "jax",
        f"{R18}::test_two_devices_equal_one_device_normalising_each_share[sharding]",
        "jax_impl/resnet18.py",
        "            logits = logits.reshape(len(x), -1)\n",
        "            logits = logits.reshape(len(x), -1)\n"
        "            stats = jax.tree.map(lambda a: jnp.broadcast_to(a.mean(0), a.shape), stats)\n",
        "the vmap's rows of running statistics averaged (an all-reduce of them each step): every "
        "device's the average, not its own share's",
    ),
    Mutant(
        "jax-r18-pmap-evaluates-own-statistics",
        "jax",
        f"{R18}::test_every_device_evaluates_with_device_0s_running_statistics[pmap]",
        "jax_impl/resnet18.py",
        'stats = jax.tree.map(partial(lax.all_gather, axis_name=AXIS), state["batch_stats"])',
        'stats = jax.tree.map(lambda a: a[None], state["batch_stats"])',
        "each device evaluates its part of the test batch with its own running statistics, not "
        "device 0's",
    ),
    Mutant(
        "jax-r18-evaluates-averaged-statistics",
        "jax",
        f"{R18}::test_every_device_evaluates_with_device_0s_running_statistics[sharding]",
        "jax_impl/resnet18.py",
        '    stats = jax.tree.map(lambda a: a[0], state["batch_stats"])',
        '    stats = jax.tree.map(lambda a: a.mean(0), state["batch_stats"])',
        "evaluation with the devices' running statistics averaged, not device 0's",
    ),
    Mutant(
        "jax-lenet-allreduce-term",
        "jax",
        f"{LENET}::test_matches_the_float64_reference_fixture[2]",
        "jax_impl/lenet.py",
        "    for i in range(1, len(data)):\n        total = _add(total, jax.device_put(",
        "    for i in range(2, len(data)):\n        total = _add(total, jax.device_put(",
        "allreduce misses device 1's gradient (an off-by-one in the sum)",
    ),
    Mutant(
        "jax-lenet-shard-batch-size",
        "jax",
        f"{LENET}::test_two_devices_train_like_one",
        "jax_impl/lenet.py",
        "        _sgd(params, grads, lr, X.shape[0])",
        "        _sgd(params, grads, lr, len(X_shards[0]))",
        "the summed gradient divided by a device's shard size, not the batch size",
    ),
    Mutant(
        "jax-lenet-flatten",
        "jax",
        f"{LENET}::test_float32_first_loss_matches_the_fixture",
        "jax_impl/lenet.py",
        "    h = h.transpose(0, 3, 1, 2).reshape(h.shape[0], -1)  # NCHW flatten: 50 x 4 x 4 = 800",
        "    h = h.reshape(h.shape[0], -1)",
        "NHWC flatten order before fc1 (the fixture's weights are NCHW-ordered)",
    ),
    Mutant(
        "jax-r50-micro-batch-scale",
        "jax",
        f"{R50}::test_pipeline_equals_single_with_bn_on_running_stats[3]",
        "jax_impl/resnet50.py",
        "                    *stage, ys[i], self.train_bn, s > 0, labels.size\n",
        "                    *stage, ys[i], self.train_bn, s > 0, ys[i].size\n",
        "each micro-batch's loss scaled by its own size, not the batch's: unequal weights",
    ),
    Mutant(
        "jax-r50-toy-no-relu",
        "jax",
        f"{R50}::test_toy_model_one_step_matches_numpy",
        "jax_impl/resnet50.py",
        '        x = nn.relu(nn.Dense(10, name="net1")(jax.device_put(x, devices[0])))',
        '        x = nn.Dense(10, name="net1")(jax.device_put(x, devices[0]))',
        "the toy model's activation dropped between the two devices",
    ),
    Mutant(
        "jax-r50-v1-stride",
        "jax",
        f"{R50}::test_float64_forward_reproduces_the_fixture",
        "jax_impl/resnet.py",
        '(1, 1), use_bias=False, name="conv1")(x)\n'
        '        out = nn.relu(batch_norm(train, "bn1")(out))\n'
        "        out = nn.Conv(\n            self.planes, (3, 3), self.stride,",
        '(1, 1), self.stride, use_bias=False, name="conv1")(x)\n'
        '        out = nn.relu(batch_norm(train, "bn1")(out))\n'
        "        out = nn.Conv(\n            self.planes, (3, 3), 1,",
        "ResNet v1's stride on the 1x1 conv, not torchvision's v1.5 (on the 3x3)",
    ),
    Mutant(
        "jax-r18-float32-inputs-to-bf16",
        "jax",
        f"{R18}::test_float32_gradients_match_float64[cpu]",
        "jax_impl/resnet18.py",
        "    def __call__(self, x, train=True):\n",
        "    def __call__(self, x, train=True):\n"
        "        x = x.astype(jnp.bfloat16) if x.dtype == jnp.float32 else x\n",
        "float32 inputs cast to bf16 on the way in (a mixed-precision policy's cast)",
    ),
    Mutant(
        "jax-r50-bf16-head",
        "jax",
        f"{R50}::test_float32_forward_matches_the_float64_fixture",
        "jax_impl/resnet.py",
        'nn.Dense(self.num_classes, name="fc")',
        'nn.Dense(self.num_classes, dtype=jnp.bfloat16, name="fc")',
        "ResNet-50's classifier in bf16 compute (mixed precision left on in the head)",
    ),
    Mutant(
        "jax-r50-stage-stats-dropped",
        "jax",
        f"{R50}::test_model_parallel_equals_single_in_train_mode",
        "jax_impl/resnet50.py",
        "acts[i], vjps[s, i], self.stats[s] = stage_forward(",
        "acts[i], vjps[s, i], _ = stage_forward(",
        "a stage that is not the last drops its updated BatchNorm statistics",
    ),
    Mutant(
        "jax-zero-shard-not-gathered",
        "jax",
        f"{ZERO}::test_sharded_strategies_step_adamw_as_one_device[fsdp_explicit]",
        "jax_impl/zero.py",
        "blocks = jax.vmap(unravel)(lax.all_gather(flat, AXIS))",
        "blocks = jax.vmap(unravel)(jnp.stack([flat] * lax.axis_size(AXIS)))",
        "the forward's weights built from the device's own shard in every place: the others' "
        "shards never gathered",
    ),
    Mutant(
        "jax-zero-gradient-not-averaged",
        "jax",
        f"{ZERO}::test_sharded_strategies_step_adamw_as_one_device[fsdp_explicit]",
        "jax_impl/zero.py",
        "grads = jax.tree.map(lambda g: g / n, _scatter(grads, axes, n, bucketed))",
        "grads = _scatter(grads, axes, n, bucketed)",
        "psum_scatter's sum of the gradients kept, not divided by N: AdamW's moments N times "
        "(and N squared) too large",
    ),
    Mutant(
        "jax-zero-state-shard-updated-twice",
        "jax",
        f"{ZERO}::test_sharded_strategies_step_adamw_as_one_device[fsdp_explicit]",
        "jax_impl/zero.py",
        "state = r18.apply_gradients(optimizer, state, grads, stats)",
        "state = r18.apply_gradients(optimizer, state, grads, stats)\n"
        "        state = r18.apply_gradients(optimizer, state, grads, stats)",
        "each device's shard of the state stepped twice with the same gradient shard",
    ),
]
