"""tools/conv_grads.py in torch: the probe behind the README's account of the CPU steps."""

from tests.fixtures import probe_checks
from tools import conv_grads
from torch_impl import lenet


def test_probe_writes_one_record(tmp_path):
    probe_checks.check_record("torch", tmp_path)


def test_probe_records_onednns_kernels(tmp_path):
    probe_checks.check_kernels("torch", tmp_path)


def test_frozen_pass_computes_every_gradient_but_the_conv_weights():
    probe_checks.check_frozen_pass(conv_grads.torch_passes("lenet", 8), lenet.SHAPES)


def test_compile_probes_the_model_as_training_compiles_it(monkeypatch):
    """--compile hands the ResNet-18 to the training's own compile_model (a flag the passes
    ignored would time eager torch under a compiled label)."""
    from torch_impl import devices

    compiled = []
    monkeypatch.setattr(devices, "compile_model", lambda net, device: compiled.append(net))
    conv_grads.torch_passes("resnet18", 2, compiled=True)
    assert len(compiled) == 1 and hasattr(compiled[0], "stem")  # the ResNet-18 itself


def test_compile_probes_lenet_as_training_compiles_it(monkeypatch):
    """--compile in lenet: the passes call lenet's forward as the training's compile_function
    returns it."""
    from torch_impl import devices

    asked, called = [], []

    def compile_function(fn, device):
        asked.append(fn)
        return (lambda *a: called.append(1) or fn(*a)), 1

    monkeypatch.setattr(devices, "compile_function", compile_function)
    passes, _ = conv_grads.torch_passes("lenet", 2, compiled=True)
    for run in passes.values():
        run()
    assert asked == [lenet.lenet] and len(called) == len(passes)
