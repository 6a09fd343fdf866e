"""CTC loss on the CPU: every bad input is refused before any cuDNN call; the CTC descriptor is cached by value."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

import cudnnkit
from cudnnkit import lib
from cudnnkit.ops.ctc import MAX_LABEL_LENGTH, ctc_descriptor, ctc_loss

from .conftest import FakeCAI

T, N, A = 6, 2, 5
LAB, LL, IL = [1, 2, 3], [2, 1], [6, 4]


def x(shape=(T, N, A), typestr="<f4", device=0, strides=None):
    return FakeCAI(shape, typestr, strides=strides, device=device)


def outs(n=N, t=T, a=A):
    return {"costs_out": x((n,)), "grads_out": x((t, n, a))}


def call(xx=None, labels=LAB, ll=LL, il=IL, **kw):
    return ctc_loss(x() if xx is None else xx, labels, ll, il, **kw)


# Each case must fail on its own error: everything else in it is valid.
CASES = [
    # x
    (lambda: call(np.zeros((T, N, A), np.float32)), TypeError, "^x is a host array"),
    (lambda: call(x(typestr="<f8")), TypeError, "x has dtype float64; cuDNN's CTC loss supports float32 only"),
    (lambda: call(x(typestr="<f2")), TypeError, "x has dtype float16"),
    (lambda: call(x((T, N * A))), ValueError, r"x must have 3 dims \(T, N, A\), got shape \(6, 10\)"),
    (lambda: call(x((0, N, A))), ValueError, "at least one time step and one class"),
    # options
    (lambda: call(blank=1), ValueError, "blank=1: cuDNN's CTC loss always uses label 0 as the blank"),
    (lambda: call(blank=A - 1), ValueError, "move the blank class to index 0"),
    (lambda: call(blank=0.0), TypeError, "blank must be an int"),
    (lambda: call(blank=False), TypeError, "blank must be an int"),
    (lambda: call(normalization="log_softmax"), ValueError, r"normalization must be one of \['none', 'softmax'\]"),
    (lambda: call(algo="fast"), ValueError, r"algo must be one of \['deterministic', 'non_deterministic'\]"),
    (lambda: call(oob_grads="nan"), ValueError, r"oob_grads must be one of \['skip', 'zero'\]"),
    # batch size agreement
    (lambda: call(ll=[2, 1, 0]), ValueError, "label_lengths has 3 values but x has a batch of N=2"),
    (lambda: call(il=[6]), ValueError, "input_lengths has 1 values but x has a batch of N=2"),
    # label lengths
    (
        lambda: call(
            ll=[
                3,
                -1,
            ]
        ),
        ValueError,
        r"label_lengths\[1\] is -1; cuDNN's CTC loss needs at least one label",
    ),
    (
        lambda: call(x((300, N, A)), labels=[1] * 257, ll=[256, 1], il=[300, 4]),
        ValueError,
        r"label_lengths\[0\] is 256; cuDNN's CTC loss supports labels of at most 255",
    ),
    # input lengths
    (lambda: call(il=[6, 0]), ValueError, r"input_lengths\[1\] is 0; input lengths must be in \[1, T=6\]"),
    (lambda: call(il=[7, 4]), ValueError, r"input_lengths\[0\] is 7; input lengths must be in \[1, T=6\]"),
    (
        lambda: call(labels=[1, 2, 3, 4], ll=[1, 3], il=[6, 2]),
        ValueError,
        r"label_lengths\[1\] is 3 but input_lengths\[1\] is 2; a label cannot be longer than its input",
    ),
    # labels
    (lambda: call(labels=[1, 2]), ValueError, r"labels has 2 values but sum\(label_lengths\) is 3"),
    (lambda: call(labels=[1, 0, 3]), ValueError, r"labels\[1\] is 0, the blank; labels must be in \[1, A=5\)"),
    (lambda: call(labels=[1, 2, 5]), ValueError, r"labels\[2\] is 5; labels must be in \[1, A=5\)"),
    (lambda: call(labels=[1, -2, 3]), ValueError, r"labels\[1\] is -2"),
    (lambda: call(labels=np.array([1.0, 2.0, 3.0])), TypeError, "labels must hold integers, got dtype float64"),
    (lambda: call(labels=np.array([True, True, True])), TypeError, "labels must hold integers, got dtype bool"),
    (lambda: call(labels=np.array([[1, 2, 3]])), ValueError, "labels has 1 rows .* but x has a batch of N=2"),
    # (N, S) padded labels pass every check (row 1's 4 is padding): what stops this call is the missing adapter
    (lambda: call(labels=np.array([[1, 2], [3, 4]]), **outs()), TypeError, "host labels and lengths cannot be copied"),
    (
        lambda: call(labels=np.array([[1, 2], [0, 4]]), ll=[2, 3]),
        ValueError,
        r"label_lengths\[1\] is 3 but labels "
        r"\(2-d, padded\) has rows of S=2",
    ),  # fmt: skip
    (lambda: call(labels=np.array([[1, 0], [0, 4]]), ll=[1, 2]), ValueError, r"labels\[1\] is 0, the blank"),
    (lambda: call(labels=np.array([[[1, 2, 3]]])), ValueError, r"labels must be 1-d or 2-d, got shape \(1, 1, 3\)"),
    (lambda: call(ll=5), ValueError, r"label_lengths must be 1-d, got shape \(\)"),
    (lambda: call(labels=["a", "b", "c"]), TypeError, "labels must hold integers"),
    # device index arrays
    (
        lambda: call(labels=x((3,), "<f4")),
        TypeError,
        "labels is a device array of dtype float32; it must hold integers",
    ),
    (lambda: call(labels=x((1, 1, 3), "<i4")), ValueError, r"labels must be 1-d or 2-d, got shape \(1, 1, 3\)"),
    (
        lambda: call(labels=x((3,), "<i4")),
        TypeError,
        "labels is a device array of a library without a cudnnkit adapter.*pass labels as a host array",
    ),
    (lambda: call(il=x((2,), "<i4")), TypeError, "input_lengths is a device array of a library without"),
    (lambda: call(labels=x((3,), "<i4", device=1)), ValueError, "labels is on cuda:1 but x is on cuda:0"),
    (lambda: call(ll=x((2,), "<i4", device=1)), ValueError, "label_lengths is on cuda:1 but x is on cuda:0"),
    # outputs
    (lambda: call(), TypeError, "without a cudnnkit adapter.*or pass costs_out= yourself"),
    (lambda: call(costs_out=x((N,))), TypeError, "without a cudnnkit adapter.*or pass grads_out= yourself"),
    (lambda: call(costs_out=x((N + 1,)), grads_out=x()), ValueError, r"costs_out must have shape \(2,\) and dtype"),
    (lambda: call(costs_out=x((N,), "<f8"), grads_out=x()), ValueError, "costs_out must have shape .* float32"),
    (
        lambda: call(costs_out=x((N,)), grads_out=x((T, N, A + 1))),
        ValueError,
        r"grads_out must have shape \(6, 2, 5\) and dtype float32",
    ),
    (lambda: call(costs_out=x((N,)), grads_out=x(device=1)), ValueError, "grads_out is on cuda:1 but the inputs"),
    (lambda: call(costs_out=x((N,), strides=(8,)), grads_out=x()), ValueError, "costs_out must be contiguous"),
    (
        lambda: call(costs_out=x((N,)), grads_out=x(strides=(4, 24, 48))),
        ValueError,
        r"grads_out must be C-contiguous \(T, N, A\)",
    ),
    # what is left needs an array library to copy with
    (
        lambda: call(x(strides=(20, 120, 4)), **outs()),
        ValueError,
        "x is not C-contiguous .* and its library has no cudnnkit adapter",
    ),
    (lambda: call(**outs()), TypeError, "host labels and lengths cannot be copied to the device"),
    # empty batch
    (
        lambda: call(x((T, 0, A)), labels=[1], ll=[], il=[], **outs(n=0)),
        ValueError,
        "labels has 1 values but the batch is empty",
    ),
]


@pytest.mark.parametrize("fn, exc, msg", CASES)
def test_bad_input_is_refused_before_cudnn(fn, exc, msg):
    with pytest.raises(exc, match=msg):
        fn()


def test_non_deterministic_is_refused_under_deterministic_settings():
    with cudnnkit.settings(deterministic=True):
        with pytest.raises(ValueError, match="algo='non_deterministic' is not allowed under"):
            call(algo="non_deterministic", **outs())
        with pytest.raises(TypeError, match="cannot be copied"):  # the deterministic algo passes validation
            call(**outs())


def test_valid_input_passes_validation():
    """Inputs that are valid (a sample that no alignment fits included: cuDNN reports it as an
    infinite cost, it is not an error) reach the last step: here, the missing array library."""
    cases = [
        (T, dict()),  # lists
        (T, dict(labels=np.array(LAB, np.int64), ll=np.array(LL, np.uint8), il=(6, 4))),
        (T, dict(labels=[1, 1, 2], ll=[2, 1], il=[2, 1])),  # "1 1" needs 3 steps but has 2: infeasible, allowed
        (300, dict(labels=[1] * 256, ll=[MAX_LABEL_LENGTH, 1], il=[300, 4])),  # the longest label cuDNN takes
    ]
    for t, kw in cases:
        with pytest.raises(TypeError, match="host labels and lengths cannot be copied"):
            call(x((t, N, A)), **kw, **outs(t=t))


def test_empty_labels_are_refused():
    # cuDNN 9.19 returns a cost of 0 for an empty label (measured on an H200), not -log p(all blanks)
    with pytest.raises(ValueError, match=r"label_lengths\[0\] is 0; cuDNN's CTC loss needs at least one label"):
        call(labels=[2, 3], ll=[0, 2], il=[5, 6], **outs())


def test_host_torch_tensors_are_host_arrays():
    torch = pytest.importorskip("torch")
    with pytest.raises(ValueError, match=r"labels\[1\] is 0, the blank"):
        call(labels=torch.tensor([1, 0, 3]), ll=torch.tensor(LL, dtype=torch.int32), **outs())
    with pytest.raises(TypeError, match="^x is a torch tensor on cpu"):
        call(torch.zeros(T, N, A))


def test_device_or_host_is_decided_by_the_adapters(monkeypatch):
    """ctc.py knows no array library: which of labels/lengths are device arrays, adapters.is_device_array says."""
    import inspect

    from cudnnkit.ops import ctc
    from cudnnkit.runtime import adapters

    source = inspect.getsource(ctc)
    for framework_test in ("is_cuda", "__dlpack_device__", "kDLCPU", "import torch", "import cupy"):
        assert framework_test not in source, framework_test
    asked = []
    real = adapters.is_device_array
    monkeypatch.setattr(adapters, "is_device_array", lambda obj: asked.append(obj) or real(obj))
    labels, ll, il = np.array(LAB), list(LL), x((N,), "<i4")
    with pytest.raises(TypeError, match="^input_lengths is a device array"):  # the device one reached prepare
        call(labels=labels, ll=ll, il=il, **outs())
    assert asked[:3] == [labels, ll, il]


def test_empty_batch_returns_the_outputs_without_cudnn():
    o = outs(n=0)
    costs, grads = call(x((T, 0, A)), labels=[], ll=[], il=[], **o)
    assert costs is o["costs_out"] and grads is o["grads_out"]


def test_ctc_descriptor_is_cached_by_value_and_set_with_v9():
    d = ctc_descriptor("softmax", "zero", 17)
    assert ctc_descriptor("softmax", "zero", 17) is d
    assert ctc_descriptor("none", "zero", 17) is not d
    assert ctc_descriptor("softmax", "skip", 17) is not d
    assert ctc_descriptor("softmax", "zero", 18) is not d
    for norm, oob, m in (("softmax", "zero", 17), ("none", "skip", 255)):
        comp, nm, gm, ml = (ctypes.c_int() for _ in range(4))
        lib.cudnnGetCTCLossDescriptor_v9(
            ctc_descriptor(norm, oob, m), ctypes.byref(comp), ctypes.byref(nm), ctypes.byref(gm), ctypes.byref(ml)
        )
        assert comp.value == lib.CUDNN_DATA_FLOAT
        assert (
            nm.value
            == {"softmax": lib.CUDNN_LOSS_NORMALIZATION_SOFTMAX, "none": lib.CUDNN_LOSS_NORMALIZATION_NONE}[norm]
        )
        assert gm.value == {"zero": lib.CUDNN_CTC_ZERO_OOB_GRADIENTS, "skip": lib.CUDNN_CTC_SKIP_OOB_GRADIENTS}[oob]
        assert ml.value == m


def test_infeasible_samples_are_logged_at_debug_level(caplog):
    # sample 1: "2 2 3" needs 4 steps (3 labels + 1 repeat) but has 3; sample 0 fits exactly ("1 1": 3 steps)
    with caplog.at_level("DEBUG", logger="cudnnkit"), pytest.raises(TypeError, match="cannot be copied"):
        call(labels=[1, 1, 2, 2, 3], ll=[2, 3], il=[3, 3], **outs())
    assert "samples [1] have fewer input steps than label length + repeats" in caplog.text
