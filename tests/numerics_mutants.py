"""Planted bugs for the numerics tests: each must make its test fail, and by how much.

    .venv/base/bin/python -m tests.numerics_mutants [--isa AVX2] [--only ID ...]   (make mutants)

For each mutant: copy the repository's files (tracked and new, not ignored) to a scratch folder,
replace `old` by `new` in `path` (the text must occur exactly once), and run the test in its
framework's environment with NUMERICS_LOG set (tests/fixtures/numerics.py logs every check).
The same test is run once unmutated. The table gives each run's worst check as error / limit:
below 1 unmutated, above 1 (by the margin shown) with the bug. `--isa AVX2` caps oneDNN, MKLDNN
and XLA at AVX2, as `make numerics` does. Not part of `make test`: it takes minutes. VENV points
at the folder of environments (default: .venv of this checkout).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ISA_CAP = {
    "ATEN_CPU_CAPABILITY": "avx2",  # torch's ATen kernels and TorchInductor's generated C++
    "MKL_ENABLE_INSTRUCTIONS": "AVX2",  # MKL, under torch's and MXNet's GEMMs
    "ONEDNN_MAX_CPU_ISA": "AVX2",  # torch's oneDNN
    "DNNL_MAX_CPU_ISA": "AVX2",  # MXNet 1.9's MKLDNN (oneDNN 2.x reads this name)
    "XLA_FLAGS": "--xla_cpu_max_isa=AVX2",  # XLA:CPU's code generation
    # TorchInductor's own cache: it mixes up kernels built at another ISA (docs/design.md)
    "TORCHINDUCTOR_CACHE_DIR": str(ROOT / "build" / "test-cache" / "inductor-avx2"),
}
TIMEOUT_S = 600


@dataclass(frozen=True)
class Mutant:
    id: str
    env: str  # .venv/<env>
    test: str  # pytest node id
    path: str  # the file to change
    old: str
    new: str
    what: str  # the realistic bug, in words


FRAMEWORKS = ("torch", "jax", "mxnet")  # each lists its mutants in tests/<fw>_impl/mutants.py


def all_mutants() -> list[Mutant]:
    import importlib

    return [
        m for fw in FRAMEWORKS for m in importlib.import_module(f"tests.{fw}_impl.mutants").MUTANTS
    ]


def scratch_copy(dest: Path) -> None:
    """The repository's files as git sees them (tracked and new), without .venv or builds."""
    names = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    for name in filter(None, names):
        src = ROOT / name.decode()
        if src.is_file():
            (dest / name.decode()).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name.decode())


def run_test(m: Mutant, mutate: bool, isa: str | None) -> tuple[float | None, str]:
    """(worst error / limit over the test's checks, pytest's last line)."""
    with tempfile.TemporaryDirectory(prefix="mutant-") as tmp:
        work = Path(tmp)
        scratch_copy(work)
        if mutate:
            target = work / m.path
            text = target.read_text()
            if text.count(m.old) != 1:
                raise SystemExit(f"error: mutant {m.id}: its text occurs {text.count(m.old)}x")
            target.write_text(text.replace(m.old, m.new))
        log = work / "numerics.jsonl"
        env = {**os.environ, "NUMERICS_LOG": str(log), "PYTHONDONTWRITEBYTECODE": "1"}
        if isa:
            env.update({k: f"{env.get(k, '')} {v}".strip() for k, v in ISA_CAP.items()})
        python = Path(os.environ.get("VENV", ROOT / ".venv")) / m.env / "bin" / "python"
        cmd = [str(python), "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", m.test]
        out = subprocess.run(
            cmd, cwd=work, env=env, capture_output=True, text=True, timeout=TIMEOUT_S
        )
        lines = [json.loads(x) for x in log.read_text().splitlines()] if log.exists() else []
        worst = max((x["error"] / x["limit"] for x in lines), default=None)
        tail = (out.stdout.strip().splitlines() or ["(no output)"])[-1]
        return worst, tail


def ratio(value: float | None, tail: str = "") -> str:
    if value is None:
        return f"no check ran ({tail})" if tail else "no check ran"
    return f"{value:.3g}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--isa", choices=["AVX2"], default=None, help="cap the CPU instruction set")
    p.add_argument("--only", nargs="*", default=None, help="mutant ids (default: all)")
    args = p.parse_args(argv)
    chosen = [m for m in all_mutants() if args.only is None or m.id in args.only]
    if args.only and len(chosen) != len(args.only):
        print(
            f"error: unknown mutant in {args.only}; see tests/<framework>_impl/mutants.py",
            file=sys.stderr,
        )
        return 2
    venv = Path(os.environ.get("VENV", ROOT / ".venv"))
    for env in sorted({m.env for m in chosen if not (venv / m.env / ".stamp").exists()}):
        print(f"{env}: not set up (make setup), its mutants are skipped")
    chosen = [m for m in chosen if (venv / m.env / ".stamp").exists()]
    print(f"ISA: {args.isa or 'native'}\n")
    print("| mutant | bug | test | clean: error/limit | mutated: error/limit | caught |")
    print("|---|---|---|---|---|---|")
    baseline, missed = {}, 0
    for m in chosen:
        if m.test not in baseline:
            baseline[m.test] = run_test(m, False, args.isa)
        clean, (worst, tail) = baseline[m.test][0], run_test(m, True, args.isa)
        caught = "failed" in tail or "error" in tail
        missed += not caught
        test = m.test.split("::")[-1]
        print(
            f"| {m.id} | {m.what} | {test} | {ratio(clean)} | {ratio(worst, tail)} | "
            f"{'yes' if caught else 'NO'} |",
            flush=True,
        )
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
