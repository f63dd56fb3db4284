"""No measured figure is typed in the pages' prose: README.md, docs/*.md, docs/lessons/*.md and
any Markdown file a page of the site takes in whole. Every figure a reader sees is written by
the build from the records (`make readme-tables`, the docs hook's `--8<--` tables); the prose
says what they show in words ("about twice", "short of twice", "within a sixth").

Prose is the text outside front matter, generated parts (`<!-- NAME:begin ... -->` to
`<!-- NAME:end -->`), fenced code, inline code, `--8<--` lines, HTML comments and tags, link
targets, URLs and attribute lists. In prose, a figure is

- a number with a unit of measure (UNIT): a ratio (1.88x), a share (16%), a time (295 ms, five
  minutes being words), a size or a rate (64 MiB, 0.48 GB/s), "times"; the numbers of a list or
  range before the unit are figures too (from 492 to 306 s);
- a count that an engine or a record makes (COUNTED: 111 operands, 76 keys, 40 runs);
- any other decimal (accuracy 0.83), but a version or a section after its name (NAMED:
  Python 3.11, numpy 1.24, d2l 13.6); a number of several dots is an address or a version
  (127.0.0.1, torch 2.15.0: a framework's version is written whole).

Not figures: counts of devices, ranks, nodes, cores and stages (2 devices, N = 2, 4, 8),
identifiers (ResNet-18, bf16, 10gbit, 3x3), formulas ((p - 1) / (m + p - 1)). A figure that is
the code's own setting (a timeout, the all-reduce sizes) stays only where `code_values` says
where it stands and finds it equal to the code; a batch size or a learning rate is one that a
preset makes (common/config.py).
"""

from __future__ import annotations

import inspect
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from common import cli, collectives, config, supervise
from compare import comm_model
from tools import docs_hook

ROOT = Path(__file__).resolve().parents[2]

# --- what is not prose: each replaced by as many newlines as it spans, so lines keep their number
FRONT_MATTER = re.compile(r"\A---\n.*?\n---\n", re.S)
GENERATED = re.compile(r"<!-- (?P<name>[\w-]+):begin\b.*?-->.*?<!-- (?P=name):end -->", re.S)
FENCE = re.compile(
    r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,}).*?^(?P=indent)(?P=fence)[ \t]*$", re.S | re.M
)
COMMENT = re.compile(r"<!--.*?-->", re.S)
BLOCKS = (FRONT_MATTER, GENERATED, FENCE, COMMENT, docs_hook.DIRECTIVE)
# ... and within a line, each replaced by a space (and the newlines it spans): code, which may
# wrap but not end its paragraph; a link's target, "[text](target "title")", its text staying
CODE_SPAN = re.compile(r"(?P<ticks>`+)(?:(?!\n[ \t]*\n).)+?(?P=ticks)", re.S)
LINK_TARGET = re.compile(r"\]\([^)\s]*(?:\s+\"[^\"]*\")?\)")
URL = re.compile(r"<?https?://[^\s>)]+>?")
TAG = re.compile(r"</?[A-Za-z][^>\n]*>")
ATTRIBUTES = re.compile(r"\{:?\s*[#.][^}\n]*\}")  # attr_list, a heading's {#anchor}
SPANS = (CODE_SPAN, LINK_TARGET, URL, TAG, ATTRIBUTES)

# --- what a figure is
NUMBER = r"[-+−]?\d+(?:[.,]\d+)*"
# Where a number starts: not inside a word (bf16, AVX2), nor after a word's hyphen (ResNet-18,
# stride-2), nor inside another number.
START = r"(?<![\w.,])(?<![A-Za-z_]-)"
LIST = rf"{NUMBER}(?:\s*(?:,|-|–|/|to|and|or|against)\s*{NUMBER})*"
ATTACHED = r"(?:x|%)(?![\w])"  # 1.88x, 16%: a ratio, a share (3x3 and 128x128 are shapes)
UNIT = (
    r"(?:%|per ?cent|times|fold"
    r"|[kKMGT]i?B(?:/s)?|B|[kMG]bit(?:/s)?|[kMG]b/s"  # sizes and rates
    r"|(?:ns|µs|us|ms|s|min|minutes?|seconds?|hours?)(?:/(?:step|epoch|repeat))?"  # times
    r"|[GT]FLOPs?(?:/s)?|images?/s(?:ec)?|img/s)(?![\w/])"
)
# What the engines and the records count: their counts are the code's or the records' to say.
COUNTED = r"(?:operands?|keys|buckets|all-reduce ops|ops|all-reduces|runs|timed steps|records)\b"
FIGURE = re.compile(
    rf"{START}(?P<figure>{LIST}(?:{ATTACHED}|\s+{UNIT}|\s+(?:\w+\s+)?{COUNTED})"
    rf"|{NUMBER}\s+(?:against|versus|vs\.?)\s+{NUMBER})"  # two measurements set side by side
    rf"|{START}(?P<decimal>[-+−]?\d+\.\d+)(?![\d.]*\d)"
)
# A version or a section after its name is not a measurement: "Python 3.11, 3.12 or 3.13",
# "numpy below 1.24", "CUDA 13.0", "d2l 13.6". Only names that no measurement follows: after a
# framework's name a decimal is a time ("JAX 1.46"), so its version is written whole (2.15.0).
NAMED = re.compile(
    r"(?:Python|numpy|CUDA|d2l)\s+(?:(?:below|above|at least|[<>]=?)\s+)?"
    r"(?:\d+(?:\.\d+)+\s*(?:,|-|–|/|or|and|to)\s*)*$"
)
# A batch size and a learning rate are the config's, held to it by `settings`.
BATCH = re.compile(r"\bbatch(?:es)?(?: size)?(?: of)? (?P<n>\d+)\b")
LR = re.compile(r"\blr (?P<lr>\d+(?:\.\d+)?)\b")


@dataclass(frozen=True)
class CodeValue:
    """A figure that is the code's own setting, where it stands (`page`, the `pattern` around
    it in the raw line, the number as {}) and the value the code holds."""

    page: str
    pattern: str
    value: object
    why: str


def code_values() -> list[CodeValue]:
    sizes = collectives.sizes(config.get_config("allreduce", "full").max_bytes)
    network = round(comm_model.NET_100G_BYTES_PER_S * 8 / 1e9)  # the predictions' network, Gb/s
    return [
        CodeValue(
            "docs/usage.md",
            "Float32 buffers from {} B to {} MiB in powers of 4",
            (sizes[0], sizes[-1] // 2**20),
            "the all-reduce benchmark's sizes (common/collectives.sizes of the preset's max_bytes)",
        ),
        CodeValue("docs/usage.md", "(NVLink, a {} Gb/s network)", network, "a predicted link"),
        CodeValue("docs/results.md", "over a {} Gb/s network", network, "a predicted link"),
        CodeValue(
            "docs/usage.md",
            "`MXNET_DIST_INIT_TIMEOUT`: {} s",
            _same(
                _default("jax_impl/guard.py", "JAX_INIT_TIMEOUT"),
                _default("mxnet_impl/guard.py", "MXNET_DIST_INIT_TIMEOUT"),
            ),
            "the joins' default bound, JAX's and MXNet's",
        ),
        CodeValue(
            "docs/usage.md",
            "torch's `--rdzv-timeout`: {} s",
            cli.RDZV_TIMEOUT_S,
            "the nodes' default bound",
        ),
        CodeValue(
            "docs/design.md",
            "torch's {} s later",
            _constant("torch_impl/guard.py", "TORCH_MARGIN_S"),
            "torch's own rendezvous timeouts after the launcher's",
        ),
        CodeValue(
            "docs/design.md",
            "does just that {} s after a Ctrl-C",
            _sigint_wait(),
            "CPython's subprocess: how long a Ctrl-C waits for the child before it is killed",
        ),
        CodeValue(
            "docs/design.md",
            "SIGKILL after {} s",
            supervise.LAUNCHER_STOP_S,
            "how long the launcher waits for torchrun after its SIGTERM",
        ),
    ]


def _same(*values):
    """The one value all of `values` are, else None (which no typed figure equals)."""
    return values[0] if len(set(values)) == 1 else None


def _default(path: str, variable: str) -> int:
    """The default a framework file gives an environment variable (`env_int(NAME, "60", ...)`),
    read as text: the framework is not imported here."""
    text = (ROOT / path).read_text()
    return int(re.search(rf'"{variable}", "(\d+)"', text)[1])


def _sigint_wait() -> float:
    """How long `subprocess.run` waits for its child after a Ctrl-C before it kills it."""
    return float(re.search(r"_sigint_wait_secs = ([\d.]+)", inspect.getsource(subprocess.Popen))[1])


def _constant(path: str, name: str) -> int:
    """A module constant of a framework file (`NAME = 60`), read as text."""
    return int(re.search(rf"^{name} = (\d+)", (ROOT / path).read_text(), re.M)[1])


@dataclass(frozen=True)
class Finding:
    page: str
    line: int
    figure: str
    text: str

    def __str__(self) -> str:
        return f"{self.page}:{self.line}: {self.figure!r} in: {self.text.strip()}"


def pages() -> list[Path]:
    """README.md, the site's own pages, and each Markdown file a page takes in whole."""
    docs = sorted((ROOT / "docs").glob("*.md")) + sorted((ROOT / "docs" / "lessons").glob("*.md"))
    taken = {
        m["path"]
        for page in docs
        for m in docs_hook.DIRECTIVE.finditer(page.read_text())
        if m["path"].endswith(".md")
    }
    return [ROOT / "README.md", *docs, *(ROOT / path for path in sorted(taken))]


def prose(markdown: str) -> str:
    """`markdown` with everything but its prose blanked, line for line."""
    for block in BLOCKS:
        markdown = block.sub(lambda m: "\n" * m[0].count("\n"), markdown)
    for span in SPANS:
        markdown = span.sub(lambda m: " " + "\n" * m[0].count("\n"), markdown)
    return markdown


def figures(markdown: str, page: str = "page.md", values=()) -> list[Finding]:
    """Every figure typed in `markdown`'s prose, but a code value that equals the code's."""
    raw = markdown.splitlines()
    found = []
    for n, line in enumerate(prose(markdown).splitlines(), 1):
        for m in FIGURE.finditer(line):
            if m["decimal"] and NAMED.search(line[: m.start()]):
                continue
            if m["decimal"] and re.search(r"\blr $", line[: m.start()]):
                continue  # a learning rate: `settings` holds it to the config
            if _is_code_value(raw[n - 1], m, page, values):
                continue
            found.append(Finding(page, n, m["figure"] or m["decimal"], line))
    return found


def _is_code_value(raw_line: str, match: re.Match, page: str, values) -> bool:
    """`match` stands where a code value of `page` is said, and says the code's value."""
    for value in values:
        typed = re.search(_pattern(value.pattern), raw_line) if value.page == page else None
        if typed and match.group(0).strip() in typed.group(0):
            return _numbers(typed) == _wanted(value)
    return False


def _pattern(template: str) -> str:
    return re.escape(template).replace(r"\{\}", rf"({NUMBER})")


def _numbers(typed: re.Match) -> tuple:
    return tuple(int(g) if g.isdigit() else float(g) for g in typed.groups())


def _wanted(value: CodeValue) -> tuple:
    return value.value if isinstance(value.value, tuple) else (value.value,)


def config_values() -> tuple[set[int], set[float]]:
    """Every batch size and learning rate a preset makes, on 1 and 2 devices."""
    batches, lrs = set(), set()
    for workload in config.WORKLOADS:
        for preset in config.PRESETS:
            for n in (1, 2):
                cfg = config.for_devices(config.get_config(workload, preset), n)
                batches.add(getattr(cfg, "batch_size", None))
                lrs.add(getattr(cfg, "lr", None))
    return batches - {None}, lrs - {None}


def settings(markdown: str, page: str = "page.md") -> list[Finding]:
    """Each batch size or learning rate in `markdown`'s prose that no preset makes."""
    batches, lrs = config_values()
    found = []
    for n, line in enumerate(prose(markdown).splitlines(), 1):
        found += [
            Finding(page, n, m[0], line) for m in BATCH.finditer(line) if int(m["n"]) not in batches
        ]
        found += [
            Finding(page, n, m[0], line) for m in LR.finditer(line) if float(m["lr"]) not in lrs
        ]
    return found


# --- the pages ---------------------------------------------------------------------------------


def test_no_page_types_a_figure_the_build_does_not_write():
    found = []
    for path in pages():
        page = path.relative_to(ROOT).as_posix()
        found += figures(path.read_text(), page, code_values())
    assert not found, "typed figures (say it in words, or let the build write it):\n" + "\n".join(
        map(str, found)
    )


def test_each_batch_size_and_learning_rate_on_a_page_is_the_configs():
    found = []
    for path in pages():
        found += settings(path.read_text(), path.relative_to(ROOT).as_posix())
    assert not found, "settings no preset makes (common/config.py):\n" + "\n".join(map(str, found))


def test_each_code_value_is_where_it_is_said_and_equals_the_code():
    for value in code_values():
        text = (ROOT / value.page).read_text()
        typed = re.search(_pattern(value.pattern), text)
        assert typed, f"{value.page} no longer says {value.pattern!r}: drop it from code_values"
        numbers, want = _numbers(typed), _wanted(value)
        assert numbers == want, f"{value.page}: {value.pattern!r} says {numbers}, the code {want}"


def test_the_pages_include_the_site_and_the_readme():
    names = {path.relative_to(ROOT).as_posix() for path in pages()}
    assert {"README.md", "docs/results.md", "docs/lessons/resnet18.md"} <= names


# --- the rule ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "sentence",
    [
        "torch's DDP and MXNet's parameter server train ResNet-18 2.0x as fast on two devices",
        "JAX's single program 1.7x; JAX's LeNet gains 3.1x, more than its devices",
        "The loops run within 1.10x of their ceilings at the cpu preset.",
        "It is within 15% of every cell, at 1gbit -16.4%.",
        "on one core a batch of 256 takes 295 ms and one of 128 takes 66.",
        "XLA:CPU's bf16 gains nothing (801 against 782).",
        "torch's autocast takes ResNet-18's epoch from 492 to 306 s.",
        "Accuracy is d2l's (lenet 0.83, resnet18 0.90-0.92).",
        "at 64 MiB the ring keeps the bandwidth (246 ms at 8 ranks, busbw 0.48 GB/s)",
        "the 111 operands of XLA's all-reduce ops, Gluon's 76 keys",
        "one `make compare` of the whole plan, 40 runs.",
        "`make test` takes 5 to 8 minutes on 2 cores",
        "Stage 0's busy share falls from 0.41 to 0.28 as m grows.",
        "the same ceilings took 8-11% longer on the H100",
        "the same code measured 0.91x and 1.25x in two pairs of separate runs",
        "with NCHW, XLA:CPU took 6x as long for the forward",
        "| torch compiled | 1.41 | 1.00x |",
        "- **JAX 1.94x** on two devices",
        "in float32 torch compiled takes 1.41 s/epoch, JAX 1.46, torch eager 1.86",
        "torch's `dist.all_reduce` over gloo moves 64 MiB in 65 ms unlimited",
        "In a list item, the same [link text 1.94x](lenet.md) is prose.",
    ],
)
def test_a_typed_figure_is_found(sentence):
    assert figures(f"# A page\n\nSome words.\n{sentence}\n"), sentence


@pytest.mark.parametrize(
    "sentence",
    [
        "Data parallelism from scratch (LeNet, d2l 13.5), each framework's tool (d2l 13.6).",
        "On x86_64 Linux whose `python3` is Python 3.11, 3.12 or 3.13, with internet access.",
        "MXNet 1.9.1 needs numpy below 1.24; torch 2.15.0 traces it whole; since JAX 0.8.0.",
        "each of 2 devices gets a core of its own, beside a 1-device run on one core",
        "at N = 2, 4, 8 ranks, on 2 nodes of one core each, 8 micro-batches",
        "ResNet-18 and ResNet-50 in bf16 and float32 on AVX2 and AVX-512 (AVX512_BF16), H100",
        "links unlimited, 10gbit, 1gbit and 100mbit; a 3x3 stem; 128x128 images; a 1x1 conv",
        "GPipe's bubble (p - 1) / (m + p - 1); busbw = algbw x 2(n - 1)/n; limit 2^-24",
        "rendezvous on 127.0.0.1, its nodes 10.213.0.1 and up",
        "The table's `1.88x` and `within 15%` are code.",
        "A [link](../results/test-times-1.5x-2.0x.txt) and an anchor {#ratio-1.5x}.",
        "exit 128 + the signal's number (130 for Ctrl-C); the 8th digit",
        "JAX 0.11.2 on CUDA 13.0; torch 2.15.0; d2l 13.6 trains two GPUs with batch 512, lr 0.2",
        "the JAX speedup is about twice, short of twice, within a sixth",
    ],
)
def test_what_is_not_a_figure_is_not_found(sentence):
    assert not figures(f"# A page\n\n{sentence}\n"), figures(sentence)


def test_the_generated_parts_code_and_front_matter_are_not_prose():
    page = "\n".join(
        [
            "---",
            "title: 1.5x",
            "---",
            "# Results",
            "<!-- reference-results:begin (`make readme-tables` writes this part) -->",
            "| torch ddp | 2.02x* | 15.3 s |",
            "<!-- reference-results:end -->",
            "<!-- scaling:begin (written) -->",
            "within 15% of every cell",
            "<!-- scaling:end -->",
            '=== "JAX"',
            "",
            "    ```sh",
            "    make bench ARGS=--timeout 300s   # 1.5x",
            "    ```",
            "",
            '    --8<-- "results/cpu-xeon-avx512-2core.jsonl:lenet"',
            "<!-- a comment of 1.5x -->",
            "Words only.",
        ]
    )
    assert not figures(page)
    assert figures(page.replace("Words only.", "Words, and 1.5x."))[0].line == 19


def test_a_figure_outside_a_generated_part_is_found_on_its_line():
    page = "<!-- other:begin (written) -->\n1.5x\n<!-- other:end -->\nJAX 1.7x\n"
    assert [(f.line, f.figure) for f in figures(page)] == [(4, "1.7x")]


def test_a_code_value_stays_only_while_it_equals_the_code():
    value = CodeValue("page.md", "waits {} s for its peers", 60, "a timeout")
    assert not figures("It waits 60 s for its peers.\n", "page.md", [value])
    assert figures("It waits 90 s for its peers.\n", "page.md", [value])
    assert figures("It waits 60 s for its peers.\n", "other.md", [value])


@pytest.mark.parametrize(
    ("sentence", "wrong"),
    [
        ("two GPUs with batch 512 and lr 0.2", []),
        ("two GPUs with batch 512 and lr 0.3", ["lr 0.3"]),
        ("lenet batch 300, lr 0.2", ["batch 300"]),
    ],
)
def test_a_batch_size_or_lr_no_preset_makes_is_found(sentence, wrong):
    assert [f.figure for f in settings(sentence)] == wrong
