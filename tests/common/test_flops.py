"""common.flops: hand counts, the issue's reference figures, the peak table and its lookups."""

from types import SimpleNamespace

import pytest

from common import flops, stages


def test_single_conv_by_hand():
    # 5x5 input, 3x3 kernel, 2 -> 4 channels, no padding: 3x3 outputs, each 3*3*2 multiply-adds
    # per output channel: 9 * 4 * 18 = 648 MACs = 1296 FLOPs.
    layer, out = flops.conv2d("c", 5, 2, 4, 3)
    assert (layer.flops, out) == (1296, 3)
    # padding 1: 5x5 outputs, every tap counted: 25 * 4 * 18 = 1800 MACs = 3600 FLOPs.
    layer, out = flops.conv2d("c", 5, 2, 4, 3, padding=1)
    assert (layer.flops, out) == (3600, 5)
    # Only taps inside the image: along one axis the 5 outputs see 2, 3, 3, 3, 2 = 13 input rows
    # (the edge outputs lose one to the padding), so 13 * 13 = 169 of the 225 tap positions:
    # 169 * 4 * 2 = 1352 MACs = 2704 FLOPs.
    assert flops.conv2d("c", 5, 2, 4, 3, padding=1, count_padding=False)[0].flops == 2704


def test_strided_conv_and_dense_by_hand():
    # 7x7 input, 3x3 stride 2 padding 1: (7 + 2 - 3) // 2 + 1 = 4 outputs a side;
    # 16 outputs * 9 taps * 3 in * 8 out = 3456 MACs = 6912 FLOPs.
    layer, out = flops.conv2d("c", 7, 3, 8, 3, stride=2, padding=1)
    assert (layer.flops, out) == (6912, 4)
    # inside the image, per axis: outputs at rows -1..1, 1..3, 3..5, 5..7 see 2 + 3 + 3 + 2 = 10
    assert flops.conv2d("c", 7, 3, 8, 3, 2, 1, count_padding=False)[0].flops == 10 * 10 * 24 * 2
    assert flops.dense("d", 800, 128).flops == 2 * 800 * 128


def test_lenet_by_hand():
    # conv1 1->20 3x3 on 28x28: 26x26 outputs * 20 * 9 = 121,680 MACs; avg-pool 2 -> 13x13
    # conv2 20->50 5x5: 9x9 outputs * 50 * 20 * 25 = 2,025,000 MACs; avg-pool 2 -> 4x4 (floor)
    # fc1 50*4*4 = 800 -> 128: 102,400 MACs; fc2 128 -> 10: 1,280 MACs
    macs = {"conv1": 121_680, "conv2": 2_025_000, "fc1": 102_400, "fc2": 1_280}
    layers = flops.layers("lenet")
    assert {layer.name: layer.flops for layer in layers} == {k: 2 * v for k, v in macs.items()}
    assert flops.forward_flops("lenet") == 4_500_720
    # no padding anywhere in LeNet
    assert flops.forward_flops("lenet", count_padding=False) == 4_500_720


def test_resnet18_layers_by_hand():
    layers = {layer.name: layer.flops for layer in flops.layers("resnet18")}
    # stem + 4 stages x 2 blocks x 2 convs + 3 shortcut convs (stages 2-4) + fc
    assert len(layers) == 1 + 16 + 3 + 1
    assert layers["stem.conv"] == 2 * 28 * 28 * 64 * 9  # 1 channel in
    # layer4.0 takes 7x7 to (7 + 2 - 3) // 2 + 1 = 4x4, 256 -> 512 channels
    assert layers["layer4.0.conv1"] == 2 * 4 * 4 * 512 * 256 * 9
    assert layers["layer4.0.shortcut"] == 2 * 4 * 4 * 512 * 256  # 1x1, (7 - 1) // 2 + 1 = 4
    assert layers["fc"] == 2 * 512 * 10


def test_issue_reference_figures():
    # the targets' figures: ResNet-18 on 28x28 0.912 GFLOP forward, 164 TFLOP per training epoch
    # of 60,000 images; LeNet 4.5 MFLOP; ResNet-50 at 128x128 2.67 GFLOP (as rounded there)
    assert round(flops.forward_flops("resnet18") / 1e9, 3) == 0.912
    assert round(60_000 * flops.train_flops_per_image("resnet18") / 1e12) == 164
    assert round(flops.forward_flops("lenet") / 1e6, 1) == 4.5
    assert round(flops.forward_flops("resnet50", image_size=128) / 1e9, 2) == 2.67


def test_issue_compute_floor():
    # the GPU target: "The compute floor is 0.33 s/epoch at TF32 and 0.17 s at bf16" on an H100 SXM
    epoch = 60_000 * flops.train_flops_per_image("resnet18")
    h100 = "NVIDIA H100 80GB HBM3"
    assert round(epoch / (flops.peak_tflops(h100, "float32") * 1e12), 2) == 0.33
    assert round(epoch / (flops.peak_tflops(h100, "bf16") * 1e12), 2) == 0.17
    # an epoch in exactly that time runs at the peak
    floor = epoch / (flops.peak_tflops(h100, "bf16") * 1e12)
    achieved = flops.achieved_tflops(flops.train_flops_per_image("resnet18"), 60_000 / floor)
    assert flops.fraction_of_peak(achieved, h100, "bf16") == pytest.approx(1.0)


@pytest.mark.parametrize("image_size", [64, 128, 224])
def test_resnet50_blocks_hold_every_layer_once(image_size):
    # the pipeline's blocks (common.stages) group the counter's layers: every layer in one block
    per_block = stages.block_flops(image_size)
    assert len(per_block) == len(stages.BLOCKS) and min(per_block) > 0
    assert sum(per_block) == flops.forward_flops("resnet50", image_size=image_size)


def test_resnet18_width_and_padding():
    # the 3x3 convs scale with width^2; stem (1 channel in) and fc (10 out) with width
    narrow, full = flops.forward_flops("resnet18", width=8), flops.forward_flops("resnet18")
    assert narrow < full / 50
    # XLA's convention counts fewer taps for padded convs, never more
    assert flops.forward_flops("resnet18", count_padding=False) < full


def test_train_is_three_forward_and_achieved_tflops():
    assert flops.train_flops_per_image("lenet") == 3 * 4_500_720
    assert flops.achieved_tflops(2e9, 1000.0) == pytest.approx(2.0)
    with pytest.raises(ValueError, match="resnet34"):
        flops.forward_flops("resnet34")


@pytest.mark.parametrize(
    "name, part",
    [
        ("NVIDIA H100 80GB HBM3", "H100 SXM"),  # torch.cuda.get_device_name on the SXM part
        ("gpu:0 NVIDIA H100 80GB HBM3", "H100 SXM"),  # JAX records: platform:id device_kind
        ("NVIDIA H100 PCIe", "H100 PCIe"),
        ("NVIDIA H200", "H200 SXM"),
        ("NVIDIA A100-SXM4-80GB", "A100 SXM"),
        ("NVIDIA A100-SXM4-40GB", "A100 SXM"),
        ("NVIDIA A100-PCIE-40GB", "A100 PCIe"),
        ("NVIDIA A100 80GB PCIe", "A100 PCIe"),
        ("NVIDIA L4", "L4"),
        # no peak: not a GPU, no model in the name, or figures not confirmed here
        ("cpu", None),
        ("cpu:0 cpu", None),
        ("gpu(0)", None),  # MXNet's context: the model is in the record's hardware.gpus
        ("rank0:cuda", None),
        ("NVIDIA H100 NVL", None),
        ("NVIDIA H200 NVL", None),
        ("NVIDIA GH200 480GB", None),
        ("NVIDIA H20", None),
        ("NVIDIA L40S", None),
        ("Tesla V100-SXM2-16GB", None),
    ],
)
def test_device_part(name, part):
    assert flops.device_part(name) == part


def test_peaks_by_name_and_dtype():
    h100 = "NVIDIA H100 80GB HBM3"
    # the GPU target's peaks: H100 SXM TF32 495, bf16 989 dense
    assert round(flops.peak_tflops(h100, "float32")) == 495
    assert round(flops.peak_tflops(h100, "bf16")) == 989
    assert flops.peak_tflops(h100, "bfloat16") == flops.peak_tflops(h100, "bf16")
    assert flops.peak_tflops(h100, "float32", tf32=False) == pytest.approx(66.9)
    assert flops.peak_tflops("NVIDIA A100-SXM4-80GB", "float32") == 156.0
    assert flops.peak_tflops("cpu", "float32") is None
    assert flops.peak_tflops("NVIDIA H100 NVL", "bf16") is None
    with pytest.raises(ValueError, match="float16"):
        flops.peak_tflops(h100, "float16")


def test_peak_table_is_consistent():
    # On Ampere, Hopper and Ada dense BF16 runs at twice TF32; the vendors' rounded figures
    # agree to 1%. A typo in the table would not.
    for part, peak in flops._PEAKS.items():
        assert peak["bf16"] == pytest.approx(2 * peak["tf32"], rel=0.01), part
        assert peak["fp32"] < peak["tf32"], part


def test_fraction_of_peak():
    h100 = "NVIDIA H100 80GB HBM3"
    one = flops.peak_tflops(h100, "bf16")
    assert flops.fraction_of_peak(one / 2, h100, "bf16") == pytest.approx(0.5)
    assert flops.fraction_of_peak(one, [h100, h100], "bf16") == pytest.approx(0.5)
    assert flops.fraction_of_peak(1.0, ["cpu"], "float32") is None
    assert flops.fraction_of_peak(1.0, [h100, "cpu"], "float32") is None
    assert flops.fraction_of_peak(1.0, [], "float32") is None


def test_record_fields_of_a_gpu_run_and_a_cpu_run():
    h100 = "NVIDIA H100 80GB HBM3"
    shape = flops.shape_of("resnet18", SimpleNamespace(image_size=28))
    # ResNet-18 on 28x28, 1,000 images/s: 3 x 0.9116 GFLOP x 1000 = 2.735 TFLOP/s
    f = flops.record_fields("resnet18", shape, 1000.0, [h100], "float32")
    assert f["forward_per_image"] == flops.forward_flops("resnet18")
    assert f["train_per_image"] == 3 * f["forward_per_image"]
    assert f["achieved_tflops"] == pytest.approx(2.7348, abs=1e-4)
    assert f["peak_tflops"] == flops.peak_tflops(h100, "float32") and f["peak_kind"] == "tf32"
    assert f["fraction_of_peak"] == pytest.approx(f["achieved_tflops"] / 494.7)
    assert "training = 3 x forward" in f["counted"]
    two = flops.record_fields("resnet18", shape, 1000.0, [h100, h100], "bf16")
    assert two["peak_tflops"] == 2 * flops.peak_tflops(h100, "bf16") and two["peak_kind"] == "bf16"
    cpu = flops.record_fields("lenet", {}, 1000.0, ["cpu", "cpu"], "float32")
    assert cpu["achieved_tflops"] == pytest.approx(3 * 4.5e6 * 1000 / 1e12, rel=0.01)
    assert cpu["peak_tflops"] is cpu["fraction_of_peak"] is cpu["peak_kind"] is None
    nan = flops.record_fields("lenet", {}, float("nan"), ["cpu"], "float32")
    assert nan["achieved_tflops"] is None and nan["fraction_of_peak"] is None


def test_shape_of_each_workload_config():
    assert flops.shape_of("lenet", SimpleNamespace()) == {}
    r50 = SimpleNamespace(image_size=128, num_classes=1000)
    assert flops.shape_of("resnet50", r50) == {"image_size": 128, "num_classes": 1000}
    # the issue's ResNet-50 at 128x128: 2.67 GFLOP forward
    assert flops.forward_flops("resnet50", **flops.shape_of("resnet50", r50)) / 1e9 == (
        pytest.approx(2.67, abs=0.005)
    )


def test_peak_names_fall_back_to_nvidia_smi_only_for_one_known_model():
    h100, a100 = "NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB"
    assert flops.peak_names([h100], [h100, h100], 1) == [h100]  # the devices' own names
    # torch's DDP ranks say `rank0:cuda`: nvidia-smi's name, once per device of the run
    assert flops.peak_names(["rank0:cuda", "rank1:cuda"], [h100] * 8, 2) == [h100, h100]
    assert flops.peak_names(["rank0:cuda"], [h100, a100], 1) == ["rank0:cuda"]  # mixed: no peak
    assert flops.peak_names(["cpu"], [], 1) == ["cpu"]  # a CPU run: no GPU names given
