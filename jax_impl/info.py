"""`python -m jax_impl.info`: what JAX sees (part of `make info`)."""

import jax


def main() -> None:
    print(f"jax {jax.__version__}: backend {jax.default_backend()}, {jax.device_count()} device(s)")
    for d in jax.devices():
        print(f"  {d.id}: {d.device_kind} ({d.platform})")


if __name__ == "__main__":
    main()
