"""common/traces.py: --profile's Chrome traces read and summarised, on hand-made traces in the
three shapes the frameworks write (torch: "X" events and an envelope; MXNet: "B"/"E" pairs and
counters; JAX: gzipped)."""

import gzip
import json
import subprocess
import sys

import pytest

from common import traces

META = [
    {"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "host"}},
    {"ph": "M", "name": "thread_name", "pid": 1, "tid": 7, "args": {"name": "main"}},
    {"ph": "M", "name": "process_name", "pid": 2, "args": {"name": "GPU 0"}},
]
# host: a step (0-100 us) holding a conv (10-40) holding a launch (20-25), then a loss (60-70);
# GPU: two kernels (30-50, 45-90) overlapping on two streams, so busy 30-90 = 60 us.
TORCH_LIKE = META + [
    {
        "ph": "X",
        "cat": "Trace",
        "name": "PyTorch Profiler (0)",
        "pid": "Spans",
        "ts": 0,
        "dur": 500,
    },
    {"ph": "X", "name": "step", "pid": 1, "tid": 7, "ts": 0, "dur": 100},
    {"ph": "X", "name": "conv", "pid": 1, "tid": 7, "ts": 10, "dur": 30},
    {"ph": "X", "name": "launch", "pid": 1, "tid": 7, "ts": 20, "dur": 5},
    {"ph": "X", "name": "loss", "pid": 1, "tid": 7, "ts": 60, "dur": 10},
    {"ph": "X", "name": "kernel_a", "pid": 2, "tid": 1, "ts": 30, "dur": 20},
    {"ph": "X", "name": "kernel_b", "pid": 2, "tid": 2, "ts": 45, "dur": 45},
    {"ph": "i", "name": "marker", "pid": 1, "tid": 7, "ts": 5},
]
MXNET_LIKE = META[:2] + [
    {"ph": "B", "name": "dot", "pid": 1, "tid": 7, "ts": 0},
    {"ph": "B", "name": "inner", "pid": 1, "tid": 7, "ts": 2},
    {"ph": "E", "name": "inner", "pid": 1, "tid": 7, "ts": 6},
    {"ph": "E", "name": "dot", "pid": 1, "tid": 7, "ts": 10},
    {"ph": "C", "name": "memory", "pid": 1, "ts": 3, "args": {"bytes": 1}},
    {"ph": "b", "name": "async", "pid": 1, "id": 1, "ts": 1},
    {"ph": "e", "name": "async", "pid": 1, "id": 1, "ts": 50},
]


def test_events_are_named_by_process_and_thread_and_the_envelope_is_left_out():
    evs = traces.events(TORCH_LIKE)
    assert {e.name for e in evs} == {"step", "conv", "launch", "loss", "kernel_a", "kernel_b"}
    conv = next(e for e in evs if e.name == "conv")
    assert (conv.process, conv.thread, conv.start, conv.end) == ("host", "main", 10, 40)
    kernel = next(e for e in evs if e.name == "kernel_b")
    assert (kernel.process, kernel.thread) == ("GPU 0", "tid 2")  # unnamed: its id


def test_begin_end_pairs_nest_and_counters_and_async_events_are_left_out():
    evs = traces.events(MXNET_LIKE)
    assert sorted((e.name, e.start, e.end) for e in evs) == [("dot", 0, 10), ("inner", 2, 6)]
    assert traces.self_times(evs) == {"dot": (6, 1), "inner": (4, 1)}


def test_busy_is_the_union_of_overlapping_events():
    evs = traces.events(TORCH_LIKE)
    assert traces.busy([e for e in evs if e.process == "GPU 0"]) == 60  # 30-90, not 20 + 45
    assert traces.busy([e for e in evs if e.process == "host"]) == 100


def test_at_once_counts_only_time_two_processes_share():
    def span(pid, tid, ts, dur):
        return {"ph": "X", "name": "op", "pid": pid, "tid": tid, "ts": ts, "dur": dur}

    # cpu/0 on two threads at once (0-10 and 5-8: one process, once), then 20-30; cpu/1 10-20
    # and 25-35: the two meet only in 25-30.
    raw = [span(0, 1, 0, 10), span(0, 2, 5, 3), span(0, 1, 20, 10)]
    raw += [span(1, 1, 10, 10), span(1, 1, 25, 10)]
    evs = traces.events(raw)
    groups = [[e for e in evs if e.process == f"pid {p}"] for p in (0, 1)]
    assert traces.at_once(groups) == 5
    torch_like = traces.events(TORCH_LIKE)
    host_and_gpu = [[e for e in torch_like if e.process == p] for p in ("host", "GPU 0")]
    assert traces.at_once(host_and_gpu) == 60  # the GPU's 30-90 inside the host's step


def test_self_time_subtracts_direct_children_only():
    host = [e for e in traces.events(TORCH_LIKE) if e.process == "host"]
    times = traces.self_times(host)
    # step 100 - conv 30 - loss 10; conv 30 - launch 5 (launch is conv's child, not step's)
    assert times == {"step": (60, 1), "conv": (25, 1), "launch": (5, 1), "loss": (10, 1)}
    assert sum(t for t, _ in times.values()) == traces.busy(host)


def test_summary_of_a_gzipped_trace_and_the_command_line(tmp_path, capsys):
    with gzip.open(tmp_path / "jax-lenet-epoch.json.gz", "wt") as f:
        json.dump({"traceEvents": TORCH_LIKE}, f)
    (tmp_path / "mxnet-lenet-epoch.json").write_text(json.dumps(MXNET_LIKE))  # a bare list
    (tmp_path / "notes.txt").write_text("not a trace")
    assert traces.main([str(tmp_path), "--top", "2"]) == 0
    out = capsys.readouterr().out
    first, second = out.split("\n\n")
    assert first.splitlines()[:4] == [
        "jax-lenet-epoch.json.gz: 6 events over 0.1 ms",  # 0-100 us, the envelope left out
        "  two or more processes busy at once: 0.1 ms (60% of the span)",
        "  host: busy 0.1 ms (100% of the span)",
        "    main: busy 0.1 ms (100% of the span), 4 events",
    ]
    assert "GPU 0: busy 0.1 ms (60% of the span)" in first
    assert [line.split()[-1] for line in first.splitlines()[4:6]] == ["step", "conv"]  # top 2
    assert "at once" not in second  # one process: nothing to share
    assert second.startswith("mxnet-lenet-epoch.json: 2 events over 0.0 ms")


@pytest.mark.parametrize(
    ("files", "message"),
    [
        (None, "no such folder; name a run's --profile folder"),
        ({}, "no traces (*.json, *.json.gz); run with --profile"),
        ({"t.json": '{"traceEvents": ['}, "t.json: not a readable Chrome trace"),
        ({"t.json.gz": "not gzip"}, "t.json.gz: not a readable Chrome trace"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, files, message):
    folder = tmp_path / "profile"
    if files is not None:
        folder.mkdir()
        for name, text in files.items():
            (folder / name).write_text(text)
    assert traces.main([str(folder)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and message in err[0], err


def test_a_reader_that_stops_early_gets_no_traceback(tmp_path):
    """`python -m common.traces DIR | head`: the pipe closes mid-print; exit 1, stderr empty."""
    events = [
        {"ph": "X", "name": f"op_{i}", "pid": 1, "tid": 7, "ts": i, "dur": 1} for i in range(4000)
    ]
    (tmp_path / "torch-lenet-epoch.json").write_text(json.dumps(events))
    command = [sys.executable, "-m", "common.traces", str(tmp_path), "--top", "4000"]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout.readline().startswith(b"torch-lenet-epoch.json: 4000 events")
    proc.stdout.close()  # more than a pipe's buffer is still to come
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 1 and err == "", err
