"""Model FLOPs per image from the layer shapes, and the dense peak of the devices records name.

What is counted: the convolutions and dense layers, at 2 FLOPs per multiply-add. What is left
out: bias adds, BatchNorm, ReLU, pooling, residual adds, the loss and the SGD update. Those are
O(activations) (a few FLOPs per activation, not one per kernel tap x input channel) and are
ignored, not counted separately; torch's FlopCounterMode draws the same line (convolution and
matmul ops only).

Zero padding: by default a convolution counts every kernel tap, those that land on the zero
padding too (the usual convention; torch's FlopCounterMode; the issue's reference figures).
`count_padding=False` counts only the taps inside the image, as XLA's HloCostAnalysis does
(`jax.jit(f).lower(...).cost_analysis()`), which makes XLA's figure for a padded network lower.

Training: 3 x forward per image. The backward of a convolution or dense layer is two products of
the forward's size (the gradient with respect to the input and to the weights). Frameworks skip
the first layer's input gradient (the images need none), so what they execute is that layer's
forward FLOPs less than 3 x forward: 5.4% of forward for LeNet, 0.1% for ResNet-18, 2.9% for
ResNet-50 at 224.

Peaks: dense (no structured sparsity) tensor-core TFLOP/s per device and dtype, matched by the
device name a record carries. CPUs and unknown devices have no peak (None).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

FLOPS_PER_MAC = 2
TRAIN_MULTIPLIER = 3  # forward + backward (2 x forward: gradients of inputs and of weights)

# The trainable parameters of each data-parallel workload's model: a step combines one float32
# gradient of this many values over the devices (each framework's suite checks its model's count).
PARAMETERS = {"lenet": 129_068, "resnet18": 11_175_818}
GRADIENT_BYTES_PER_VALUE = 4  # float32 gradients, also under bf16 autocast


def parameter_shapes(workload: str) -> dict[str, tuple[int, ...]]:
    """The trainable parameters of d2l's ResNet-18 (width 64), in the exchange format (OIHW
    convolutions, (out, in) dense weights) and in torch's `parameters()` order, which is also
    the order DDP buckets them in, reversed (each framework's suite checks its model)."""
    if workload != "resnet18":
        raise ValueError(f"no parameter list for {workload!r}; resnet18 has one")
    convs, c_in = [("stem.conv", 1, 64, 3, "stem.bn")], 64
    for i, c_out in enumerate((64, 128, 256, 512), start=1):
        for b in range(2):
            name = f"layer{i}.{b}"
            convs += [(f"{name}.conv1", c_in, c_out, 3, f"{name}.bn1")]
            convs += [(f"{name}.conv2", c_out, c_out, 3, f"{name}.bn2")]
            if b == 0 and i > 1:  # the 1x1 shortcut, without a BatchNorm of its own
                convs += [(f"{name}.shortcut", c_in, c_out, 1, None)]
            c_in = c_out
    shapes = {}
    for name, c_in, c_out, k, norm in convs:  # a conv's weight and bias, then its BatchNorm's
        shapes |= {f"{name}.weight": (c_out, c_in, k, k), f"{name}.bias": (c_out,)}
        if norm:
            shapes |= {f"{norm}.weight": (c_out,), f"{norm}.bias": (c_out,)}
    return {**shapes, "fc.weight": (10, 512), "fc.bias": (10,)}


def gradient_bytes(workload: str) -> int | None:
    """The bytes of one gradient of `workload`'s model (None: not a data-parallel workload)."""
    count = PARAMETERS.get(workload)
    return None if count is None else count * GRADIENT_BYTES_PER_VALUE


# torchvision's ResNet-50 bottleneck stages: (name, planes, blocks, stride of the first block).
# The frameworks' models and the pipeline's blocks (common.stages) are built from it too.
RESNET50_LAYERS = (
    ("layer1", 64, 3, 1),
    ("layer2", 128, 4, 2),
    ("layer3", 256, 6, 2),
    ("layer4", 512, 3, 2),
)


@dataclass(frozen=True)
class Layer:
    name: str
    flops: int  # forward FLOPs for one image


def conv_out(size: int, kernel: int, stride: int = 1, padding: int = 0) -> int:
    """Output height (or width) of a square convolution or pooling window."""
    return (size + 2 * padding - kernel) // stride + 1


def _taps(size, kernel, stride, padding, count_padding):
    """Kernel taps summed over the output positions of one spatial dimension."""
    out = conv_out(size, kernel, stride, padding)
    if count_padding:
        return out * kernel
    # Only the taps whose input position o * stride - padding + t lies inside [0, size).
    return sum(sum(0 <= o * stride - padding + t < size for t in range(kernel)) for o in range(out))


def conv2d(name, size, c_in, c_out, kernel, stride=1, padding=0, count_padding=True):
    """A square convolution on a size x size input: (its Layer, its output size)."""
    taps = _taps(size, kernel, stride, padding, count_padding)
    flops = FLOPS_PER_MAC * c_in * c_out * taps * taps  # the 2-D taps are a product of 1-D ones
    return Layer(name, flops), conv_out(size, kernel, stride, padding)


def dense(name: str, n_in: int, n_out: int) -> Layer:
    return Layer(name, FLOPS_PER_MAC * n_in * n_out)


def lenet_layers(image_size=28, count_padding=True):
    """d2l 13.5's LeNet (torch_impl/lenet.py): conv 1->20 3x3, avgpool 2, conv 20->50 5x5,
    avgpool 2, dense 800->128, dense 128->10; no padding, so count_padding changes nothing."""
    conv1, size = conv2d("conv1", image_size, 1, 20, 3, count_padding=count_padding)
    size = conv_out(size, 2, 2)  # avg-pool 2
    conv2, size = conv2d("conv2", size, 20, 50, 5, count_padding=count_padding)
    size = conv_out(size, 2, 2)
    return [conv1, conv2, dense("fc1", 50 * size * size, 128), dense("fc2", 128, 10)]


def resnet18_layers(width=64, image_size=28, in_channels=1, num_classes=10, count_padding=True):
    """d2l's ResNet-18 (torch_impl/resnet18.py): 3x3 stem at stride 1, no max-pool, 4 stages of
    2 basic blocks (3x3 convs, padding 1), a 1x1 strided shortcut conv where the shape changes,
    global average pool, dense."""
    stem, size = conv2d("stem.conv", image_size, in_channels, width, 3, 1, 1, count_padding)
    layers, c_in = [stem], width
    for i, mult in enumerate((1, 2, 4, 8), start=1):
        c_out, stride = width * mult, 1 if i == 1 else 2
        for b in range(2):
            s, name = (stride if b == 0 else 1), f"layer{i}.{b}"
            conv1, out = conv2d(f"{name}.conv1", size, c_in, c_out, 3, s, 1, count_padding)
            conv2, _ = conv2d(f"{name}.conv2", out, c_out, c_out, 3, 1, 1, count_padding)
            layers += [conv1, conv2]
            if b == 0 and i > 1:  # d2l's use_1x1conv: the first block of stages 2-4
                layers.append(conv2d(f"{name}.shortcut", size, c_in, c_out, 1, s)[0])
            size, c_in = out, c_out
    return [*layers, dense("fc", c_in, num_classes)]


def resnet50_layers(image_size=224, num_classes=1000, count_padding=True):
    """torchvision's ResNet-50: 7x7 stride-2 stem, 3x3 stride-2 max-pool, bottlenecks [3, 4, 6, 3]
    (1x1, 3x3 carrying the stride, 1x1 to 4 x planes; a 1x1 strided downsample conv in the first
    block of each stage), global average pool, dense 2048 -> num_classes."""
    stem, size = conv2d("conv1", image_size, 3, 64, 7, 2, 3, count_padding)
    size = conv_out(size, 3, 2, 1)  # max-pool
    layers, c_in = [stem], 64
    for stage, planes, blocks, stride in RESNET50_LAYERS:
        for b in range(blocks):
            s, name = (stride if b == 0 else 1), f"{stage}.{b}"
            conv1, _ = conv2d(f"{name}.conv1", size, c_in, planes, 1)
            conv2, out = conv2d(f"{name}.conv2", size, planes, planes, 3, s, 1, count_padding)
            conv3, _ = conv2d(f"{name}.conv3", out, planes, 4 * planes, 1)
            layers += [conv1, conv2, conv3]
            if b == 0:
                layers.append(conv2d(f"{name}.downsample", size, c_in, 4 * planes, 1, s)[0])
            size, c_in = out, 4 * planes
    return [*layers, dense("fc", c_in, num_classes)]


_WORKLOADS = {
    "lenet": lenet_layers,
    "resnet18": resnet18_layers,
    "resnet50": resnet50_layers,
    "zero": resnet18_layers,  # lesson 4 trains lesson 2's model
}


def layers(workload: str, **shape) -> list[Layer]:
    """The counted layers of `workload` in forward order; `shape` as the *_layers functions."""
    if workload not in _WORKLOADS:
        raise ValueError(f"no FLOP count for {workload!r}; known: {', '.join(_WORKLOADS)}")
    return _WORKLOADS[workload](**shape)


def forward_flops(workload: str, **shape) -> int:
    """Forward FLOPs for one image, e.g. forward_flops('resnet50', image_size=128)."""
    return sum(layer.flops for layer in layers(workload, **shape))


def train_flops_per_image(workload: str, **shape) -> int:
    """Training FLOPs for one image: 3 x forward (module docstring)."""
    return TRAIN_MULTIPLIER * forward_flops(workload, **shape)


def achieved_tflops(train_flops_per_image: float, images_per_sec: float) -> float:
    """TFLOP/s a run achieved: training FLOPs per image x images per second (all devices)."""
    return train_flops_per_image * images_per_sec / 1e12


# --- dense peaks ---------------------------------------------------------------------------
# TFLOP/s without structured sparsity. 'fp32': CUDA cores; 'tf32', 'bf16': tensor cores. NVIDIA
# quotes tensor-core figures "with sparsity"; dense is half (its datasheets' footnote). The
# documents below were read through copies that quote them; a figure no copy confirmed is left out.
_PEAKS = {
    # NVIDIA H100 Tensor Core GPU Architecture whitepaper v1.04, Table 3 (dense column).
    "H100 SXM": {"fp32": 66.9, "tf32": 494.7, "bf16": 989.4},
    "H100 PCIe": {"fp32": 51.2, "tf32": 378.0, "bf16": 756.0},
    # https://www.nvidia.com/en-us/data-center/h200/ (H200 SXM): FP32 67, TF32 989 and BF16
    # 1,979 with sparsity. H200 NVL (and H100 NVL, GH200): not confirmed, left out.
    "H200 SXM": {"fp32": 67.0, "tf32": 494.5, "bf16": 989.5},
    # NVIDIA A100 datasheet (nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf): one column for
    # 40 and 80 GB, PCIe and SXM: FP32 19.5, TF32 156 (312 sparse), BF16 312 (624 sparse).
    "A100 SXM": {"fp32": 19.5, "tf32": 156.0, "bf16": 312.0},
    "A100 PCIe": {"fp32": 19.5, "tf32": 156.0, "bf16": 312.0},
    # NVIDIA L4 datasheet (https://www.nvidia.com/en-us/data-center/l4/): FP32 30.3, TF32 120
    # and BF16 242 with sparsity.
    "L4": {"fp32": 30.3, "tf32": 60.0, "bf16": 121.0},
}

# Device names (torch.cuda.get_device_name, nvidia-smi; JAX records prefix 'gpu:0 ') to a row
# of _PEAKS, first match wins. None: a known part whose figures are not confirmed here, listed
# so that it cannot fall through to a sibling (H100 NVL is not an H100 SXM).
_PARTS = (
    (r"\bh100\b.*\bnvl\b", None),
    (r"\bh100\b.*\bpcie\b", "H100 PCIe"),
    (r"\bh100\b.*(\bsxm|\bhbm3\b)", "H100 SXM"),  # the SXM part reports 'NVIDIA H100 80GB HBM3'
    (r"\bh200\b.*\bnvl\b", None),
    (r"\bh200\b", "H200 SXM"),  # 'NVIDIA H200'; \b keeps GH200 (Grace Hopper) out
    (r"\ba100\b.*\bpcie\b", "A100 PCIe"),  # 'NVIDIA A100-PCIE-40GB', 'NVIDIA A100 80GB PCIe'
    (r"\ba100\b.*\bsxm", "A100 SXM"),  # 'NVIDIA A100-SXM4-80GB'
    (r"\bl4\b", "L4"),  # 'NVIDIA L4'; not L40 / L40S
)

_DTYPES = {
    "float32": "float32",
    "fp32": "float32",
    "tf32": "tf32",
    "bf16": "bf16",
    "bfloat16": "bf16",
}


def device_part(device_name: str) -> str | None:
    """The row of the peak table a device name matches, or None (CPU, unknown, unconfirmed)."""
    for pattern, part in _PARTS:
        if re.search(pattern, device_name.lower()):
            return part
    return None


def peak_tflops(device_name: str, dtype: str, tf32: bool = True) -> float | None:
    """Dense peak TFLOP/s of one device for `dtype` ('float32' or 'bf16'), None where unknown.

    'float32' means the TF32 tensor-core peak when `tf32` is true: torch runs float32
    convolutions in TF32 by default (cudnn.allow_tf32) and XLA's default precision does the same
    for convolutions and matmuls on GPUs that have TF32. Pass tf32=False where TF32 is disabled;
    the peak is then the CUDA cores' FP32. (torch's float32 matmuls default to full FP32; the
    dense layers are 0.15% of ResNet-50's FLOPs at 128, 0.001% of ResNet-18's, 4.6% of LeNet's.)"""
    if dtype not in _DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; choose one of {', '.join(_DTYPES)}")
    kind = _DTYPES[dtype]
    if kind == "float32":
        kind = "tf32" if tf32 else "fp32"
    part = device_part(device_name)
    return None if part is None else _PEAKS[part][kind]


def fraction_of_peak(
    achieved: float, device_names: str | Sequence[str], dtype: str, tf32: bool = True
) -> float | None:
    """`achieved` TFLOP/s over the summed dense peak of the run's devices; None when any device
    has no known peak (a CPU, say) or there are none."""
    names = [device_names] if isinstance(device_names, str) else list(device_names)
    peaks = [peak_tflops(name, dtype, tf32) for name in names]
    if not peaks or None in peaks:
        return None
    return achieved / sum(peaks)


# --- what a record carries -------------------------------------------------------------------
COUNTED = (
    "convolutions and dense layers at 2 FLOPs per multiply-add (common/flops.py); "
    "training = 3 x forward"
)


def shape_of(workload: str, cfg) -> dict:
    """The *_layers arguments of the model a workload's config trains (resnet18 at full width)."""
    if workload == "resnet50":
        return {"image_size": cfg.image_size, "num_classes": cfg.num_classes}
    return {"image_size": cfg.image_size} if workload in ("resnet18", "zero") else {}


def peak_names(device_names: Sequence[str], gpu_names: Sequence[str], count: int) -> list[str]:
    """The names to look a run's peak up by: its devices' own where they name a known part,
    else (torch's DDP ranks are `rank0:cuda`) nvidia-smi's, when every GPU is one model.
    `gpu_names` is empty for a run on CPU devices, which has no peak."""
    if device_names and all(device_part(n) for n in device_names):
        return list(device_names)
    models = set(gpu_names)
    if len(models) == 1 and device_part(next(iter(models))):
        return [next(iter(models))] * count
    return list(device_names)


def record_fields(workload, shape, images_per_sec, device_names, dtype) -> dict:
    """A record's `flops`: the model's FLOPs per image (forward, training), the TFLOP/s the run
    achieved, and the fraction of its devices' summed dense peak (None where any is unknown).
    `dtype` 'float32' is held to the TF32 peak (module docstring of peak_tflops)."""
    forward = forward_flops(workload, **shape)
    train = TRAIN_MULTIPLIER * forward
    ok = isinstance(images_per_sec, int | float) and math.isfinite(images_per_sec)
    achieved = achieved_tflops(train, images_per_sec) if ok else None
    peaks = [peak_tflops(name, dtype) for name in device_names]
    peak = None if not peaks or None in peaks else sum(peaks)
    return {
        "forward_per_image": forward,
        "train_per_image": train,
        "counted": COUNTED,
        "dtype": dtype,
        "achieved_tflops": achieved,
        "peak_tflops": peak,
        "peak_kind": None if peak is None else ("bf16" if dtype == "bf16" else "tf32"),
        "fraction_of_peak": None if peak is None or achieved is None else achieved / peak,
    }
