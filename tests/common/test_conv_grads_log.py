"""tools/conv_grads.py --kernels without a framework: catching oneDNN's log of each call (C's
buffered stdout, fd 1) and reading its lines, as oneDNN 2 (MXNet) and 3 (torch) write them."""

import ctypes

import pytest

from tools import conv_grads

MXNET_LINE = (
    "dnnl_verbose,exec,cpu,convolution,x64:gemm:jit,forward_training,src_f32::blocked:abcd:f0 "
    "wei_f32::blocked:abcd:f0 bia_f32::blocked:a:f0 dst_f32::blocked:abcd:f0,,"
    "alg:convolution_direct,mb256_ic20oc50_ih13oh9kh5sh1dh0ph0_iw13ow9kw5sw1dw0pw0,22.5288"
)
TORCH_LINE = (
    "onednn_verbose,v1,primitive,exec,cpu,convolution,jit:avx2,backward_weights,"
    "src:f32:ap:blocked:aBcd8b::f0 wei:f32:ap:blocked:ABcd8b8a::f0 bia:f32:a:blocked:a::f0 "
    "dst:f32:ap:blocked:aBcd8b::f0,attr-scratchpad:user,alg:convolution_direct,"
    "mb256_ic20oc50_ih13oh9kh5sh1dh0ph0_iw13ow9kw5sw1dw0pw0,31.5"
)
OTHER_LINES = (  # what the log holds besides executions
    "onednn_verbose,v1,info,oneDNN v3.7.1 (commit 8d263e693366ef8db40acc569cc7d8edf644556d)",
    "dnnl_verbose,info,cpu,runtime:OpenMP,nthr:2",
    "onednn_verbose,v1,primitive,create:cache_miss,cpu,convolution,jit:avx2,forward_training,"
    "src:f32,,alg:convolution_direct,mb256_ic1oc20,0.3",
)


def test_a_kernel_is_named_by_primitive_implementation_pass_and_problem():
    text = "\n".join((*OTHER_LINES, MXNET_LINE, TORCH_LINE, TORCH_LINE))
    assert conv_grads.parse_kernels(text) == {
        "convolution x64:gemm:jit forward_training "
        "mb256_ic20oc50_ih13oh9kh5sh1dh0ph0_iw13ow9kw5sw1dw0pw0": 22.5288,
        "convolution jit:avx2 backward_weights "
        "mb256_ic20oc50_ih13oh9kh5sh1dh0ph0_iw13ow9kw5sw1dw0pw0": 63.0,  # two executions
    }


@pytest.fixture
def buffered_c_stdout():
    """C's stdout fully buffered, as where fd 1 is a pipe or a file (PYTHONUNBUFFERED would
    leave it unbuffered, and a missing flush unseen); unbuffered again after."""
    libc = ctypes.CDLL(None)
    stdout, buf = ctypes.c_void_p.in_dll(libc, "stdout"), ctypes.create_string_buffer(1 << 16)
    libc.fflush(None)
    # A buffer of our own: given none, glibc keeps an unbuffered stream's one byte.
    assert libc.setvbuf(stdout, buf, 0, len(buf)) == 0  # _IOFBF
    yield libc
    libc.fflush(None)
    libc.setvbuf(stdout, None, 2, 0)  # _IONBF, before `buf` is freed


def test_each_calls_log_is_caught_from_cs_buffered_stdout(buffered_c_stdout):
    """A step that logs as oneDNN does (C's printf, buffered): each call's line lands in its
    own call, the untimed first call's in none, and the record takes each kernel's median over
    the calls (0 in a call that lacked it)."""
    libc, calls = buffered_c_stdout, iter(range(10))

    def step():
        n = next(calls)
        libc.printf(f"{MXNET_LINE[: MXNET_LINE.rindex(',')]},{n}\n".encode())
        if n == 2:
            libc.printf(f"{TORCH_LINE}\n".encode())

    part = conv_grads.kernels(step, lambda out: out, repeats=3)  # calls 1, 2, 3 (0: untimed)
    assert part["kernels_ms"][0][1] == 2.0  # the median of 1, 2, 3 (largest first)
    assert part["kernels_ms"][1][1] == 0.0  # in one call of three: median 0
    assert part["onednn_ms"] == 3.0  # the medians of the calls' sums: 1, 33.5, 3
    assert part["wall_ms"] > 0 and part["pass"] == conv_grads.PASSES[1]


def test_a_step_that_logs_nothing_is_refused_in_one_line():
    with pytest.raises(ValueError, match="oneDNN logged no kernel"):
        conv_grads.kernels(lambda: None, lambda out: out, repeats=2)
