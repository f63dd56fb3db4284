from common import devices

# Two virtual CPU devices for the multi-device tests. XLA reads this once, when JAX starts, so it
# is set here, before any test module imports jax (conftest files load first).
devices.set_jax_host_devices(2)

import jax  # noqa: E402  (after the device count)

# Uncommitted arrays and computations go to the CPU even on a GPU machine: the CPU tests'
# tolerances assume float32 arithmetic, and XLA's GPU default for float32 matmuls is TF32.
# The GPU tests place their arrays on the GPU explicitly.
jax.config.update("jax_default_device", jax.devices("cpu")[0])
