"""What every epoch-based training loop (lenet, resnet18) does the same way in every framework:
the strategy check, the epoch's bookkeeping and d2l's line per epoch, and the run's summary for
its record. Framework-free, so the framework files keep only what differs between frameworks.

A strategy (resnet18's data-parallel ones, in every framework) is one function
`strategy(net, optimizer, world)` holding the whole of its parallelism, which returns five
functions that its workload's `train` uses without knowing which strategy it runs:

    place(arrays)        host arrays (x_train, y_train, x_test, y_test) -> where the steps read
                         them: this process's devices
    shard(batches)       the epoch's global batches (index arrays) -> this process's part of
                         each, on its devices, as `step` takes it
    step(x, y, part)     one SGD step of the whole model on this process's part; this
                         process's summed loss, not synced (JAX: step(state, x, y, part) ->
                         (state, loss), as JAX passes state in and out)
    correct(x, y, idx)   correct predictions on this process's share of the test batch `idx`
                         (a global index array), not synced (JAX: correct(state, x, y, idx))
    total(losses, hits)  the epoch's summed loss and correct predictions over every process,
                         as two floats

`optimizer` is the framework's SGD (torch's binds the parameters; optax's and MXNet's are the
update rule alone) and `world` this process's place in the run (common.world.World, made by
its framework's `launch.join`): the devices the strategy spreads over, its rank among the
processes, and `world.sum`, with which `total` adds up what each process holds.
"""

from __future__ import annotations

import math

from common import config, timing


class Diverged(RuntimeError):
    """Training went non-finite: raised after the run's record (marked diverged) is saved."""

    def __init__(self, epoch: int, loss, unit: str = "epoch"):
        super().__init__(f"training diverged at {unit} {epoch}: loss {loss}; lower --lr")


def choose_strategy(workload: str, framework: str, requested: str | None, available) -> str:
    """The strategy to run: `requested`, or the first of `available` (the default)."""
    if requested is None:
        return available[0]
    if requested in available:
        return requested
    if len(available) == 1:
        raise config.ConfigError(
            f"{workload} has one strategy, {available[0]!r}; got {requested!r}"
        )
    raise config.ConfigError(
        f"unknown {workload} strategy {requested!r} for {framework}; "
        f"choose one of {', '.join(available)}"
    )


class EpochLog:
    """Per-epoch loss, accuracy and time; prints d2l's line for each epoch (unless `quiet`: the
    other ranks of a multi-process run). `full_steps` is an epoch's length: an epoch that ran
    fewer steps has its time extrapolated to it (the `cpu` preset's bounded epochs). An epoch
    whose loss is not finite sets `diverged` (its number): the loop stops there. `ceiling`
    (common.ceiling.Paired, --ceiling) times a repeat of the framework's ceiling step after
    each epoch is logged, so every loop gets it without a line of its own."""

    def __init__(self, epochs: int, full_steps: int, quiet: bool = False, ceiling=None):
        self.epochs, self.full_steps, self.quiet = epochs, full_steps, quiet
        self.ceiling = ceiling
        self.train_loss: list[float] = []
        self.test_acc: list[float] = []
        self.sec_per_epoch: list[float] = []
        self.timed_steps: list[int] = []
        self.images = 0
        self.timed_seconds = 0.0
        self.diverged: int | None = None

    def add(self, train_loss: float, test_acc: float, seconds: float, steps: int, images: int):
        self.train_loss.append(train_loss)
        self.test_acc.append(test_acc)
        self.sec_per_epoch.append(seconds * self.full_steps / steps)
        self.timed_steps.append(steps)
        self.images += images
        self.timed_seconds += seconds
        if not math.isfinite(train_loss):
            self.diverged = len(self.train_loss)
        if not self.quiet:
            print(
                f"epoch {len(self.train_loss)}/{self.epochs}: train loss {train_loss:.4f}, "
                f"test acc {test_acc:.4f}, {self.sec_per_epoch[-1]:.2f} s/epoch",
                flush=True,
            )
        if self.ceiling is not None and self.diverged is None:
            self.ceiling.repeat()

    @property
    def extrapolated(self) -> bool:
        return any(n != self.full_steps for n in self.timed_steps)

    def record_fields(self, warmup_seconds: float) -> dict:
        """The results.Record fields this log fills; with a ceiling, `ceiling` too (which
        common.harness.make_record puts in the record's extra)."""
        fields = {
            "epochs": len(self.train_loss),
            "sec_per_epoch": timing.summarize(self.sec_per_epoch).to_dict(),
            "warmup_seconds": warmup_seconds,
            "images_per_sec": self.images / self.timed_seconds,
            "test_acc": self.test_acc[-1],
            "test_acc_per_epoch": self.test_acc,
            "train_loss": self.train_loss,
            "extrapolated": self.extrapolated,
            "steps_timed": self.timed_steps[-1] if self.extrapolated else None,
            "diverged_at_epoch": self.diverged,
        }
        if self.ceiling is not None and self.ceiling.timer.times:
            fields["ceiling"] = self.ceiling.fields(self.sec_per_epoch, self.full_steps)
        return fields


STATE_KINDS = ("params", "grads", "opt_state")


def state_table(world, own: dict[int, dict[str, int]]) -> list[dict[str, int]]:
    """Each device's bytes of parameters, gradients and optimizer state (lesson 4's record), in
    the run's device order: `own` holds this process's devices' (by their place in that order),
    read from their local shards; the rows of every process are summed with `world.sum` (float64
    holds whole numbers exactly up to 2**53)."""
    import numpy as np

    table = np.zeros((world.plan.count, len(STATE_KINDS)))
    for i, sizes in own.items():
        table[i] = [sizes[k] for k in STATE_KINDS]
    table = np.asarray(world.sum(table))
    return [dict(zip(STATE_KINDS, map(int, row), strict=True)) for row in table]
