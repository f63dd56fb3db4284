"""compare.run: the plan for CPU and GPU machines (pure), a failing run that does not stop the
others, --dry-run; fake runners and fake framework environments, no framework needed."""

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from common import processes
from compare import run, stream
from compare.run import Step
from tests.fixtures import interrupt

ROOT = Path(__file__).resolve().parents[2]
WORKLOADS = ["lenet", "resnet18", "resnet50"]


def described(steps):
    return [(s.framework, s.workload, s.gpus, s.strategy, s.flags) for s in steps]


BF16, COMPILED = ("--amp", "bf16"), ("--compile",)


LENET_PINNED, R18_PINNED = ("--epochs", "3"), ("--steps-per-epoch", "5")


def test_plan_on_a_cpu_machine():
    plan = run.make_plan(run.ALL, WORKLOADS, "auto", accelerators=0, cpu_bf16=True, cpu_cores=2)
    assert (plan.platform, plan.preset) == ("cpu", "cpu")
    steps = described(plan.steps)
    assert len(steps) == 40
    assert steps[:4] == [
        ("torch", "lenet", 1, None, ()),  # the comparison, on every core (--ceiling)
        ("torch", "lenet", 1, None, LENET_PINNED),  # the scaling pair, a core per device
        ("torch", "lenet", 2, None, LENET_PINNED),
        ("torch", "lenet", 1, None, COMPILED),  # torch's compiled tier, beside its eager one
    ]
    assert [s for s in steps if s[1] == "resnet18"] == [
        ("torch", "resnet18", 1, "ddp", ()),
        ("torch", "resnet18", 1, "ddp", R18_PINNED),
        ("torch", "resnet18", 2, "ddp", R18_PINNED),
        ("torch", "resnet18", 1, "ddp", BF16),  # the faster paths, on one device
        ("torch", "resnet18", 1, "ddp", COMPILED),
        ("torch", "resnet18", 1, "ddp", COMPILED + BF16),
        ("jax", "resnet18", 1, "sharding", ()),
        ("jax", "resnet18", 1, "sharding", R18_PINNED),
        ("jax", "resnet18", 2, "sharding", R18_PINNED),
        ("jax", "resnet18", 1, "sharding", BF16),
        ("jax", "resnet18", 1, "shard_map", ()),
        ("jax", "resnet18", 1, "shard_map", R18_PINNED),
        ("jax", "resnet18", 2, "shard_map", R18_PINNED),
        ("jax", "resnet18", 1, "pmap", ()),
        ("jax", "resnet18", 1, "pmap", R18_PINNED),
        ("jax", "resnet18", 2, "pmap", R18_PINNED),
        ("mxnet", "resnet18", 1, "gluon", ()),
        ("mxnet", "resnet18", 1, "gluon", R18_PINNED),
        ("mxnet", "resnet18", 2, "gluon", R18_PINNED),
        ("mxnet", "resnet18", 1, "dist", R18_PINNED),
        ("mxnet", "resnet18", 2, "dist", R18_PINNED),
        ("mxnet", "resnet18", 1, "gluon", BF16),
    ]
    assert [s for s in steps if s[0] == "torch" and s[1] == "resnet50"] == [
        ("torch", "resnet50", 2, None, ()),
        ("torch", "resnet50", 2, None, ("--sweep",)),
        ("torch", "resnet50", 2, "gpipe", ()),
        ("torch", "resnet50", 2, "1f1b", ()),
    ]
    assert [s for s in steps if s[0] == "mxnet" and s[1] == "resnet50"] == [
        ("mxnet", "resnet50", 2, None, ()),
        ("mxnet", "resnet50", 2, None, ("--sweep",)),
    ]
    skipped = [(s.strategy, s.gpus, s.flags, why) for s, why in plan.skipped]
    assert [x[:3] for x in skipped] == [
        ("dataparallel", 1, ()),
        ("dataparallel", 2, ()),
        ("dataparallel", 1, COMPILED),
    ]
    assert all("needs CUDA" in why for *_, why in skipped)


def test_a_cpu_plans_scaling_pairs_on_cores_of_their_own():
    """Every 2-device run of a CPU and its 1-device baseline give each device half the cores
    (--cores-per-device), so that their speedup compares like with like; the comparison runs
    keep every core and time their ceiling."""
    plan = run.make_plan(run.ALL, WORKLOADS, "cpu", accelerators=0, cpu_cores=8)
    pinned = [s for s in plan.steps if s.cores]
    assert {s.cores for s in pinned} == {4}
    assert all(s.gpus == 2 or s.workload != "resnet50" for s in plan.steps)
    assert all(s.cores for s in plan.steps if s.gpus == 2)
    for s in pinned:
        argv = s.args("cpu", "cpu", "/r.jsonl")
        assert argv[argv.index("--cores-per-device") + 1] == "4" and "--ceiling" not in argv
    pairs = {(s.framework, s.workload, s.strategy, s.gpus) for s in pinned}
    assert all((fw, w, st, 1) in pairs for fw, w, st, n in pairs if n == 2 and w != "resnet50")


def test_a_one_core_cpu_cannot_give_two_devices_a_core_each():
    plan = run.make_plan(["torch"], ["lenet"], "cpu", accelerators=0, cpu_cores=1)
    assert described(plan.steps) == [
        ("torch", "lenet", 1, None, ()),
        ("torch", "lenet", 1, None, COMPILED),
    ]
    assert [why for _, why in plan.skipped] == ["needs 2 cores: one per device"] * 2


def test_bf16_runs_need_bf16_arithmetic():
    plan = run.make_plan(run.ALL, ["resnet18"], "cpu", accelerators=0, cpu_bf16=False)
    assert not [s for s in plan.steps if "bf16" in s.flags] and len(plan.steps) == 22 - 4
    bf16 = [(s.framework, s.strategy, s.flags, why) for s, why in plan.skipped if "bf16" in s.flags]
    assert [x[:3] for x in bf16] == [
        ("torch", "ddp", BF16),
        ("torch", "ddp", COMPILED + BF16),
        ("jax", "sharding", BF16),
        ("mxnet", "gluon", BF16),
    ]
    assert all(why.startswith("needs bf16 arithmetic: ") for *_, why in bf16[:3])
    assert all(why.startswith("needs a CPU with bf16 arithmetic: ") for *_, why in bf16[3:])
    assert all("measured" in why for *_, why in bf16)  # the reason, with its numbers


def test_plan_on_a_two_gpu_machine():
    plan = run.make_plan(run.ALL, WORKLOADS, "auto", accelerators=2, cpu_bf16=True)
    assert (plan.platform, plan.preset) == ("gpu", "full")
    assert len(plan.steps) == 33
    assert not [s for s in plan.steps if s.cores]  # a GPU is a device of its own
    assert ("torch", "resnet18", 2, "dataparallel", ()) in described(plan.steps)
    assert ("torch", "resnet18", 1, "dataparallel", COMPILED) in described(plan.steps)
    # MXNet's bf16 is for CPUs: its run is the only one left out
    assert [(s.framework, s.flags) for s, _ in plan.skipped] == [("mxnet", BF16)]


def test_plan_on_a_one_gpu_machine_skips_two_device_runs_with_a_reason():
    plan = run.make_plan(run.ALL, WORKLOADS, "auto", accelerators=1)
    assert all(s.gpus == 1 for s in plan.steps)
    # lenet x3 + torch compiled; resnet18: torch ddp x4 + dataparallel x2, jax x4, mxnet x1;
    # resnet50 (single, and the sweep with both stages on the GPU) x3 x2
    assert len(plan.steps) == 4 + 6 + 4 + 1 + 6
    assert ("mxnet", "resnet50", 1, None, ()) in described(plan.steps)
    assert ("torch", "resnet50", 1, None, ("--sweep",)) in described(plan.steps)
    two = [why for s, why in plan.skipped if s.gpus == 2]
    assert len(two) == 26 - 8
    assert all(why == "needs 2 GPUs; this machine has 1" for why in two)


def test_plan_forced_cpu_and_preset():
    plan = run.make_plan(["jax"], ["lenet"], "cpu", accelerators=4, preset="smoke")
    assert (plan.platform, plan.preset) == ("cpu", "smoke")
    assert described(plan.steps) == [
        ("jax", "lenet", 1, None, ()),
        ("jax", "lenet", 1, None, LENET_PINNED),
        ("jax", "lenet", 2, None, LENET_PINNED),
    ]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(platform="gpu", accelerators=0), "no CUDA GPU"),
        (dict(frameworks=["tensorflow"]), "unknown framework"),
        (dict(workloads=["bert"]), "unknown workload"),
        (dict(preset="huge"), "unknown preset"),
    ],
)
def test_plan_errors(kwargs, message):
    args = dict(frameworks=run.ALL, workloads=WORKLOADS, platform="auto", accelerators=0)
    args.update(kwargs)
    with pytest.raises(run.PlanError, match=message):
        run.make_plan(**args)


def test_step_command_line():
    step = Step("torch", "resnet50", 2, "gpipe", ())
    assert step.args("cpu", "smoke", "/r.jsonl") == [
        "-m",
        "torch_impl",
        "--workload",
        "resnet50",
        "--gpus",
        "2",
        "--platform",
        "cpu",
        "--preset",
        "smoke",
        "--strategy",
        "gpipe",
        "--results",
        "/r.jsonl",
        "--no-progress",
    ]
    # one device (lenet, resnet18): the framework's ceiling timed in the same run
    one = Step("jax", "lenet", 1, None, ()).args("cpu", "cpu", "/r.jsonl")
    assert one == [
        "-m",
        "jax_impl",
        "--workload",
        "lenet",
        "--gpus",
        "1",
        "--platform",
        "cpu",
        "--preset",
        "cpu",
        "--ceiling",
        "--results",
        "/r.jsonl",
        "--no-progress",
    ]
    assert "--ceiling" not in Step("jax", "lenet", 2, None, ()).args("cpu", "cpu", "/r.jsonl")
    assert "--ceiling" not in Step("jax", "resnet50", 1, None, ()).args("gpu", "full", "r")
    sweep = Step("mxnet", "resnet50", 2, None, ("--sweep",)).args("gpu", "full", "r")
    assert "--strategy" not in sweep and sweep[-4:] == [
        "--sweep",
        "--results",
        "r",
        "--no-progress",
    ]


def fake_venv(tmp_path: Path, frameworks=run.ALL) -> Path:
    """`<venv>/<fw>/bin/python`: runs fake_impl.py instead of the framework."""
    venv = tmp_path / "venv"
    for fw in frameworks:
        python = venv / fw / "bin" / "python"
        python.parent.mkdir(parents=True)
        script = f'exec "{sys.executable}" "{tmp_path}/fake_impl.py" "$@"'
        python.write_text(f'#!/bin/sh\nPYTHONPATH="{ROOT}" {script}\n')
        python.chmod(0o755)
    (tmp_path / "fake_impl.py").write_text(FAKE_IMPL)
    return venv


# Stands in for `python -m <fw>_impl`: resnet18 fails, lenet appends a smoke-preset record; with
# --ceiling, one whose ceiling in the run took 3.2 s/epoch, so 4 s of training is 1.25x it.
FAKE_IMPL = """
import argparse, sys
from common import results
framework = sys.argv[2].partition("_impl")[0]
p = argparse.ArgumentParser()
for name in ("--workload", "--platform", "--preset", "--strategy", "--results"):
    p.add_argument(name)
p.add_argument("--gpus", default="1")
p.add_argument("--no-progress", action="store_true")
p.add_argument("--ceiling", action="store_true")
p.add_argument("--compile", action="store_true")
p.add_argument("--cores-per-device", type=int)
args = p.parse_known_args(sys.argv[3:])[0]  # --amp, --sweep: not needed here
print(f"fake {framework} {args.workload} on {args.gpus}", flush=True)
if args.workload == "resnet18":
    print("Traceback: something broke", file=sys.stderr)
    print(f"boom in {framework} resnet18", file=sys.stderr)
    sys.exit(1)
n, t = int(args.gpus), 4.0 / int(args.gpus)
stats = lambda t: {"median": t, "mean": t, "std": 0.0, "min": t, "max": t, "n": 1}
ceiling = {"sec_per_epoch": stats(3.2), "s_per_step": 0.8, "x_ceiling": 1.25, "repeats": 1}
results.append(results.Record(
    framework=framework, workload=args.workload, strategy="scratch",
    devices=n, platform=args.platform, virtual=True, device_names=["cpu"] * n,
    preset=args.preset, batch_size=256, lr=0.2, epochs=1, test_acc=0.8,
    sec_per_epoch=stats(t),
    extra={"compiled": args.compile, **({"ceiling": ceiling} if args.ceiling else {}),
           "cores_per_device": args.cores_per_device,
           "execution": "single" if n == 1 else "sequential" if framework == "torch"
           else "concurrent"},
), args.results)
"""


@pytest.fixture(autouse=True)
def bf16_cpu(monkeypatch):
    """The plan of run.main on a 2-core CPU with bf16 arithmetic (every bf16 run, a core per
    device in the scaling runs), on every machine."""
    monkeypatch.setattr(run.devices, "cpu_has_bf16", lambda: True)
    monkeypatch.setattr(run.devices, "cores_allowed", lambda: 2)


def test_a_failing_run_does_not_stop_the_others(tmp_path):
    venv = fake_venv(tmp_path)
    calls, lines = [], []

    def runner(cmd, echo, timeout):
        calls.append(cmd)
        if "resnet18" in cmd:
            return 1, ["Traceback (most recent call last):", "ValueError: broken"], ""
        return 0, [], ""

    code = run.main(
        [
            "--platform",
            "cpu",
            "--results",
            str(tmp_path / "r.jsonl"),
            "--out",
            str(tmp_path),
            "--venv",
            str(venv),
        ],
        runner=runner,
        echo=lines.append,
    )
    assert code == 1
    assert len(calls) == 52  # every step ran: 40, and zero's 12
    text = "\n".join(lines)
    assert "30 of 52 run(s) ok, 22 failed, 0 not run, 3 skipped on this machine" in text
    assert "FAILED (exit 1)" in text and "ValueError: broken" in text
    assert "[52/52] ok in" in text


def test_end_to_end_with_fake_environments(tmp_path, capsys):
    venv = fake_venv(tmp_path, frameworks=("torch", "jax"))
    results, out, lines = tmp_path / "r.jsonl", tmp_path / "reports", []
    code = run.main(
        [
            "--frameworks",
            "torch",
            "jax",
            "mxnet",
            "--workloads",
            "lenet",
            "resnet18",
            "--platform",
            "cpu",
            "--preset",
            "smoke",
            "--results",
            str(results),
            "--out",
            str(out),
            "--venv",
            str(venv),
        ],
        echo=lines.append,
    )
    assert code == 1
    text = "\n".join(lines)
    assert "    | fake jax lenet on 2" in text  # the child's output, streamed
    assert "boom in torch resnet18" in text.split("== summary")[1]  # stderr tail in the summary
    assert re.search(r"NOT RUN  mxnet lenet .*: no environment .*make setup FRAMEWORK=mxnet", text)
    assert "7 of 32 run(s) ok, 16 failed, 9 not run, 3 skipped on this machine" in text
    md = (out / "report.md").read_text()
    assert (
        "| torch | scratch | shared | cpu (virtual) | smoke | 0.800 | 4.00 ± 0.00 s (n=1) |" in md
    )
    # the scaling pairs had a core per device: JAX's devices ran at once, torch's in turn
    assert "| jax | scratch | 1 | cpu (virtual) |" in md and "| 2.00x | 100% |" in md
    assert "| torch | scratch | 1 | cpu (virtual) |" in md and "| sequential | sequential |" in md
    # the ceilings ran in the training runs: training 4.00 s, 1.25x its ceiling's 3.20 s
    assert "| torch | scratch | 4.00 ± 0.00 s (n=1) | 3.20 ± 0.00 s* (n=1) |" in md
    assert "| torch | scratch+compiled | 4.00 ± 0.00 s (n=1) | 3.20 ± 0.00 s* (n=1) |" in md
    assert md.count("| 1.25x |") == 3  # torch eager and compiled, jax
    assert "No resnet18 records in this group." in md


def test_one_interpreter_for_every_framework(tmp_path):
    """--python: a machine whose one Python has the frameworks (a GPU image), no venvs."""
    python = fake_venv(tmp_path, frameworks=("torch",)) / "torch" / "bin" / "python"
    lines = []
    code = run.main(
        [
            "--frameworks",
            "torch",
            "jax",
            "--workloads",
            "lenet",
            "--platform",
            "cpu",
            "--preset",
            "smoke",
            "--results",
            str(tmp_path / "r.jsonl"),
            "--out",
            str(tmp_path),
            "--venv",
            str(tmp_path / "none"),
            "--python",
            str(python),
        ],
        echo=lines.append,
    )
    assert code == 0
    text = "\n".join(lines)
    assert f"   1. {python} -m torch_impl --workload lenet" in text
    assert "    | fake jax lenet on 2" in text
    assert "7 of 7 run(s) ok, 0 failed, 0 not run, 0 skipped on this machine" in text
    code = run.main(
        [
            "--frameworks",
            "jax",
            "--workloads",
            "lenet",
            "--platform",
            "cpu",
            "--preset",
            "smoke",
            "--results",
            str(tmp_path / "r.jsonl"),
            "--out",
            str(tmp_path),
            "--python",
            "nopython3",
        ],
        echo=lines.append,
    )
    assert code == 1 and "SKIPPED, no interpreter nopython3" in "\n".join(lines)


def test_a_framework_setup_skipped_is_skipped_and_the_report_says_so(tmp_path):
    """MXNet without Python 3.10/3.11: `make setup` writes <venv>/mxnet.skipped and no env."""
    venv = fake_venv(tmp_path, frameworks=("torch", "jax"))
    (venv / "mxnet.skipped").write_text("needs Python 3.10 or 3.11, found none on PATH\n")
    out, lines = tmp_path / "reports", []
    code = run.main(
        [
            "--workloads",
            "lenet",
            "--platform",
            "cpu",
            "--preset",
            "smoke",
            "--results",
            str(tmp_path / "r.jsonl"),
            "--out",
            str(out),
            "--venv",
            str(venv),
        ],
        echo=lines.append,
    )
    assert code == 0  # every run planned for the frameworks set up ran
    text = "\n".join(lines)
    assert "skip: mxnet lenet on 1 device(s), default strategies: not set up: needs" in text
    assert "7 of 7 run(s) ok, 0 failed, 0 not run, 3 skipped on this machine" in text
    assert "mxnet was not set up on this machine: needs Python 3.10 or 3.11" in text
    md = (out / "report.md").read_text()
    assert "- mxnet was not set up on this machine: needs Python 3.10 or 3.11" in md
    assert "mxnet lenet" not in md  # said once, by the line above


def test_the_report_says_what_the_plan_left_out_and_why(tmp_path, monkeypatch):
    monkeypatch.setattr(run.devices, "cpu_has_bf16", lambda: False)
    venv, out = fake_venv(tmp_path), tmp_path / "reports"
    code = run.main(
        [
            "--frameworks",
            "torch",
            "jax",
            "--workloads",
            "lenet",
            "resnet18",
            "--platform",
            "cpu",
            "--preset",
            "smoke",
            "--results",
            str(tmp_path / "r.jsonl"),
            "--out",
            str(out),
            "--venv",
            str(venv),
        ],
        echo=[].append,
    )
    assert code == 1  # the fake resnet18 runs fail; the lenet ones make a report
    md = (out / "report.md").read_text()
    bf16 = [line for line in md.splitlines() if "needs bf16 arithmetic" in line]
    assert len(bf16) == 1 and "did not pay in ResNet-18 steps measured" in bf16[0]
    assert bf16[0].startswith("- Not run on this machine (needs bf16 arithmetic: a GPU or a CPU")
    assert bf16[0].count("--amp bf16") == 3  # torch x2, jax x1
    assert "- Not run on this machine (needs CUDA: nn.DataParallel" in md


def test_dry_run_prints_the_plan_and_runs_nothing(tmp_path):
    lines = []

    def runner(*_):
        raise AssertionError("dry run must not run anything")

    code = run.main(
        [
            "--dry-run",
            "--platform",
            "cpu",
            "--frameworks",
            "torch",
            "--workloads",
            "resnet18",
            "--results",
            str(tmp_path / "r.jsonl"),
        ],
        runner=runner,
        echo=lines.append,
    )
    assert code == 0
    text = "\n".join(lines)
    assert "plan: platform cpu" in text and "preset cpu" in text
    assert "1. .venv/torch/bin/python -m torch_impl --workload resnet18 --gpus 1" in text
    assert "skip: torch resnet18 on 2 device(s), dataparallel: needs CUDA" in text
    assert not (tmp_path / "r.jsonl").exists()


def test_steps_run_part_of_the_plan_numbered_as_the_dry_run_prints_it(tmp_path):
    """--steps: a long plan in parts (a GPU session's 10-minute calls), or one step again."""
    calls, lines = [], []
    code = run.main(
        [
            "--platform",
            "cpu",
            "--frameworks",
            "torch",
            "--workloads",
            "lenet",
            "resnet18",
            "--steps",
            "2",
            "4-5",
            "--results",
            str(tmp_path / "r.jsonl"),
            "--out",
            str(tmp_path),
            "--venv",
            str(fake_venv(tmp_path)),
        ],
        runner=lambda cmd, echo, timeout: calls.append(cmd) or (0, [], ""),
        echo=lines.append,
    )
    assert code == 1  # every step ran, but this runner writes no records to report on
    plan = run.make_plan(["torch"], ["lenet", "resnet18"], "cpu", 0, cpu_bf16=True).steps
    want = [plan[1], plan[3], plan[4]]  # steps 2, 4 and 5, in the plan's order
    assert [c[1:] for c in calls] == [s.args("cpu", "cpu", str(tmp_path / "r.jsonl")) for s in want]
    assert f"--steps 2 4-5: 3 of {len(plan)} step(s)" in "\n".join(lines)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--steps", "0"], "error: --steps 0: the plan has steps 1 to 4 (see --dry-run)"),
        (["--steps", "4-5"], "error: --steps 4-5: the plan has steps 1 to 4 (see --dry-run)"),
        (["--steps", "2-1"], "error: --steps 2-1: the plan has steps 1 to 4 (see --dry-run)"),
        (["--steps", "one"], "error: --steps 'one': give step numbers or ranges, such as 1-4 7"),
        (["--assume-gpus", "1"], "error: --assume-gpus N (N >= 0) only plans: add --dry-run"),
        (["--timeout", "-1"], "error: --timeout must be a number of seconds > 0, got -1.0"),
        (["--timeout", "nan"], "error: --timeout must be a number of seconds > 0, got nan"),
    ],
)
def test_bad_steps_are_one_line_before_any_run(tmp_path, capsys, argv, message):
    def runner(*_):
        raise AssertionError("nothing may run")

    code = run.main(
        [
            "--platform",
            "cpu",
            "--frameworks",
            "torch",
            "--workloads",
            "lenet",
            *argv,
            "--results",
            str(tmp_path / "r.jsonl"),
            "--out",
            str(tmp_path / "o"),
        ],
        runner=runner,
        echo=[].append,
    )
    assert code == 2
    assert capsys.readouterr().err.splitlines() == [message]
    assert not (tmp_path / "r.jsonl").exists() and not (tmp_path / "o").exists()


def test_assume_gpus_plans_a_gpu_machine_from_this_one(tmp_path, monkeypatch):
    monkeypatch.setattr(run.devices, "count_accelerators", lambda: 0)
    lines = []
    code = run.main(
        [
            "--dry-run",
            "--assume-gpus",
            "1",
            "--frameworks",
            "torch",
            "--workloads",
            "resnet18",
            "--python",
            "python3",
            "--results",
            str(tmp_path / "r.jsonl"),
            "--steps",
            "3-4",
        ],
        runner=None,
        echo=lines.append,
    )
    assert code == 0
    text = "\n".join(lines)
    assert "plan: platform gpu (1 GPU(s)), preset full" in text
    assert "   3. python3 -m torch_impl --workload resnet18 --gpus 1 --platform gpu" in text
    assert "skip: torch resnet18 on 2 device(s), ddp: needs 2 GPUs; this machine has 1" in text
    assert "--steps 3-4: 2 of 6 step(s)" in text


def test_bad_request_is_one_line(capsys):
    code = run.main(["--dry-run", "--frameworks", "tensorflow"])
    assert code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: unknown framework") and len(err.splitlines()) == 1


@pytest.mark.parametrize(
    "results, out, message",
    [
        ("r.jsonl", "f", "error: cannot write the report: {tmp}/f is not a folder; choose another"),
        ("f/r.jsonl", "out", "error: results file {tmp}/f/r.jsonl cannot be created"),
    ],
)
def test_unwritable_outputs_are_refused_before_any_run(tmp_path, capsys, results, out, message):
    (tmp_path / "f").write_text("a file")

    def runner(*_):
        raise AssertionError("nothing may run before the outputs are checked")

    argv = ["--platform", "cpu", "--frameworks", "torch", "--workloads", "lenet"]
    argv += ["--results", str(tmp_path / results), "--out", str(tmp_path / out)]
    assert run.main(argv, runner=runner, echo=lambda *_: None) == 2
    err = capsys.readouterr().err
    assert err.startswith(message.replace("{tmp}", str(tmp_path))) and err.count("\n") == 1


def test_stream_keeps_the_stderr_tail_and_times_out(monkeypatch):
    monkeypatch.setattr(processes, "STOP_WAIT_S", 1)  # where the suite runs with SIGINT ignored
    lines = []
    code, tail, note = stream.stream(
        [
            sys.executable,
            "-c",
            "import sys\nfor i in range(30): print(i, file=sys.stderr)\nprint('out')",
        ],
        lines.append,
    )
    assert code == 0 and note == ""
    assert tail == [str(i) for i in range(30 - stream.TAIL_LINES, 30)]
    assert "    | out" in lines
    code, _, note = stream.stream([sys.executable, "-c", "import time; time.sleep(30)"], print, 0.5)
    assert code != 0 and note == "timed out after 0.5 s"


assert os.sep == "/"  # the fake environments are POSIX shell scripts


STOPPABLE = """
import signal, sys, time
signal.signal(signal.SIGINT, signal.default_int_handler)  # as at a terminal, whatever the suite's
try:
    time.sleep(60)
except KeyboardInterrupt:
    print("stopped: no record written", file=sys.stderr)
    sys.exit(130)
"""
# A launcher that ignores Ctrl-C and whose worker has a session of its own, as torchrun's have.
STUBBORN = """
import signal, subprocess, sys, time
signal.signal(signal.SIGINT, signal.SIG_IGN)
worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                          start_new_session=True)
print(worker.pid, flush=True)
time.sleep(60)
"""


def test_a_run_past_its_time_is_stopped_as_a_ctrl_c_stops_it():
    code, tail, note = stream.stream([sys.executable, "-c", STOPPABLE], print, 1)
    assert (code, tail, note) == (130, ["stopped: no record written"], "timed out after 1 s")


def test_a_run_past_its_time_leaves_no_process_of_its_own(monkeypatch):
    """Where the run does not stop, it and what it started are killed: proc.kill() alone left
    a worker of its own session running (torchrun's and MXNet's launcher's workers)."""
    monkeypatch.setattr(processes, "STOP_WAIT_S", 1)
    lines = []
    code, _, note = stream.stream([sys.executable, "-c", STUBBORN], lines.append, 1)
    assert code == -9 and note == "timed out after 1 s"
    (worker,) = [int(line.split("|")[1]) for line in lines]
    _assert_ended([worker])


LAUNCHER = """#!{python}
import os, signal, subprocess, sys, time
worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                          start_new_session=True)  # as torchrun's workers
print("pids", os.getpid(), worker.pid, flush=True)
signal.signal(signal.SIGINT, signal.default_int_handler)
try:
    time.sleep(60)
except KeyboardInterrupt:  # a launcher stops its workers on a Ctrl-C
    worker.kill()
    sys.exit(130)
"""


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_a_stop_signal_stops_the_run_under_way_and_its_workers(tmp_path, signum):
    """`timeout 500 python -m compare.run ...` (CONTRIBUTING's GPU calls) ends compare.run with
    a SIGTERM, a closed terminal with a SIGHUP: either stops its run as a Ctrl-C does, exit
    128 + the signal's number, the run (in a session of its own) and its workers with it."""
    python = tmp_path / "python"
    python.write_text(LAUNCHER.replace("{python}", sys.executable))
    python.chmod(0o755)
    argv = ["--frameworks", "torch", "--workloads", "lenet", "--platform", "cpu", "--preset"]
    argv += ["smoke", "--results", str(tmp_path / "r.jsonl"), "--out", str(tmp_path / "out")]
    pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True}
    cmd = [sys.executable, "-m", "compare.run", *argv, "--python", str(python)]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, preexec_fn=interrupt.terminal_signals, **pipes)
    pids = next([int(p) for p in line.split()[-2:]] for line in proc.stdout if "| pids" in line)
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=90)
    assert proc.returncode == 128 + signum and err.strip() == "interrupted", err
    _assert_ended(pids)


def _assert_ended(pids):
    """Each of `pids` has ended: gone, or a zombie where its new parent does not reap."""
    time.sleep(0.5)  # for the reaper, where there is one
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            continue
        assert state == "Z", f"process {pid} still runs (state {state})"
