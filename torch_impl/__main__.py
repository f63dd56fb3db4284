"""`python -m torch_impl --workload lenet --gpus 2`: see common/cli.py for the arguments.

The same command is each DDP rank that torchrun starts (torch_impl/launch.py): torchrun's
environment makes it a worker, whose errors its launcher reports once.
"""

import sys

from common import signals


def load(workload: str):
    """The workload's module and what common needs of torch (harness.Hooks). Only the
    workload's own module is imported: resnet50's torchvision takes seconds."""
    from common import harness
    from torch_impl import ceiling, devices

    if workload == "lenet":
        from torch_impl import lenet as module
    elif workload == "resnet18":
        from torch_impl import resnet18 as module
    elif workload == "zero":
        from torch_impl import zero as module
    elif workload == "allreduce":
        from torch_impl import allreduce as module
    else:
        from torch_impl import resnet50 as module
    return module, harness.Hooks("torch", devices, ceiling.build)


def run(argv: list[str] | None = None) -> int:
    from common import cli

    return cli.run("torch", argv, load=load)


def main() -> int:
    # Imported here, under signals.main: a stop while numpy and torch import is one line too.
    from common import cli
    from torch_impl import guard

    if guard.is_worker():  # one of torchrun's ranks
        guard.worker_main(lambda: cli.start("torch", sys.argv[1:], load=load))
    return run()


if __name__ == "__main__":
    sys.exit(signals.main(main))
