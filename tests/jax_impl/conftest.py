from common import devices

# Two virtual CPU devices for the multi-device tests. XLA reads this once, when JAX starts, so it
# is set here, before any test module imports jax (conftest files load first).
devices.set_jax_host_devices(2)
