"""The three frameworks' workload files read side by side (docs/design.md, "Side by side").

Parsed with `ast`, so no framework is imported: for each workload, torch_impl/, jax_impl/ and
mxnet_impl/ define the same public top-level functions and classes in the same order; what a
framework needs beyond them is listed below, with the reason. Private (`_`) names are ignored.
The parallelism of each strategy sits in one named function, right before `train`; the pipeline
schedule lives in PipelineParallelResNet50 everywhere. Functions stay short and files readable.
"""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FRAMEWORKS = ("torch", "jax", "mxnet")
WORKLOADS = ("lenet", "resnet18", "resnet50")
# Files kept side by side besides the workloads: the ceiling benchmark (common/ceiling.py).
PARALLEL = (*WORKLOADS, "ceiling")
MAX_FUNCTION_LINES = 60
MAX_FILE_LINES = 400

# Framework-forced extras, per workload and framework.
EXTRAS = {
    "resnet18": {
        # the DDP worker entry that torchrun starts, one per device; a Sequential with a forward
        # of its own, which torch 2.11's Module.compile traces as one graph (a plain one: 8)
        "torch": {"ddp_worker", "ResNet18"},
        # flax needs a Module class where torch and Gluon compose a Sequential; BatchNorm's
        # settings in one place; jax.distributed joins the processes before any backend starts
        "jax": {"batch_norm", "ResNet18", "distributed_init"},
        # MXNet's bf16 is AMP, switched on for the whole process before the network is built
        # (torch's is an autocast context in train_step, JAX's the model's dtype)
        "mxnet": {"use_bf16"},
    },
    "resnet50": {
        # torch's own pipelining engine (gpipe, 1f1b): one process per stage
        "torch": {"check_pipelining", "launch_pipelining", "pipelining_worker"},
        # JAX differentiates each stage explicitly: jitted forward (keeping the VJP), backward,
        # last-stage step and the SGD update are functions of their own
        "jax": {"stage_forward", "stage_backward", "last_stage_step", "forward", "sgd"},
        # Gluon's BatchNorm takes its running statistics through a flag set on every layer
        "mxnet": {"use_running_stats"},
    },
}
# The parallelism of each strategy: one function each, right before `train`.
STRATEGY_FUNCTIONS = {
    "resnet18": {
        "torch": ["data_parallel", "ddp"],
        "jax": ["pmap", "sharding"],
        "mxnet": ["gluon", "dist"],
    }
}
# The files' length is watched; the fuller checks above hold for every workload file.
CHECKED = [ROOT / d for d in ("common", "compare", *(f"{f}_impl" for f in FRAMEWORKS))]


def public_names(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    kinds = (ast.FunctionDef, ast.ClassDef)
    return [n.name for n in tree.body if isinstance(n, kinds) and not n.name.startswith("_")]


@pytest.mark.parametrize("workload", PARALLEL)
def test_the_three_files_define_the_same_names_in_the_same_order(workload):
    names = {f: public_names(ROOT / f"{f}_impl" / f"{workload}.py") for f in FRAMEWORKS}
    extras = EXTRAS.get(workload, {})
    strategies = STRATEGY_FUNCTIONS.get(workload, {})
    shared = {
        f: [n for n in names[f] if n not in extras.get(f, set()) | set(strategies.get(f, []))]
        for f in FRAMEWORKS
    }
    assert shared["jax"] == shared["torch"], f"{workload}: jax vs torch"
    assert shared["mxnet"] == shared["torch"], f"{workload}: mxnet vs torch"
    for f, funcs in strategies.items():
        at = names[f].index("train")
        assert names[f][at - len(funcs) : at] == funcs, f"{f} {workload}: {names[f]}"


def signatures(path: Path) -> dict[str, list[str]]:
    tree = ast.parse(path.read_text())
    funcs = [n for n in tree.body if isinstance(n, ast.FunctionDef)]
    return {f.name: [a.arg for a in f.args.args] for f in funcs}


def test_the_ceiling_files_take_the_same_arguments():
    """Only the step differs between the frameworks' ceilings: the same functions, arguments."""
    found = {f: signatures(ROOT / f"{f}_impl" / "ceiling.py") for f in FRAMEWORKS}
    assert found["jax"] == found["torch"] and found["mxnet"] == found["torch"]


def test_the_pipeline_schedule_lives_in_the_same_class_everywhere():
    for f in FRAMEWORKS:
        tree = ast.parse((ROOT / f"{f}_impl" / "resnet50.py").read_text())
        (cls,) = [n for n in tree.body if getattr(n, "name", "") == "PipelineParallelResNet50"]
        methods = {n.name for n in cls.body if isinstance(n, ast.FunctionDef)}
        assert methods - {"__init__"}, f"{f}: PipelineParallelResNet50 only configures"


def python_files():
    return sorted(p for d in CHECKED for p in d.glob("*.py"))


def test_no_function_is_longer_than_60_lines():
    long = []
    for path in python_files():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({lines})")
    assert not long, long


def test_no_file_is_longer_than_400_lines():
    long = [
        f"{p.relative_to(ROOT)} ({n})"
        for p in python_files()
        if (n := len(p.read_text().splitlines())) > MAX_FILE_LINES
    ]
    assert not long, long
