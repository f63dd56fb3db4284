"""`python -m mxnet_impl.info`: what MXNet sees (part of `make info`)."""

import mxnet as mx


def main() -> None:
    features = mx.runtime.Features()
    print(
        f"mxnet {mx.__version__}: {mx.context.num_gpus()} GPU(s), "
        f"CUDA build: {features.is_enabled('CUDA')}, oneDNN: {features.is_enabled('MKLDNN')}"
    )
    print("  contexts: mx.cpu(0..N-1) act as N virtual devices sharing the CPU")


if __name__ == "__main__":
    main()
