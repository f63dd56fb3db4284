"""The three frameworks' workload files read side by side (docs/design.md, "Side by side").

Parsed with `ast` and `tokenize`, so no framework is imported. For each workload, torch_impl/,
jax_impl/ and mxnet_impl/ define the same public top-level functions and classes in the same
order; what a framework needs beyond them is listed below, with the reason. Private (`_`) names
are ignored. Each strategy's parallelism is one function of one contract (common/training.py,
"A strategy"), right before `train`, and takes the world that its framework's `launch.join`
makes; `train` is short, takes the same few parameters, never asks which strategy runs, and
calls the harness (common.harness) in the same order everywhere. The files stay readable at
their formatted length, and their comments say why, in the present.
"""

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FRAMEWORKS = ("torch", "jax", "mxnet")
WORKLOADS = ("lenet", "resnet18", "resnet50", "zero")
# Files kept side by side besides the workloads: the ceiling benchmark (common/ceiling.py).
PARALLEL = (*WORKLOADS, "ceiling")
MAX_FUNCTION_LINES = 60
MAX_FILE_LINES = 400
MAX_WORKLOAD_LINES = 300  # a workload file, as `ruff format` writes it (make lint checks that)
# JAX's resnet18 holds a third strategy, shard_map, beside sharding and pmap, its step as two
# functions (gradients, apply_gradients) that per-device code calls either side of a pmean,
# sharding's per-device BatchNorm (a vmap over the devices' shares), and the bucket that packs
# the explicit strategies' gradients into one buffer before their collective
LONGER = {("jax", "resnet18"): 50}
MAX_TRAIN_LINES, MAX_TRAIN_PARAMETERS = 30, 5

# Framework-forced extras, per workload and framework.
EXTRAS = {
    "resnet18": {
        # a Sequential with a forward of its own: torch.compile traces it as one graph, and
        # bf16 autocast wraps it (JAX's bf16 is the model's dtype)
        "torch": {"ResNet18"},
        # flax needs a Module class where torch and Gluon compose a Sequential; BatchNorm's
        # settings in one place; JAX's step is pure, its gradients and its update functions
        # of their own, which shard_map's and pmap's steps call either side of their pmean
        "jax": {"batch_norm", "ResNet18", "gradients", "apply_gradients"},
        # MXNet's bf16 is AMP, switched on for the whole process before the network is built
        "mxnet": {"use_bf16"},
    },
    "resnet50": {
        # the stage of one rank of torch's own pipelining engine (torch_impl/pipelining.py)
        "torch": {"stage_of"},
        # JAX differentiates each stage explicitly: its jitted pieces are functions of their own
        "jax": {"stage_forward", "stage_backward", "last_stage_step", "forward", "sgd"},
        # Gluon's BatchNorm takes its running statistics through a flag set on every layer
        "mxnet": {"use_running_stats"},
    },
}
# The parallelism of each strategy: one function each, right before `train`.
STRATEGY_FUNCTIONS = {
    "resnet18": {
        "torch": ["data_parallel", "ddp"],
        "jax": ["pmap", "shard_map", "sharding"],
        "mxnet": ["context_list", "dist_sync"],
    },
    "zero": {
        "torch": ["ddp", "zero1", "zero2", "zero3"],
        "jax": ["sharding", "fsdp", "fsdp_explicit"],
        "mxnet": ["dist_sync", "server_update"],
    },
}
STRATEGY_ARGS = ["net", "optimizer", "world"]
STRATEGY_RETURNS = ["place", "shard", "step", "correct", "total"]
# The harness calls of `train`, in the order each `train` makes them (common/harness.py).
HARNESS = {"warm_up", "epochs", "test_batches", "log", "timed"}
# The files whose comments are held to the rules below.
PACKAGES = ("common", "compare", "cluster", "tools", *(f"{f}_impl" for f in FRAMEWORKS))
CHECKED = [ROOT / d for d in PACKAGES]


def path_of(framework: str, name: str) -> Path:
    return ROOT / f"{framework}_impl" / f"{name}.py"


def tree_of(path: Path) -> ast.Module:
    return ast.parse(path.read_text())


def top_level(path: Path) -> dict[str, ast.AST]:
    kinds = (ast.FunctionDef, ast.ClassDef)
    return {n.name: n for n in tree_of(path).body if isinstance(n, kinds)}


def public_names(path: Path) -> list[str]:
    return [name for name in top_level(path) if not name.startswith("_")]


@pytest.mark.parametrize("workload", PARALLEL)
def test_the_three_files_define_the_same_names_in_the_same_order(workload):
    names = {f: public_names(path_of(f, workload)) for f in FRAMEWORKS}
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


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_every_strategy_keeps_one_contract(framework):
    """Each strategy takes (net, optimizer, world), defines the five functions of the
    contract inside itself and returns them, in order: the same kind of thing everywhere.
    Lesson 4's strategies take the same arguments; what they share with lesson 2 (placing,
    sharding, counting) comes from a helper, so only their step is theirs."""
    for name in STRATEGY_FUNCTIONS["zero"][framework]:
        func = top_level(path_of(framework, "zero"))[name]
        assert [a.arg for a in func.args.args] == STRATEGY_ARGS, name
        assert isinstance(func.body[-1], ast.Return), name
    defs = top_level(path_of(framework, "resnet18"))
    for name in STRATEGY_FUNCTIONS["resnet18"][framework]:
        func = defs[name]
        assert [a.arg for a in func.args.args] == STRATEGY_ARGS, name
        inner = {n.name for n in func.body if isinstance(n, ast.FunctionDef)}
        assert set(STRATEGY_RETURNS) <= inner, f"{framework} {name} defines {sorted(inner)}"
        last = func.body[-1]
        assert isinstance(last, ast.Return) and isinstance(last.value, ast.Tuple), name
        assert [getattr(e, "id", None) for e in last.value.elts] == STRATEGY_RETURNS, name


MAX_JOIN_LINES, MAX_STRATEGY_LINES, MAX_LAUNCH_LINES = 20, 32, 160
# Each engine's own call that joins the processes: a reader finds it in `join` itself.
ENGINE_JOIN = {
    "torch": "dist.init_process_group",
    "jax": "jax.distributed.initialize",
    "mxnet": "mx.kv.create",
}
# Private framework APIs live in the operations layer (each <fw>_impl/guard.py), with reasons:
# anything reached by a name with one leading underscore (`torch._foreach_add_`,
# `block._kwargs`, "torch._inductor..." in sys.modules, `from torch._dynamo... import`), and
# MXNet's C library (`_LIB`). Every other file of a framework's folder is held to it.
PRIVATE_API = re.compile(r"\._(?!_)\w+|\b_LIB\b")
OUTSIDE_GUARD = sorted(
    f"{f}_impl/{p.name}"
    for f in FRAMEWORKS
    for p in (ROOT / f"{f}_impl").glob("*.py")
    if p.name != "guard.py"
)


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_the_lesson_layer_is_short_and_calls_its_engine_in_plain_sight(framework):
    """A `join` of at most MAX_JOIN_LINES that makes its engine's call itself; strategies of at
    most MAX_STRATEGY_LINES; a launch.py of at most MAX_LAUNCH_LINES (the operations around
    them live in guard.py and common/)."""
    launch = ROOT / f"{framework}_impl" / "launch.py"
    join = top_level(launch)["join"]
    assert join.end_lineno - join.lineno + 1 <= MAX_JOIN_LINES, f"{framework} join"
    assert ENGINE_JOIN[framework] in ast.unparse(join), f"{framework} join calls no engine"
    assert len(launch.read_text().splitlines()) <= MAX_LAUNCH_LINES, launch
    for workload, strategies in STRATEGY_FUNCTIONS.items():
        defs = top_level(path_of(framework, workload))
        for name in strategies[framework]:
            lines = defs[name].end_lineno - defs[name].lineno + 1
            assert lines <= MAX_STRATEGY_LINES, f"{framework} {workload} {name}: {lines} lines"


def private_names(source: str) -> list[str]:
    """The private names `source` reaches in its code: its string literals included (a module's
    name), its comments and docstrings not."""
    tree = ast.parse(source)
    kinds = (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
    for node in ast.walk(tree):
        if isinstance(node, kinds) and ast.get_docstring(node, clean=False) is not None:
            node.body = node.body[1:] or [ast.Pass()]
    return PRIVATE_API.findall(ast.unparse(tree))


@pytest.mark.parametrize("path", OUTSIDE_GUARD)
def test_the_lesson_files_reach_no_private_framework_api(path):
    found = private_names((ROOT / path).read_text())
    assert not found, f"{path}: {found}: the public API, or a function in guard.py with its reason"


def test_the_private_api_rule_sees_each_kind_of_reach():
    """private_names, on the reaches it exists to catch and on what it must let be."""
    for line in (
        "torch._foreach_add_(ps, grads, alpha=-lr)",
        'block._kwargs["use_global_stats"] = on',
        "for name, p in net._collect_params_with_prefix().items(): pass",
        'new = "torch._inductor.cudagraph_trees" in sys.modules',
        "from torch._dynamo.utils import counters",
        "import jax._src.core",
        "from mxnet.base import _LIB",
    ):
        assert private_names(line), line
    for line in (
        "torch.compiler.cudagraph_mark_step_begin()",
        "name = type(x).__name__",
        "rows = _rows_of(idx, rank, workers, n)",
        "x = 1  # as resnet18._run does",
        'def f():\n    """torch._C in a docstring."""',
    ):
        assert not private_names(line), line


# The lines that do the work, which each lesson page shows (docs/lessons/*.md, the definitions
# its `--8<--` lines name): where one sits in a helper, the page names the helper too.
SHOWN = {
    "lenet": {
        "torch": ["l.backward()", "allreduce(", "p.add_(p.grad"],
        "jax": ["jax.value_and_grad(", "allreduce(", "p - lr * g / n"],
        "mxnet": ["l.backward()", "allreduce(", "p -= lr"],
    },
    "resnet18": {
        # the step, the parallelism, the launcher-or-worker branch, the join
        "torch": [
            *("loss.backward()", "optimizer.step()", "nn.parallel.DistributedDataParallel("),
            *("launch.is_worker()", "launch.torchrun(", "dist.init_process_group("),
        ],
        # the per-device BatchNorm (the vmap's rows) and the split (the NamedSharding)
        "jax": ["jax.vmap(forward", "NamedSharding(mesh, P(AXIS))", "jax.distributed.initialize("],
        # each context's forward and backward, and the Trainer's step
        "mxnet": [
            *("autograd.record()", "loss.backward()", "trainer.step(", "split_and_load("),
            *("launch.is_worker()", "mx.kv.create("),
        ],
    },
}


def shown_code(page: str) -> dict[str, str]:
    """{framework: the source of every definition `page` includes from that framework's folder}."""
    text = (ROOT / "docs" / "lessons" / f"{page}.md").read_text()
    shown = dict.fromkeys(FRAMEWORKS, "")
    for m in re.finditer(r'--8<-- "(\w+)_impl/(\w+\.py):([^"]+)"', text):
        source = (ROOT / f"{m[1]}_impl" / m[2]).read_text()
        for dotted in m[3].split(","):
            node = ast.parse(source)
            for name in dotted.split("."):
                node = next(n for n in node.body if getattr(n, "name", None) == name)
            shown[m[1]] += ast.get_source_segment(source, node) + "\n"
    return shown


@pytest.mark.parametrize("page", SHOWN)
def test_each_lesson_page_shows_the_lines_that_do_the_work(page):
    shown = shown_code(page)
    missing = [
        (f, line) for f, lines in SHOWN[page].items() for line in lines if line not in shown[f]
    ]
    assert not missing, f"docs/lessons/{page}.md shows none of {missing}"


def test_torchs_launch_is_about_200_lines_with_its_torchrun():
    """torch's launch (and a torchrun wrapper of its own, should there be one) stays the size
    of what it teaches: the supervisor lives in common/supervise.py, the rest in guard.py."""
    files = [ROOT / "torch_impl" / n for n in ("launch.py", "torchrun.py")]
    assert sum(len(p.read_text().splitlines()) for p in files if p.exists()) <= 200


def test_every_framework_joins_its_processes_the_same_way():
    """Each framework's launch.py makes the world the strategies take with one `join`, of the
    same arguments and with the same default (common/world.py)."""
    joins = {f: top_level(ROOT / f"{f}_impl" / "launch.py").get("join") for f in FRAMEWORKS}
    for f, join in joins.items():
        assert isinstance(join, ast.FunctionDef), f"{f}_impl/launch.py defines no join"
        assert [a.arg for a in join.args.args] == ["plan", "args"], f
        assert [ast.unparse(d) for d in join.args.defaults] == ["None"], f
        assert ast.unparse(join.returns) == "World", f


def train_functions():
    return [
        pytest.param(f, w, top_level(path_of(f, w))["train"], id=f"{f}-{w}")
        for w in WORKLOADS
        for f in FRAMEWORKS
    ]


@pytest.mark.parametrize(("framework", "workload", "train"), train_functions())
def test_train_reads_like_the_book(framework, workload, train):
    """Short, few parameters (the measuring lives in common.harness), and blind to which
    strategy it runs: no comparison, branch or lookup that names the strategy."""
    lines = train.end_lineno - train.lineno + 1
    assert lines <= MAX_TRAIN_LINES, f"{framework} {workload} train: {lines} lines"
    params = [a.arg for a in train.args.args + train.args.kwonlyargs]
    assert len(params) <= MAX_TRAIN_PARAMETERS, f"{framework} {workload} train: {params}"
    for node in ast.walk(train):
        if isinstance(node, ast.Compare | ast.If | ast.IfExp | ast.Subscript | ast.Match):
            names = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
            assert "strategy" not in names, f"{framework} {workload} train asks the strategy"


def harness_calls(train: ast.FunctionDef) -> list[str]:
    """The harness methods `train` calls on `run` or `repeats`, in the order they appear."""
    calls = [
        n
        for n in ast.walk(train)
        if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.attr in HARNESS
    ]
    return [n.attr for n in sorted(calls, key=lambda n: (n.lineno, n.col_offset))]


@pytest.mark.parametrize("workload", WORKLOADS)
def test_train_takes_the_same_steps_in_every_framework(workload):
    trains = {f: top_level(path_of(f, workload))["train"] for f in FRAMEWORKS}
    order = {f: harness_calls(t) for f, t in trains.items()}
    assert order["jax"] == order["torch"] and order["mxnet"] == order["torch"], order
    if workload != "resnet50":
        assert order["torch"] == ["warm_up", "epochs", "test_batches", "log"], order
    else:
        assert order["torch"] == ["timed"], order


def attributes_set(func: ast.FunctionDef, owners: set[str]) -> list[str]:
    """`owner.attr` of each assignment in `func` to an attribute of one of `owners`."""
    targets = [
        t
        for n in ast.walk(func)
        if isinstance(n, ast.Assign | ast.AugAssign | ast.AnnAssign)
        for t in (n.targets if isinstance(n, ast.Assign) else [n.target])
    ]
    found = [e for t in targets for e in (t.elts if isinstance(t, ast.Tuple) else [t])]
    return [
        ast.unparse(e)
        for e in found
        if isinstance(e, ast.Attribute) and isinstance(e.value, ast.Name) and e.value.id in owners
    ]


@pytest.mark.parametrize("workload", WORKLOADS)
@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_workloads_tell_the_harness_and_set_none_of_its_attributes(framework, workload):
    """What the harness needs of a workload it is told through a call (`warm_up(shard, sync=)`,
    `timed(sync=)`, `save(...)`), so no function of a workload file sets an attribute of its
    Run or Repeats; a Run is built with keywords after its four obvious arguments."""
    tree = tree_of(path_of(framework, workload))
    funcs = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)]
    set_here = [f"{f.name}: {a}" for f in funcs for a in attributes_set(f, {"run", "repeats"})]
    assert not set_here, set_here
    for call in ast.walk(tree):
        if isinstance(call, ast.Call) and ast.unparse(call.func) == "harness.Run":
            assert len(call.args) == 4, ast.unparse(call)


def test_the_attribute_check_sees_an_assignment():
    """attributes_set, on the kinds of assignment it exists to catch and one it must not."""
    lines = ["def train(run, repeats):", "run.sync = f", "repeats.sync, x.read = g, h", "y.z = 1"]
    func = ast.parse("\n    ".join(lines)).body[0]
    assert attributes_set(func, {"run", "repeats"}) == ["run.sync", "repeats.sync"]


def signatures(path: Path) -> dict[str, list[str]]:
    funcs = [n for n in tree_of(path).body if isinstance(n, ast.FunctionDef)]
    return {f.name: [a.arg for a in f.args.args] for f in funcs}


def test_main_and_evaluate_take_the_same_arguments_everywhere():
    for workload in WORKLOADS:
        mains = {f: signatures(path_of(f, workload))["main"] for f in FRAMEWORKS}
        assert all(m == ["args", "plan", "cfg", "hooks"] for m in mains.values()), mains
    for workload in ("resnet18", "resnet50"):
        found = {f: signatures(path_of(f, workload)) for f in FRAMEWORKS}
        for name in ("train", "main", "measure") if workload == "resnet50" else ("main",):
            assert found["jax"][name] == found["torch"][name] == found["mxnet"][name], name


def test_the_allreduce_files_differ_only_in_their_engine():
    """Each framework hands common/collectives.py its collective through the same functions, in
    the same order; the measuring is common's."""
    found = {f: signatures(path_of(f, "allreduce")) for f in FRAMEWORKS}
    want = {"engine": ["world"], "collective": ["world"], "main": ["args", "plan", "cfg", "hooks"]}
    for f in FRAMEWORKS:
        assert found[f] == want and list(found[f]) == list(want), f


def test_the_ceiling_files_take_the_same_arguments():
    """Only the step differs between the frameworks' ceilings: the same functions, arguments."""
    found = {f: signatures(path_of(f, "ceiling")) for f in FRAMEWORKS}
    assert found["jax"] == found["torch"] and found["mxnet"] == found["torch"]


def test_the_pipeline_schedule_lives_in_the_same_class_everywhere():
    for f in FRAMEWORKS:
        cls = top_level(path_of(f, "resnet50"))["PipelineParallelResNet50"]
        methods = {n.name for n in cls.body if isinstance(n, ast.FunctionDef)}
        assert methods - {"__init__"}, f"{f}: PipelineParallelResNet50 only configures"


@pytest.mark.parametrize("workload", WORKLOADS)
@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_workload_files_are_short_without_formatting_tricks(framework, workload):
    """At most 300 lines (LONGER: more for a file with more strategies), counted as `ruff
    format` leaves them (make lint holds them to it): no `fmt: skip` or `fmt: off` to squeeze
    lines past the formatter."""
    text = path_of(framework, workload).read_text()
    assert not re.search(r"fmt:\s*(skip|off)", text), f"{framework}/{workload}: fmt directive"
    limit = MAX_WORKLOAD_LINES + LONGER.get((framework, workload), 0)
    assert len(text.splitlines()) <= limit, f"{framework}/{workload}"


def test_no_python_file_of_the_project_turns_the_formatter_off():
    """ruff formats the whole repository as it is: no formatter directive (`fmt: skip`,
    `fmt: off`) anywhere, the tests included (a table the formatter lengthens stays so)."""
    folders = [*CHECKED, ROOT / "tests"]
    found = [
        f"{path.relative_to(ROOT)}:{n}"
        for folder in folders
        for path in sorted(folder.rglob("*.py"))
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if re.search(r"#\s*fmt:\s*(skip|off)", line)
    ]
    assert not found, found


def python_files():
    return sorted(p for d in CHECKED for p in d.glob("*.py"))


def test_no_function_is_longer_than_60_lines():
    long = []
    for path in python_files():
        for node in ast.walk(tree_of(path)):
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


def test_common_reaches_no_framework_by_name():
    """common/ imports no framework package, directly or by a name it builds: the frameworks
    hand their functions over (common.harness.Hooks), so the import graph is the run-time one."""
    for path in sorted((ROOT / "common").glob("*.py")):
        tree = tree_of(path)
        for node in ast.walk(tree):
            if isinstance(node, ast.Import | ast.ImportFrom):
                names = [a.name for a in node.names] + [getattr(node, "module", None) or ""]
                assert not any(n.split(".")[0].endswith("_impl") for n in names), path.name
            if isinstance(node, ast.Attribute | ast.Name):
                name = getattr(node, "attr", getattr(node, "id", ""))
                assert name not in ("import_module", "__import__"), f"{path.name}: {name}"


# Comments tell why, in the present: what happened when, and what a run measured, belong in
# the commit log, docs/results.md and the records.
YEAR = r"\b(199\d|20[0-3]\d)\b(?![\d.]|\s*(x|MiB|GiB|bytes|images|steps))"
HISTORY = [
    (re.compile(YEAR), "a year or date"),
    (re.compile(r"\bissue\s+#?\d+", re.I), "an issue number"),
    (re.compile(r"\d\s*(ms|s)/(epoch|step)\b|\d\s*ms\b"), "a measured time"),
]


def prose(path: Path):
    """(line, text) of every comment and docstring in `path`."""
    text = path.read_text()
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.COMMENT:
            yield tok.start[0], tok.string
    for node in ast.walk(ast.parse(text)):
        kinds = (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
        if isinstance(node, kinds) and (doc := ast.get_docstring(node, clean=False)):
            yield getattr(node, "lineno", 1), doc


def test_comments_say_why_in_the_present():
    found = [
        f"{path.relative_to(ROOT)}:{line}: {what}: {pattern.search(text).group(0)!r}"
        for path in python_files()
        for line, text in prose(path)
        for pattern, what in HISTORY
        if pattern.search(text)
    ]
    assert not found, found


def test_the_comment_rules_catch_history():
    """The patterns above, on the kinds of comment they exist to keep out."""
    for text in (
        "# one H100 (issue 12): 3.17 s/epoch",
        "# seen on 2026-11-26",
        "# issue 14, about 1 run in 10",
        "# 148 against 157 ms",
    ):
        assert any(p.search(text) for p, _ in HISTORY), text
    for text in ("# 2 devices: batch 512", "# a batch of 256", "# 4096 x 4096 tiles"):
        assert not any(p.search(text) for p, _ in HISTORY), text
