"""common.flops against XLA's own counter (HloCostAnalysis, via `.lower(...).cost_analysis()`)
on the project's JAX models.

XLA's figure for a whole program also counts the elementwise ops (bias adds, BatchNorm, ReLU,
pooling), which common.flops leaves out. So the convolutions and dense layers are isolated: the
model's forward is traced to a jaxpr, and every conv_general_dilated and dot_general in it is
lowered on its own and costed by XLA. Those costs must equal common.flops layer by layer.

One convention differs and is matched, not tolerated: XLA counts only the kernel taps that land
inside the image, none on the zero padding, so the comparison is with count_padding=False (the
default convention, every tap, is checked against torch's FlopCounterMode in tests/torch_impl).
Only shapes are traced (ShapeDtypeStruct, eval_shape): nothing is computed.
"""

from functools import partial

import jax
import jax.numpy as jnp
import pytest

from common import flops
from jax_impl import lenet
from jax_impl import resnet18 as r18
from jax_impl import resnet50 as r50

BATCH = 2
MATMULS = ("conv_general_dilated", "dot_general")


def forward_jaxpr(workload, shape):
    """The jaxpr of the project's model forward on BATCH images (BatchNorm in eval mode)."""
    if workload == "lenet":
        params = {k: jax.ShapeDtypeStruct(s, jnp.float32) for k, s in lenet.SHAPES.items()}
        x = jax.ShapeDtypeStruct((BATCH, 1, 28, 28), jnp.float32)  # NCHW, as the model
        return jax.make_jaxpr(lenet.lenet)(x, params)
    if workload == "resnet18":
        net, size, channels = r18.resnet18(width=shape["width"]), 28, 1
    else:
        net, size, channels = r50.ResNet50(), shape["image_size"], 3
    x = jax.ShapeDtypeStruct((BATCH, size, size, channels), jnp.float32)  # flax: NHWC
    variables = jax.eval_shape(partial(net.init, train=False), jax.random.key(0), x)
    return jax.make_jaxpr(partial(net.apply, train=False))(variables, x)


def equations(jaxpr):
    """Every equation, those inside nested jaxprs (jit, custom_jvp) included, in order."""
    for eqn in jaxpr.eqns:
        yield eqn
        for param in eqn.params.values():
            for sub in param if isinstance(param, list | tuple) else [param]:
                if hasattr(sub, "eqns"):
                    yield from equations(sub)
                elif hasattr(getattr(sub, "jaxpr", None), "eqns"):
                    yield from equations(sub.jaxpr)


def xla_flops(eqn):
    """XLA's cost analysis of one equation, lowered alone on its operands' shapes."""
    args = [jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype) for v in eqn.invars]
    fn = jax.jit(lambda *a: eqn.primitive.bind(*a, **eqn.params))
    return fn.lower(*args).cost_analysis()["flops"]


@pytest.mark.parametrize(
    "workload, shape",
    [
        ("lenet", {}),  # no padding: XLA's and the usual convention agree
        ("resnet18", {"width": 8}),
        ("resnet18", {"width": 64}),
        ("resnet50", {"image_size": 64}),
    ],
)
def test_conv_and_dense_match_xla_cost_analysis(workload, shape):
    jaxpr = forward_jaxpr(workload, shape).jaxpr
    xla = [xla_flops(e) for e in equations(jaxpr) if e.primitive.name in MATMULS]
    # the flax models run their layers in the order common.flops lists them
    ours = [BATCH * layer.flops for layer in flops.layers(workload, count_padding=False, **shape)]
    assert xla == ours
