"""`python -m torch_impl.info`: what torch sees (part of `make info`)."""

import torch


def main() -> None:
    cuda = torch.version.cuda or "none"
    print(f"torch {torch.__version__} (CUDA {cuda}): {torch.cuda.device_count()} CUDA device(s)")
    for i in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(i)
        print(f"  cuda:{i} {props.name}, {props.total_memory / 2**30:.1f} GiB")
    gloo = torch.distributed.is_gloo_available()
    print(f"  cpu threads: {torch.get_num_threads()}, distributed gloo: {gloo}")


if __name__ == "__main__":
    main()
