"""`python -m compare.run --frameworks torch jax mxnet --workloads lenet resnet18 resnet50
    --results PATH --out DIR [--preset P] --platform auto [--dry-run]`: what `make compare` runs.

Every workload of every framework, in that framework's environment
(`.venv/<fw>/bin/python -m <fw>_impl ...`; `--python P`: one interpreter for all), on 1 and 2
devices with the strategies that run on this machine (the table RUNS in compare/plan.py), at
the preset that fits the machine; then the report. Each step opens with its number in the plan.
A failed run is reported at the end with the last lines of its stderr, and the others still
run; the exit code is 0 only if everything planned ran.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from common import config, devices, processes, signals
from common.results import ResultsError, check_writable
from compare.plan import ALL, Plan, PlanError, Step, make_plan, select
from compare.stream import stream

ROOT = Path(__file__).resolve().parents[1]


# --- running --------------------------------------------------------------------------------------


@dataclass
class Outcome:
    step: Step
    returncode: int | None  # None: did not start
    seconds: float
    tail: list[str]  # last lines of its stderr
    reason: str = ""

    @property
    def ok(self) -> bool:
        return self.returncode == 0


def python_for(framework: str, venv: Path, python: str | None = None) -> Path:
    """The interpreter of a framework's runs: its environment's, or `python` (--python) for all."""
    if python:
        return Path(shutil.which(python) or python)
    return venv / framework / "bin" / "python"


def not_set_up(frameworks, venv: Path) -> dict[str, str]:
    """The frameworks `make setup` skipped on this machine, with its reason (tools/venv.sh writes
    `<venv>/<framework>.skipped`: MXNet without Python 3.10/3.11)."""
    notes = {fw: venv / f"{fw}.skipped" for fw in frameworks}
    return {fw: note.read_text().strip() for fw, note in notes.items() if note.is_file()}


def without(plan: Plan, unset: dict[str, str]) -> Plan:
    """`plan` with the steps of the frameworks in `unset` moved to its skipped list."""
    gone = [(s, f"not set up: {unset[s.framework]}") for s in plan.steps if s.framework in unset]
    kept = tuple(s for s in plan.steps if s.framework not in unset)
    return dataclasses.replace(plan, steps=kept, skipped=(*plan.skipped, *gone))


def execute(
    plan: Plan,
    results: str,
    venv: Path,
    echo=print,
    runner=stream,
    timeout=None,
    python=None,
    clock=time.perf_counter,
):
    """Run every step; a failure is recorded and the next step runs."""
    outcomes = []
    total = len(plan.steps)
    for i, step in enumerate(plan.steps, start=1):
        head = f"[{i}/{total}]"
        exe = python_for(step.framework, venv, python)
        if not exe.exists():
            setup = f"make setup FRAMEWORK={step.framework}"
            reason = (
                f"no interpreter {python}"
                if python
                else f"no environment {exe.parent.parent} (run: {setup})"
            )
            echo(f"{head} {step.describe()}: SKIPPED, {reason}")
            outcomes.append(Outcome(step, None, 0.0, [], reason))
            continue
        cmd = [str(exe), *step.args(plan.platform, plan.preset, results)]
        echo(f"{head} {step.describe()}")
        echo(f"    $ {' '.join(cmd)}")
        start = clock()
        code, tail, note = runner(cmd, echo, timeout)
        seconds = clock() - start
        reason = note or explain(code)
        ok = code == 0 and not note
        echo(
            f"{head} {'ok' if ok else 'FAILED (' + reason + ')'} "
            f"in {seconds:.1f} s: {step.describe()}"
        )
        outcomes.append(Outcome(step, code if not note else -1, seconds, tail, reason))
    return outcomes


def explain(code: int) -> str:
    if code == 0:
        return ""
    if code == 2:
        return "exit 2: bad input"
    if code == 3:
        return "exit 3: not implemented yet"
    if code < 0:
        return f"killed by signal {-code}"
    return f"exit {code}"


def summary(outcomes: list[Outcome], plan: Plan, echo=print) -> None:
    echo("\n== summary")
    for o in outcomes:
        status = "ok" if o.ok else "NOT RUN" if o.returncode is None else "FAILED"
        why = f": {o.reason}" if o.reason else ""
        echo(f"  {o.seconds:8.1f} s  {status:<8} {o.step.describe()}{why}")
    for step, reason in plan.skipped:
        echo(f"  {'':>8}    {'skipped':<8} {step.describe()}: {reason}")
    for o in outcomes:
        if not o.ok and o.tail:
            echo(f"\n-- {o.step.describe()}: last lines of stderr")
            for line in o.tail:
                echo(f"    {line}")
    ok = sum(o.ok for o in outcomes)
    not_run = sum(o.returncode is None for o in outcomes)
    echo(
        f"\n{ok} of {len(outcomes)} run(s) ok, {len(outcomes) - ok - not_run} failed, "
        f"{not_run} not run, {len(plan.skipped)} skipped on this machine"
    )


def show_plan(plan: Plan, results: str, out: str, echo=print, python=None) -> None:
    kind = (
        f"{plan.accelerators} GPU(s)"
        if plan.platform == "gpu"
        else "no accelerator: virtual CPU devices"
    )
    echo(f"plan: platform {plan.platform} ({kind}), preset {plan.preset}, results {results}")
    for i, step in enumerate(plan.steps, start=1):
        argv = " ".join(step.args(plan.platform, plan.preset, results))
        echo(f"  {i:2d}. {python or f'.venv/{step.framework}/bin/python'} {argv}")
    for step, reason in plan.skipped:
        echo(f"  skip: {step.describe()}: {reason}")
    echo(f"  then: python -m compare.report --results {results} --out {out}")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m compare.run",
        description="Run every framework x workload on 1 and 2 devices, then write the report.",
    )
    p.add_argument("--frameworks", nargs="+", default=list(ALL))
    p.add_argument("--workloads", nargs="+", default=list(config.WORKLOADS))
    p.add_argument("--results", default="results/results.jsonl")
    p.add_argument("--out", default="reports")
    p.add_argument("--preset", default=None, help="default: full with accelerators, cpu without")
    p.add_argument("--platform", default="auto", help="auto | gpu | cpu")
    p.add_argument("--dry-run", action="store_true", help="print the plan and stop")
    p.add_argument(
        "--steps",
        nargs="+",
        default=None,
        metavar="N[-M]",
        help="run only these steps of the plan, numbered as --dry-run prints them (e.g. 1-4 7): "
        "a long plan in parts, or one failed step again",
    )
    p.add_argument(
        "--assume-gpus",
        type=int,
        default=None,
        metavar="N",
        help="with --dry-run: the plan of a machine with N GPUs (to split a GPU session's plan "
        "into --steps from another machine)",
    )
    p.add_argument("--html", action="store_true", help="also write report.html")
    p.add_argument(
        "--timeout",
        type=float,
        default=None,
        help="seconds per run (default: none); a run past it is stopped as by a Ctrl-C, its "
        "workers with it (killed, if it has not ended a minute later), and the next one starts",
    )
    p.add_argument("--venv", default=str(ROOT / ".venv"), help="where the framework venvs are")
    p.add_argument(
        "--python",
        default=None,
        help="one interpreter for every framework instead of the venvs (a machine whose Python "
        "has them all, such as a GPU image); choose its --frameworks",
    )
    return p


def main(argv: list[str] | None = None, runner=stream, echo=print) -> int:
    args = parser().parse_args(argv)
    gpus = devices.count_accelerators() if args.assume_gpus is None else args.assume_gpus
    try:
        if args.assume_gpus is not None and (not args.dry_run or args.assume_gpus < 0):
            raise PlanError("--assume-gpus N (N >= 0) only plans: add --dry-run")
        if args.timeout is not None and not (math.isfinite(args.timeout) and args.timeout > 0):
            raise PlanError(f"--timeout must be a number of seconds > 0, got {args.timeout}")
        wanted = (args.frameworks, args.workloads, args.platform, gpus, args.preset)
        plan = make_plan(*wanted, devices.cpu_has_bf16(), devices.cores_allowed())
        unset = {} if args.python else not_set_up(args.frameworks, Path(args.venv))
        plan = without(plan, unset)
        chosen = select(plan, args.steps)
    except PlanError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    results = str(Path(args.results).resolve())
    show_plan(plan, results, args.out, echo, args.python)
    if args.steps:
        echo(f"  --steps {' '.join(args.steps)}: {len(chosen.steps)} of {len(plan.steps)} step(s)")
    if args.dry_run:
        return 0
    plan = chosen
    from compare import report

    try:  # before hours of runs, not after them
        check_writable(results)
        report.check_out(Path(args.out))
    except ResultsError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"error: cannot write the report: {e}", file=sys.stderr)
        return 2
    if plan.platform == "cpu":
        echo(
            "note: no accelerator in use: virtual CPU devices; the 2-device runs give each "
            "device its own cores (--cores-per-device) beside a 1-device run on as many"
        )
    start = time.perf_counter()
    # A SIGTERM (a shell's `timeout` around this command) or a SIGHUP (its terminal closed)
    # ends it as a Ctrl-C does: the run under way is stopped with its workers
    # (compare/stream.py), not left running on its own; and this command killed outright
    # (SIGKILL) takes the run under way along (signals.launching).
    try:
        with signals.as_interrupt(), signals.launching():
            outcomes = execute(
                plan, results, Path(args.venv), echo, runner, args.timeout, args.python
            )
    except KeyboardInterrupt as e:
        print("\ninterrupted", file=sys.stderr)
        return signals.exit_code(e)
    summary(outcomes, plan, echo)
    echo(f"total {time.perf_counter() - start:.1f} s; writing the report")
    notes = [f"{fw} was not set up on this machine: {why}" for fw, why in unset.items()]
    notes += skip_notes(plan, unset)
    code = report.build(
        [results], args.out, args.html, plan.preset, plan.platform, echo=echo, notes=notes
    )
    return 0 if code == 0 and all(o.ok for o in outcomes) else 1


def skip_notes(plan: Plan, unset: dict[str, str]) -> list[str]:
    """One line per reason the plan left runs out, for the report: what, and why (a framework
    not set up has its own line)."""
    by_reason: dict[str, list[str]] = {}
    for step, why in plan.skipped:
        if step.framework not in unset:
            by_reason.setdefault(why, []).append(step.describe())
    return [f"Not run on this machine ({why}): {'; '.join(s)}" for why, s in by_reason.items()]


if __name__ == "__main__":
    # a stop outside the runs (the report's writing) is one line too
    sys.exit(signals.main(lambda: processes.quiet_when_reader_stops(main)))
