"""tools/compiled_step.py: the probe of what torch's loop adds to its compiled step on a GPU
(docs/results.md, the H200). Here eager, on a CPU: that each variant runs what it names."""

import dataclasses
import json

import pytest
import torch

from common import config, data, utilization
from tools import compiled_step
from torch_impl import resnet18

ARGS = ["--eager", "--batch", "4", "--steps", "2", "--rounds", "1"]


@pytest.mark.slow
def test_probe_appends_one_line_with_every_variant(tmp_path, capsys):
    out = tmp_path / "r.jsonl"
    assert compiled_step.main([*ARGS, "--results", str(out)]) == 0
    (line,) = out.read_text().splitlines()
    rec = json.loads(line)
    names = [r["variant"] for r in rec["rows"]]
    assert names[0] == "ceiling step" and len(set(names)) == 8
    assert rec["rows"][0]["x_ceiling_step"] == 1.0 and rec["compiled"] is False
    assert all(r["ms_per_step"] >= r["host_ms_per_step"] > 0 for r in rec["rows"])
    assert rec["hardware"]["cpu_count"] and rec["versions"]["torch"] == torch.__version__
    assert len(capsys.readouterr().out.splitlines()) == 9  # the warm-up line, a line a variant


def test_each_variant_runs_what_it_names(monkeypatch):
    """Every resnet18.train_step call, by model and batch size: a variant that timed the plain
    step under another name would show the probe's table something it did not measure."""
    calls = []

    def train_step(net, optimizer, x, y, amp=False):
        calls.append((net, len(y)))
        return torch.zeros(())

    monkeypatch.setattr(resnet18, "train_step", train_step)
    args = compiled_step.parse(ARGS)[0]
    cfg = config.get_config("resnet18", "full", batch_size=4)
    sampler = utilization.Sampler("cpu_time")
    runs, _, _, _ = compiled_step.variants(args, cfg, torch.device("cpu"), sampler, _few())
    seen = {}
    for name, (prepare, run) in runs.items():
        calls.clear()
        prepare()
        run(4)
        seen[name] = list(calls)
    main = seen["ceiling step"][0][0]
    assert seen["ceiling step"] == [(main, 4)] * 4
    assert seen["+ batch gather, loss sum"] == [(main, 4)] * 4
    assert seen["+ nvidia-smi sampler"] == [(main, 4)] * 4 and sampler.wall_seconds > 0
    assert seen["+ partial batch"] == [(main, 4)] * 3 + [(main, 2)]
    other = seen["after 2nd model's step"][0][0]
    assert other is not main and seen["after 2nd model's step"] == [(other, 4)] + [(main, 4)] * 4
    assert seen["after eager evaluation"] == [(main, 4)] * 4  # evaluation takes no step
    fused = seen["fused SGD"][0][0]
    assert fused not in (main, other) and seen["fused SGD"] == [(fused, 4)] * 4
    assert seen["loss in the graph"] == []  # its own step: checked against train_step below


def test_the_partial_batch_is_the_epochs_last_or_half_a_batch():
    assert compiled_step.partial_size(60_000, 256) == 96
    assert compiled_step.partial_size(192, 4) == 2 and compiled_step.partial_size(9, 4) == 1


def _few():
    """Fashion-MNIST cut to what the variants index (the partial batch's first images) and an
    evaluation's one batch: which step each variant takes does not depend on the set's size."""
    fm = data.load()
    train, test = slice(192), slice(8)
    return dataclasses.replace(
        fm,
        train_images=fm.train_images[train],
        train_labels=fm.train_labels[train],
        test_images=fm.test_images[test],
        test_labels=fm.test_labels[test],
    )


def test_the_loss_in_the_graph_takes_the_ceilings_step():
    """The same weights and batch: the same losses and the same updated weights after two steps
    (float32, eager, the same operations in the same order: equal to the bit)."""
    cfg = config.get_config("resnet18", "full", batch_size=4)
    device = torch.device("cpu")
    net, step, _ = compiled_step.build(cfg, device, amp=False, compiled=False)
    net2, step2 = compiled_step.build_loss_in_graph(cfg, device, amp=False, compiled=False)
    x, y = torch.randn(4, 1, 28, 28), torch.tensor([0, 3, 5, 9])
    for _ in range(2):  # a second step: the gradients of the first are not carried over
        assert torch.equal(step(x, y), step2(x, y))
    for (name, a), b in zip(net.state_dict().items(), net2.state_dict().values(), strict=True):
        assert torch.equal(a, b), name


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--steps", "0"], "--batch, --steps and --rounds must be at least 1"),
        (["--results", "{tmp}"], "is not a file; choose another --results"),
    ],
)
def test_bad_input_is_one_line(tmp_path, capsys, argv, message):
    with pytest.raises(SystemExit) as e:
        compiled_step.parse([a.replace("{tmp}", str(tmp_path)) for a in argv])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert message in err and "Traceback" not in err


def test_missing_data_is_one_line(monkeypatch, capsys):
    def missing():
        raise data.DatasetError("Fashion-MNIST not found in /nowhere; set FASHION_MNIST_DIR")

    monkeypatch.setattr(data, "load", missing)
    with pytest.raises(SystemExit) as e:
        compiled_step.parse([])
    assert e.value.code == 2 and "Fashion-MNIST not found" in capsys.readouterr().err
