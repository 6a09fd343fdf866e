"""Issue 10 regression tests for the L2 ops, on the CPU: what cuDNN is handed, and what is refused before any GPU work.

Each test is named after the class of defect it guards (W = silently wrong result, U = unclear error; the numbers
are the issue's). The ops run here on a fake array library ("fake", with an adapter that records allocations and
copies and never touches memory) with the cuDNN compute calls replaced by recorders, so a test sees exactly which
descriptors and pointers each call gets: that every tensor of a softmax/LRN/dropout call shares one layout (W1, W2,
U2), which copies and temporaries that takes, and which inputs are refused by name. The GPU tier
(``tests/gpu/test_reliability_ops_gpu.py``) checks the numbers.
"""

from __future__ import annotations

import ctypes
import logging
import math

import numpy as np
import pytest

from cudnnkit import lib, ops
from cudnnkit.lib.errors import NotSupportedError
from cudnnkit.ops._layout import merge
from cudnnkit.runtime import adapters
from cudnnkit.runtime.arrays import _from_cai, contiguous_strides
from cudnnkit.runtime.launch import Launch

from .conftest import FakeCAI

_TYPESTR = {"float16": "<f2", "float32": "<f4", "float64": "<f8", "uint8": "|u1", "int32": "<i4"}
_ITEMSIZE = {"<f2": 2, "<f4": 4, "<f8": 8, "|u1": 1, "<i4": 4}


class Arr(FakeCAI):
    """A device array of the fake library; ``strides`` in elements (None: C order)."""

    def __init__(self, shape, typestr="<f4", strides=None, ptr=None):
        isz = _ITEMSIZE[typestr]
        super().__init__(
            tuple(shape),
            typestr,
            None if strides is None else tuple(s * isz for s in strides),
            ptr=ptr if ptr is not None else Fake.next_ptr(),
        )

    @property
    def strides(self):
        isz = _ITEMSIZE[self.__cuda_array_interface__["typestr"]]
        s = self.__cuda_array_interface__["strides"]
        return contiguous_strides(self.shape) if s is None else tuple(b // isz for b in s)

    @property
    def shape(self):
        return self.__cuda_array_interface__["shape"]

    @property
    def ptr(self):
        return self.__cuda_array_interface__["data"][0]


class Fake:
    """The fake library's adapter: records every allocation (``allocs``), copy (``copies``: (src, dst)) and upload."""

    name = "fake"
    _ptr = 0x7E0000000000

    @classmethod
    def next_ptr(cls) -> int:
        cls._ptr += 0x100000
        return cls._ptr

    def __init__(self):
        self.allocs, self.copies, self.uploads = [], [], []

    def view(self, obj, name):
        v = _from_cai(obj, name)
        v.adapter = self
        return v

    def current_device(self):
        return 0

    def current_stream(self, device):
        return 0

    def device_guard(self, device):
        raise AssertionError("only device 0 here")

    def empty(self, shape, dtype, device, strides=None, stream=None):
        a = Arr(shape, _TYPESTR[dtype], strides)
        self.allocs.append(a)
        return a

    def contiguous(self, arr, stream=None):
        if self.view(arr, "arr").is_contiguous():
            return arr
        new = Arr(arr.shape, arr.__cuda_array_interface__["typestr"])
        self.copies.append((arr, new))
        return new

    def copy(self, dst, src, stream=None):
        assert tuple(dst.shape) == tuple(src.shape)
        self.copies.append((src, dst))

    def wrap(self, obj, device):
        return obj

    def from_numpy(self, a, device, stream=None):
        a = np.asarray(a)
        self.uploads.append(a.copy())
        return Arr(a.shape, _TYPESTR[a.dtype.name])


class Recorder:
    """Stands in for one cuDNN function: records its arguments, touches nothing."""

    def __init__(self, effect=None):
        self.calls, self.effect = [], effect

    def __call__(self, *args):
        self.calls.append(args)
        if self.effect is not None:
            self.effect(*args)


_COMPUTE = (
    "cudnnSoftmaxForward",
    "cudnnSoftmaxBackward",
    "cudnnLRNCrossChannelForward",
    "cudnnLRNCrossChannelBackward",
    "cudnnDivisiveNormalizationForward",
    "cudnnDivisiveNormalizationBackward",
    "cudnnDropoutForward",
    "cudnnDropoutBackward",
    "cudnnSetDropoutDescriptor",
    "cudnnRestoreDropoutDescriptor",
    "cudnnSetTensor",
    "cudnnScaleTensor",
    "cudnnAddTensor",
    "cudnnTransformTensor",
    "cudnnTransformTensorEx",
    "cudnnSpatialTfSamplerForward",
)


@pytest.fixture
def fake(monkeypatch):
    """(adapter, recorders): the fake library in place and cuDNN's compute calls recorded; the handle a sentinel."""
    ad = Fake()
    real = adapters.for_object
    monkeypatch.setattr(adapters, "for_object", lambda obj: ad if isinstance(obj, Arr) else real(obj))
    recs = {name: Recorder() for name in _COMPUTE}

    def states_size(handle, size):
        size._obj.value = 256

    recs["cudnnDropoutGetStatesSize"] = Recorder(states_size)
    for name, rec in recs.items():
        monkeypatch.setattr(lib, name, rec, raising=False)
    monkeypatch.setattr(Launch, "handle", property(lambda self: "HANDLE"))
    from cudnnkit.ops import dropout

    monkeypatch.setattr(dropout, "_defaults", {})
    return ad, recs


def key(desc):
    """(shape, strides) of a cached tensor descriptor."""
    return desc.key[2], desc.key[3]


def ptr(a):
    return a.__cuda_array_interface__["data"][0]


def copied_from(ad, src):
    """The arrays ``src`` was copied into."""
    return [d for s, d in ad.copies if s is src]


# ----------------------------------------------------------------- W1, W2, U2: softmax, one layout per call


def test_W1_log_softmax_gapped_strides_gets_one_layout(fake, caplog):
    """x = full[:, ::3] (strides (9, 3)) was described with its gaps and y C-contiguous: cuDNN's LOG mode computed
    wrong values. Now x is copied to C order first, and x and y share one descriptor."""
    ad, rec = fake
    caplog.set_level(logging.DEBUG, logger="cudnnkit")
    x = Arr((3, 3), strides=(9, 3))
    y = ops.softmax_forward(x, log=True)
    ((args),) = rec["cudnnSoftmaxForward"].calls
    (xc,) = copied_from(ad, x)
    assert args[4] is args[7] and key(args[4]) == ((3, 3, 1, 1), (3, 1, 1, 1))  # one descriptor, C order
    assert args[5] == ptr(xc) and args[8] == ptr(y) and y.strides == (3, 1)
    assert "x must be laid out as (3, 1) for cuDNN" in caplog.text and "copying" in caplog.text


def test_W2_softmax_out_in_another_layout_goes_through_a_temporary(fake):
    """out = empty(5, 3).t() with a C-order x (3, 5) was handed to cuDNN as is: wrong values. Now cuDNN writes a
    temporary laid out like x, which is then copied into out (out's contents copied in first when beta != 0)."""
    ad, rec = fake
    x = Arr((3, 5), "<f8")
    out = Arr((3, 5), "<f8", strides=(1, 3))
    assert ops.softmax_forward(x, out=out) is out
    ((args),) = rec["cudnnSoftmaxForward"].calls
    (tmp,) = ad.allocs
    assert args[4] is args[7] and key(args[4]) == ((3, 5, 1, 1), (5, 1, 1, 1))
    assert args[5] == ptr(x) and args[8] == ptr(tmp) != ptr(out)
    assert ad.copies == [(tmp, out)]  # written back after the call
    # with beta != 0 a temporary would cost two copies (out in, then back): x is copied into out's layout instead
    ad.copies.clear()
    ad.allocs.clear()
    ops.softmax_forward(x, out=out, beta=0.5)
    (xc,) = ad.allocs
    args = rec["cudnnSoftmaxForward"].calls[-1]
    assert ad.copies == [(x, xc)] and xc.strides == (1, 3)
    assert args[4] is args[7] and key(args[4]) == ((3, 5, 1, 1), (1, 3, 1, 1)) and args[8] == ptr(out)
    # two outputs' worth: a gapped x and a transposed out with beta: C-order copy of x, temporary for out
    ad.copies.clear()
    ad.allocs.clear()
    x3, out3 = Arr((3, 5), "<f8", strides=(10, 2)), Arr((3, 5), "<f8", strides=(1, 3))
    ops.softmax_forward(x3, out=out3, beta=0.5)  # a gapped x and a transposed out: x into out's layout, one copy
    (xc,) = ad.allocs
    assert ad.copies == [(x3, xc)] and xc.strides == (1, 3) and rec["cudnnSoftmaxForward"].calls[-1][8] == ptr(out3)


def test_W2_softmax_gapped_out_slice_and_gapped_x(fake):
    """cuDNN's softmax is only given dense tensors: a gapped x is copied to C order, and a gapped out (a slice of
    a bigger buffer) is written through a C-order temporary, even when the two have the same strides."""
    ad, rec = fake
    x = Arr((4, 3), strides=(6, 2))
    out = Arr((4, 3), strides=(6, 2))
    assert ops.softmax_forward(x, out=out, log=True) is out
    ((args),) = rec["cudnnSoftmaxForward"].calls
    ((src, xc), (tmp, dst)) = ad.copies
    assert src is x and dst is out and ad.allocs == [tmp]
    assert args[4] is args[7] and key(args[4]) == ((4, 3, 1, 1), (3, 1, 1, 1))
    assert (args[5], args[8]) == (ptr(xc), ptr(tmp))


def test_W2_softmax_fast_path_makes_no_copy(fake):
    """A dense x (C order or channels-last) with the default out: y is allocated in x's layout, nothing is copied."""
    ad, rec = fake
    for strides in (None, (60, 1, 15, 3)):
        x = Arr((2, 3, 4, 5), strides=strides)
        y = ops.softmax_forward(x, axis=1)
        assert ad.copies == [] and y.strides == x.strides
        args = rec["cudnnSoftmaxForward"].calls[-1]
        assert args[4] is args[7]
    # and an out laid out like x
    x = Arr((2, 3, 4, 5), strides=(60, 1, 15, 3))
    out = Arr((2, 3, 4, 5), strides=(60, 1, 15, 3))
    n = len(ad.allocs)
    assert ops.softmax_forward(x, axis=1, out=out) is out
    assert ad.copies == [] and len(ad.allocs) == n and rec["cudnnSoftmaxForward"].calls[-1][8] == ptr(out)


def test_U2_softmax_backward_y_and_dy_in_different_strides(fake):
    """y C order and dy transposed got a bare !isTensorSameStrides: now dy is copied into y's layout and y, dy and
    dx share one descriptor."""
    ad, rec = fake
    y = Arr((4, 6), "<f8")
    dy = Arr((4, 6), "<f8", strides=(1, 4))
    dx = ops.softmax_backward(dy, y, log=True)
    ((args),) = rec["cudnnSoftmaxBackward"].calls
    (dyc,) = copied_from(ad, dy)
    assert args[4] is args[6] is args[9] and key(args[4]) == ((4, 6, 1, 1), (6, 1, 1, 1))
    assert (args[5], args[7], args[10]) == (ptr(y), ptr(dyc), ptr(dx))
    # a channels-last pair with a C-order out: computed in their layout, then copied into out
    y2, dy2 = (Arr((2, 3, 4, 5), "<f4", (60, 1, 15, 3)) for _ in range(2))
    out = Arr((2, 3, 4, 5))
    ad.copies.clear()
    assert ops.softmax_backward(dy2, y2, axis=1, out=out) is out
    args = rec["cudnnSoftmaxBackward"].calls[-1]
    assert args[4] is args[6] is args[9] and args[10] != ptr(out) and ad.copies[-1][1] is out


def test_W2_out_of_a_library_without_adapter_is_refused_by_name():
    """Without an adapter nothing can be copied: an out in another layout is refused naming it (not computed wrong)."""
    x = FakeCAI((3, 5))
    out = FakeCAI((3, 5), strides=(4, 12))
    with pytest.raises(ValueError, match="out must be laid out like the inputs as cuDNN sees them"):
        ops.softmax_forward(x, out=out)
    with pytest.raises(ValueError, match="dy must be laid out as .* no cudnnkit adapter"):
        ops.softmax_backward(FakeCAI((3, 5), strides=(4, 12)), FakeCAI((3, 5)), out=FakeCAI((3, 5)))


# ----------------------------------------------------------------- LRN and divisive normalization


def test_W2_lrn_out_in_another_layout(fake):
    """LRN is handed one layout for x, y (and y, dy, x, dx backward): an NCHW out of a channels-last x is written
    through a channels-last temporary; the backward copies a dy of another layout into x's."""
    ad, rec = fake
    x = Arr((2, 3, 4, 5), strides=(60, 1, 15, 3))
    out = Arr((2, 3, 4, 5))
    assert ops.lrn_forward(x, size=3, out=out) is out
    ((args),) = rec["cudnnLRNCrossChannelForward"].calls
    (tmp,) = ad.allocs
    assert args[4] is args[7] and key(args[4])[1] == (60, 1, 15, 3) and args[8] == ptr(tmp)
    assert ad.copies == [(tmp, out)]
    ad.copies.clear()
    dy = Arr((2, 3, 4, 5))
    ops.lrn_backward(dy, x, x, size=3)
    ((args),) = rec["cudnnLRNCrossChannelBackward"].calls
    assert args[4] is args[6] is args[8] is args[11] and key(args[4])[1] == (60, 1, 15, 3)
    assert [s for s, _ in ad.copies] == [dy]


@pytest.mark.parametrize(
    "shape, strides, want",
    [
        # 5-d DHW-packed: as it is
        ((2, 3, 4, 5, 6), None, ((2, 3, 4, 5, 6), (360, 120, 30, 6, 1))),
        # 5-d channels-last (NDHWC): its spatial dims merge into one, 4-d
        ((2, 3, 4, 5, 6), (360, 1, 90, 18, 3), ((2, 3, 120, 1), (360, 1, 3, 1))),
        # 6-d packed: spatial dims merged
        ((2, 3, 2, 2, 2, 2), None, ((2, 3, 16, 1), (48, 16, 1, 1))),
        # 6-d with a gap between spatial dims 1 and 2: two spatial groups, 4-d
        ((2, 3, 2, 2, 2, 2), (96, 32, 16, 8, 2, 1), ((2, 3, 4, 4), (96, 32, 8, 1))),
        # 8-d slice with a gap in the channels only
        ((2, 4, 1, 2, 1, 2, 1, 3), (96, 12, 6, 6, 6, 3, 3, 1), ((2, 4, 12, 1), (96, 12, 1, 1))),
    ],
)
def test_U4_lrn_arrays_of_more_than_4_dims_are_described_as_cudnn_takes_them(fake, shape, strides, want):
    """cuDNN's LRN takes 4-d tensors and DHW-packed 5-d ones only (5- to 8-d others: bare BAD_PARAM/NOT_SUPPORTED);
    such arrays are described by their spatial dims merged (same memory, no copy)."""
    ad, rec = fake
    x = Arr(shape, strides=strides)
    out = Arr(shape, strides=strides)  # like x (a gapped x with a new y would be copied to C order)
    ops.lrn_forward(x, size=3, out=out)
    ((args),) = rec["cudnnLRNCrossChannelForward"].calls
    assert ad.copies == [] and args[4] is args[7] and (args[5], args[8]) == (ptr(x), ptr(out))
    assert key(args[4]) == want


def test_U4_lrn_spatial_dims_that_do_not_merge_are_copied(fake):
    """A 6-d view with gaps between three spatial groups cannot be described in 4-d: copied to C order first."""
    ad, rec = fake
    x = Arr((2, 3, 2, 2, 2, 2), strides=(384, 128, 64, 16, 4, 1))
    ops.lrn_forward(x, size=3)
    (xc,) = copied_from(ad, x)
    ((args),) = rec["cudnnLRNCrossChannelForward"].calls
    assert args[5] == ptr(xc) and key(args[4]) == ((2, 3, 16, 1), (48, 16, 1, 1))


def test_U4_divisive_normalization_takes_3_to_5_dims():
    x6 = FakeCAI((2, 3, 2, 2, 2, 2))
    with pytest.raises(ValueError, match=r"x must have 3 to 5 dims .*cuDNN's divisive normalization takes 4-d and 5-d"):
        ops.divisive_normalization_forward(x6)
    with pytest.raises(ValueError, match="dy must have 3 to 5 dims"):
        ops.divisive_normalization_backward(x6, x6)


def test_W2_divisive_normalization_out_and_means_in_other_layouts(fake):
    """One layout for x, means, the scratch buffers and y: a means of another layout is copied, an out of another
    layout written through a temporary (both formerly refused)."""
    ad, rec = fake
    x = Arr((2, 3, 4, 5))
    means = Arr((2, 3, 4, 5), strides=(60, 1, 15, 3))
    ops.divisive_normalization_forward(x, means, size=3)
    ((args),) = rec["cudnnDivisiveNormalizationForward"].calls
    (mc,) = copied_from(ad, means)
    y, t1, t2 = (a for a in ad.allocs if a is not mc)
    assert args[4] is args[10] and key(args[4])[1] == (60, 20, 5, 1)
    assert (args[5], args[6], args[7], args[8], args[11]) == (ptr(x), ptr(mc), ptr(t1), ptr(t2), ptr(y))
    assert t1.strides == t2.strides == y.strides == (60, 20, 5, 1)
    # an NHWC out with C-order inputs and a blend: out's contents into a C-order temporary, back after the call
    ad.copies.clear()
    ad.allocs.clear()
    out = Arr((2, 3, 4, 5), strides=(60, 1, 15, 3))
    assert ops.divisive_normalization_forward(x, x, size=3, out=out, y_beta=1.0) is out
    args = rec["cudnnDivisiveNormalizationForward"].calls[-1]
    tmp = ad.allocs[0]
    assert ad.copies == [(out, tmp), (tmp, out)] and args[11] == ptr(tmp) and key(args[10])[1] == (60, 20, 5, 1)
    # backward: dx_out and dmeans_out share the call's layout too
    ad.copies.clear()
    dmo = Arr((2, 3, 4, 5), strides=(60, 1, 15, 3))
    dx, dm = ops.divisive_normalization_backward(x, x, x, size=3, dmeans_out=dmo)
    args = rec["cudnnDivisiveNormalizationBackward"].calls[-1]
    assert dm is dmo and args[4] is args[11] and args[13] != ptr(dmo) and ad.copies[-1][1] is dmo
    assert args[12] == ptr(dx) and dx.strides == (60, 20, 5, 1)


# ----------------------------------------------------------------- dropout


def test_W2_dropout_backward_runs_in_the_forward_layout(fake):
    """Whether cuDNN indexes the mask by element or by memory position is not documented, so the backward always
    runs in the forward's layout: a channels-last forward and a C-order dy gives dy copied into channels-last."""
    ad, rec = fake
    x = Arr((2, 3, 4, 5), strides=(60, 1, 15, 3))
    y, reserve = ops.dropout_forward(x, 0.5)
    ((fargs),) = rec["cudnnDropoutForward"].calls
    assert fargs[2] is fargs[4] and key(fargs[2])[1] == (60, 1, 15, 3) and y.strides == (60, 1, 15, 3)
    dy = Arr((2, 3, 4, 5))
    dx = ops.dropout_backward(dy, reserve, 0.5)
    ((bargs),) = rec["cudnnDropoutBackward"].calls
    (dyc,) = copied_from(ad, dy)
    assert bargs[2] is bargs[4] is fargs[2] and bargs[3] == ptr(dyc) and dx.strides == (60, 1, 15, 3)
    assert bargs[6] == ptr(reserve)
    # an out of another layout gets a temporary in the forward's layout
    out = Arr((2, 3, 4, 5))
    ad.copies.clear()
    assert ops.dropout_backward(dy, reserve, 0.5, out=out) is out
    args = rec["cudnnDropoutBackward"].calls[-1]
    assert args[4] is fargs[2] and args[5] != ptr(out) and ad.copies[-1][1] is out


def test_W2_dropout_gapped_x_and_gapped_out(fake):
    """A gapped x is copied to C order (x and y share one layout); an out given in the same gapped layout as x is
    used as it is."""
    ad, rec = fake
    x = Arr((4, 6), strides=(12, 2))
    y, _ = ops.dropout_forward(x, 0.25)
    args = rec["cudnnDropoutForward"].calls[-1]
    (xc,) = copied_from(ad, x)
    assert args[2] is args[4] and key(args[2]) == ((4, 6, 1, 1), (6, 1, 1, 1)) and args[3] == ptr(xc)
    assert y.strides == (6, 1)
    ad.copies.clear()
    out = Arr((4, 6), strides=(12, 2))
    assert ops.dropout_forward(x, 0.25, out=out)[0] is out
    args = rec["cudnnDropoutForward"].calls[-1]
    assert ad.copies == [] and (args[3], args[5]) == (ptr(x), ptr(out))


def test_U3_dropout_on_an_overlapping_view(fake):
    """An overlapping x got a bare dropoutVerifyParams: it is copied to C order before the call, and y, the reserve
    and the descriptor cuDNN sees address each element once."""
    ad, rec = fake
    x = Arr((4, 5), strides=(1, 1))  # as_strided: rows share memory
    y, reserve = ops.dropout_forward(x, 0.3)
    args = rec["cudnnDropoutForward"].calls[-1]
    (xc,) = copied_from(ad, x)
    assert args[3] == ptr(xc) and key(args[2]) == ((4, 5, 1, 1), (5, 1, 1, 1)) and args[4] is args[2]
    assert y.strides == (5, 1) and reserve.shape == (args[7],)
    with pytest.raises(ValueError, match="out overlaps itself"):
        ops.dropout_forward(Arr((4, 5)), 0.3, out=Arr((4, 5), strides=(1, 1)))


def test_dropout_backward_reserve_checked_before_any_work(fake):
    ad, rec = fake
    x = Arr((4, 6))
    _, reserve = ops.dropout_forward(x, 0.5)
    with pytest.raises(ValueError, match="reserve has 3 bytes but dy's shape needs"):
        ops.dropout_backward(Arr((4, 6)), Arr((3,), "|u1"), 0.5)
    with pytest.raises(ValueError, match="reserve must be contiguous"):
        ops.dropout_backward(Arr((4, 6)), Arr((3,), "|u1", strides=(2,)), 0.5)
    assert rec["cudnnDropoutBackward"].calls == []


# ----------------------------------------------------------------- U4: set_tensor / scale_tensor of many dims


def test_U4_set_and_scale_6d_strided(fake):
    """6-d non-packed arrays got a bare BAD_PARAM/NOT_SUPPORTED: dims are merged where memory allows (each element
    is set or scaled alone, so their order does not matter), and cuDNN is given at most 4 dims."""
    ad, rec = fake
    y = Arr((2, 3, 4, 2, 3, 5), strides=(720, 240, 60, 30, 10, 2))  # x[..., ::2] of a C-order (2, 3, 4, 2, 3, 10)
    assert ops.set_tensor(y, 1.5) is y
    ((args),) = rec["cudnnSetTensor"].calls
    assert key(args[1]) == ((720, 1, 1, 1), (2, 1, 1, 1)) and args[2] == ptr(y)
    assert args[3]._obj.value == 1.5
    ops.scale_tensor(y, -2.0)
    ((args),) = rec["cudnnScaleTensor"].calls
    assert key(args[1]) == ((720, 1, 1, 1), (2, 1, 1, 1)) and ad.copies == [] and args[3]._obj.value == -2.0
    # and with a gap in the first dim too: two dims
    ops.set_tensor(Arr((2, 3, 4, 2, 3, 5), strides=(1440, 240, 60, 30, 10, 2)), 0.5)
    assert key(rec["cudnnSetTensor"].calls[-1][1]) == ((2, 360, 1, 1), (1440, 2, 1, 1))
    # a dense channels-last 6-d array is one dim to cuDNN
    z = Arr((2, 3, 2, 2, 2, 2), strides=(48, 1, 24, 12, 6, 3))
    ops.set_tensor(z, 0.0)
    assert key(rec["cudnnSetTensor"].calls[-1][1]) == ((96, 1, 1, 1), (1, 1, 1, 1))


def test_U4_set_tensor_gaps_in_every_dim_loop_over_the_smallest(fake):
    """Where more than 4 dims stay after merging, the smallest are looped over, one call per index, each at its
    own offset: every element is written exactly once."""
    ad, rec = fake
    shape = (3, 2, 4, 2, 5, 2)
    strides = tuple(2 * s for s in contiguous_strides(tuple(2 * d for d in shape)))  # x[::2, ::2, ..., ::2]
    y = Arr(shape, "<f8", strides=strides)
    ops.set_tensor(y, float("nan"))  # fill values may be NaN
    calls = rec["cudnnSetTensor"].calls
    (call_shape, call_strides) = key(calls[0][1])
    assert len(calls) == 2 * 2  # the two smallest dims (2, 2) are looped
    covered = set()
    for args in calls:
        assert key(args[1]) == (call_shape, call_strides)
        base = (args[2] - ptr(y)) // 8
        for idx in np.ndindex(*call_shape):
            covered.add(base + sum(i * s for i, s in zip(idx, call_strides)))
    want = {sum(i * s for i, s in zip(idx, strides)) for idx in np.ndindex(*shape)}
    assert covered == want and len(calls) * math.prod(call_shape) == len(want)


def test_U1_in_place_outputs_are_never_copied(fake):
    """set_tensor writes an expanded view's memory once (each location is one element of its memory); in-place
    outputs that overlap themselves (scale_tensor's y, add_tensor's c) are refused by name, never copied (the
    result would land in the copy)."""
    ad, rec = fake
    y = Arr((4, 3, 5), strides=(0, 5, 1))
    ops.set_tensor(y, 2.0)
    assert key(rec["cudnnSetTensor"].calls[-1][1]) == ((15, 1, 1, 1), (1, 1, 1, 1))
    assert rec["cudnnSetTensor"].calls[-1][2] == ptr(y) and ad.copies == []
    with pytest.raises(ValueError, match="^y overlaps itself .* written in place"):
        ops.scale_tensor(Arr((4, 3), strides=(1, 1)), 2.0)
    with pytest.raises(ValueError, match="^c is expanded .* written in place"):
        ops.add_tensor(Arr((4, 3, 5)), y)
    assert ad.copies == [] and rec["cudnnScaleTensor"].calls == [] and rec["cudnnAddTensor"].calls == []


# ----------------------------------------------------------------- U8, U13: non-numeric and non-finite parameters


@pytest.mark.parametrize("param", ["alpha", "beta", "k"])
@pytest.mark.parametrize(
    "value, exc, msg",
    [
        ("0.5", TypeError, "must be a real number"),
        (None, TypeError, "must be a real number"),
        (True, TypeError, "must be a real number"),
        (float("nan"), ValueError, "must be finite"),
        (float("inf"), ValueError, "must be finite"),
        (1e300, ValueError, "overflows float32"),
    ],
)
def test_U8_U13_lrn_parameters(param, value, exc, msg):
    for call in (
        lambda: ops.lrn_forward(FakeCAI((2, 3, 4, 5)), **{param: value}),
        lambda: ops.lrn_backward(*[FakeCAI((2, 3, 4, 5))] * 3, **{param: value}),
        lambda: ops.divisive_normalization_forward(FakeCAI((2, 3, 4, 5)), **{param: value}),
        lambda: ops.divisive_normalization_backward(*[FakeCAI((2, 3, 4, 5))] * 2, **{param: value}),
    ):
        with pytest.raises(exc, match=f"^{param}.*{msg}"):
            call()


def test_U8_U13_lrn_parameters_are_float32_for_every_dtype():
    """1e300 would become inf in float32 (the type of float32/float16 data); one rule for every dtype."""
    with pytest.raises(ValueError, match=r"^alpha=1e\+300 is out of range: LRN parameters must be within float32"):
        ops.lrn_forward(FakeCAI((2, 3, 4, 5), "<f8"), alpha=1e300)
    with pytest.raises(ValueError, match=r"^k=-1e\+300 is out of range"):
        ops.divisive_normalization_backward(*[FakeCAI((2, 3, 4, 5), "<f8")] * 2, k=-1e300)
    with pytest.raises(TypeError, match="^size must be an int"):
        ops.lrn_forward(FakeCAI((2, 3, 4, 5)), size="5")


@pytest.mark.parametrize(
    "call, name",
    [
        (lambda: ops.softmax_forward(FakeCAI((2, 3)), alpha="1"), "alpha"),
        (lambda: ops.softmax_forward(FakeCAI((2, 3)), out=FakeCAI((2, 3)), beta=float("nan")), "beta"),
        (lambda: ops.softmax_backward(FakeCAI((2, 3)), FakeCAI((2, 3)), alpha=None), "alpha"),
        (lambda: ops.lrn_forward(FakeCAI((2, 3, 4)), out=FakeCAI((2, 3, 4)), y_alpha=float("inf")), "y_alpha"),
        (lambda: ops.lrn_backward(*[FakeCAI((2, 3, 4))] * 3, out=FakeCAI((2, 3, 4)), dx_beta="x"), "dx_beta"),
        (lambda: ops.divisive_normalization_forward(FakeCAI((2, 3, 4)), y_alpha=1e300), "y_alpha"),
        (lambda: ops.set_tensor(FakeCAI((2, 3)), "1.0"), "value"),
        (lambda: ops.set_tensor(FakeCAI((2, 3)), None), "value"),
        (lambda: ops.scale_tensor(FakeCAI((2, 3)), float("nan")), "alpha"),
        (lambda: ops.add_tensor(FakeCAI((2, 3)), FakeCAI((2, 3)), beta="2"), "beta"),
        (lambda: ops.transform_tensor(FakeCAI((2, 3)), out=FakeCAI((2, 3)), alpha=[1.0]), "alpha"),
    ],
)
def test_U8_U13_blend_factors_and_fill_values_are_checked_by_name(call, name):
    with pytest.raises((TypeError, ValueError), match=f"^{name}"):
        call()


def test_U13_set_tensor_value_may_be_nan_or_inf(fake):
    ad, rec = fake
    for v in (float("nan"), float("-inf")):
        ops.set_tensor(Arr((2, 3)), v)
    assert math.isnan(rec["cudnnSetTensor"].calls[0][3]._obj.value)
    assert rec["cudnnSetTensor"].calls[1][3]._obj.value == -math.inf


R = ops.RNN("lstm", 4, 5)


@pytest.mark.parametrize(
    "fill, exc, msg",
    [
        (None, TypeError, "^padding_fill must be a real number"),
        ("0", TypeError, "^padding_fill must be a real number"),
        (False, TypeError, "^padding_fill must be a real number"),
        (1e300, ValueError, "^padding_fill=1e\\+300 overflows float32"),
    ],
)
def test_U8_U13_rnn_padding_fill(fill, exc, msg):
    with pytest.raises(exc, match=msg):
        ops.rnn_forward(FakeCAI((3, 2, 4)), FakeCAI((1000,)), rnn=R, padding_fill=fill)


def test_U13_rnn_padding_fill_must_fit_float16():
    from cudnnkit.ops.rnn import _check_fill

    with pytest.raises(ValueError, match=r"padding_fill=70000.0 overflows float16"):
        _check_fill(70000.0, "float16")
    assert _check_fill(60000.0, "float16") == 60000.0
    assert math.isnan(_check_fill(float("nan"), "float16")) and _check_fill(-math.inf, "float32") == -math.inf


def test_U13_rnn_has_no_separate_device_lengths():
    """dev_seq_lengths (a device copy that could disagree with seq_lengths, unverifiable without a sync) is gone:
    cuDNN reads the library's own cached upload of seq_lengths."""
    with pytest.raises(TypeError, match="dev_seq_lengths"):
        ops.rnn_forward(FakeCAI((3, 2, 4)), FakeCAI((1000,)), rnn=R, dev_seq_lengths=FakeCAI((2,), "<i4"))
    with pytest.raises(TypeError, match="dev_seq_lengths"):
        ops.rnn_backward(*[FakeCAI((3, 2, 4))] * 3, FakeCAI((1000,)), FakeCAI((8,), "|u1"), rnn=R, dev_seq_lengths=1)


class _FakeValues:
    """Stands in for ``driver.DeviceValues``: records the values and the frees."""

    made: list = []

    def __init__(self, values, device, stream):
        self.values, self.device, self.stream = np.array(values), device, stream
        self.ptr, self.freed = Fake.next_ptr(), []
        _FakeValues.made.append(self)

    def free(self, stream=None):
        self.freed.append(stream)

    def ready(self):
        return getattr(self, "done", True)


def _fake_driver(monkeypatch, fake):
    """The driver's device values and capture status faked, the lengths caches emptied: (launch, capturing flag)."""
    from cudnnkit.ops import _rnn_desc
    from cudnnkit.runtime import driver

    capturing = [False]
    _FakeValues.made = []
    monkeypatch.setattr(driver, "DeviceValues", _FakeValues)
    monkeypatch.setattr(driver, "stream_capturing", lambda stream, device: capturing[0])
    monkeypatch.setattr(_rnn_desc, "_captured", {})
    _rnn_desc._lengths.clear()
    return Launch(0, fake[0], 0), capturing


def test_U13_rnn_device_lengths_are_the_upload_of_seq_lengths(fake, monkeypatch):
    from cudnnkit.ops import _rnn_desc
    from cudnnkit.ops._rnn_desc import _dev_lengths, _lengths, _Seq

    ad, _ = fake
    launch, capturing = _fake_driver(monkeypatch, fake)
    seq = _Seq(5, 3, (5, 3, 2), np.array([5, 3, 2], np.int32), False)
    buf, p = _dev_lengths(launch, seq)
    (up,) = _FakeValues.made
    assert up.values.dtype == np.int32 and up.values.tolist() == [5, 3, 2] and (up.device, up.stream) == (0, 0)
    assert ctypes.cast(p, ctypes.c_void_p).value == up.ptr and not ad.uploads  # no array-library memory
    assert _dev_lengths(launch, seq)[0] is buf and len(_FakeValues.made) == 1  # cached
    # an evicted upload is only dropped (freed when the last call holding it lets go), never freed under a holder
    for n in range(_rnn_desc._LENGTHS_MAX):
        _dev_lengths(launch, _Seq(5, 1, (n + 1,), np.array([n + 1], np.int32), False))
    assert buf.freed == [] and _dev_lengths(launch, seq)[0] is not buf
    _lengths.clear()


def test_U13_rnn_lengths_under_cuda_graph_capture_are_kept_or_refused(fake, monkeypatch):
    """A capture reads a cached upload and keeps it for the process (the graph's replays read it); lengths never
    uploaded before the capture are refused with a clear error, before any cuDNN call."""
    from cudnnkit.ops import _rnn_desc
    from cudnnkit.ops._rnn_desc import _dev_lengths, _lengths, _Seq

    ad, _ = fake
    launch, capturing = _fake_driver(monkeypatch, fake)
    seq = _Seq(5, 2, (5, 3), np.array([5, 3], np.int32), False)
    warm, _ = _dev_lengths(launch, seq)  # the warm-up
    capturing[0] = True
    assert _dev_lengths(launch, seq)[0] is warm and _rnn_desc._captured[(0, 0, (5, 3))] is warm
    _lengths.clear()  # clear_caches and the LRU's evictions cannot drop what a graph reads
    assert _dev_lengths(launch, seq)[0] is warm and warm.freed == []
    with pytest.raises(RuntimeError, match=r"seq_lengths \[4, 1\] were first seen while stream 0x0 captures"):
        _dev_lengths(launch, _Seq(4, 2, (4, 1), np.array([4, 1], np.int32), False))
    assert len(_FakeValues.made) == 1
    # a capture on another stream than the warm-up's (torch.cuda.make_graphed_callables) takes a completed upload
    capturing[0] = False
    other = _Seq(6, 2, (6, 2), np.array([6, 2], np.int32), False)
    first, _ = _dev_lengths(launch, other)
    capturing[0] = True
    side = Launch(0, ad, 0x77)
    first.done = False  # not yet complete on the device: refused, not raced
    with pytest.raises(RuntimeError, match=r"seq_lengths \[6, 2\] were first seen while stream 0x77 captures"):
        _dev_lengths(side, other)
    first.done = True
    assert _dev_lengths(side, other)[0] is first and _rnn_desc._captured[(0, 0x77, (6, 2))] is first
    _lengths.clear()


# ----------------------------------------------------------------- U5: persistent RNN algorithms


def test_U5_persistent_algorithms_refuse_what_cudnn_documents_they_lack():
    with pytest.raises(ValueError, match="proj_size .* needs algo='standard'"):
        ops.RNN("lstm", 4, 8, proj_size=3, algo="persist_dynamic")
    with pytest.raises(ValueError, match="persist_static_small_h' does not support float64"):
        ops.RNN("gru", 4, 8, algo="persist_static_small_h", dtype="float64")
    rnn = ops.RNN("lstm", 4, 5, algo="persist_dynamic")
    with pytest.raises(ValueError, match="algo='persist_dynamic' does not support sequences of different lengths"):
        ops.rnn_forward(FakeCAI((3, 2, 4)), FakeCAI((1000,)), rnn=rnn, seq_lengths=[3, 2])
    with pytest.raises(ValueError, match="algo='persist_static' does not support sequences of different lengths"):
        ops.rnn_backward(
            *[FakeCAI((3, 2, 4))] * 3,
            FakeCAI((1000,)),
            FakeCAI((8,), "|u1"),
            rnn=ops.RNN("lstm", 4, 4, algo="persist_static"),
            seq_lengths=[1, 3],
        )


def test_U5_not_supported_from_the_dynamic_build_names_the_config(monkeypatch):
    """A NOT_SUPPORTED at cudnnBuildRNNDynamic (the first call of a persist_dynamic RNN) names every config field and
    what the call was given, instead of a bare status."""
    from cudnnkit.ops import _rnn_desc as m

    def refuse(*args):
        raise NotSupportedError(lib.CUDNN_STATUS_NOT_SUPPORTED, "cudnnBuildRNNDynamic", "")

    monkeypatch.setattr(lib, "cudnnBuildRNNDynamic", refuse, raising=False)
    rnn = ops.RNN("gru", 6, 7, num_layers=2, algo="persist_dynamic", dtype="float64")
    b = object.__new__(m._Built)
    b.rnn, b.lock, b.math_mode, b.dyn_batch = rnn, m.threading.RLock(), rnn.resolved_math(), {}
    b.base, b._descs = rnn.algo, {(True, rnn.algo): "DESC"}
    launch = Launch(0, None, 0)
    monkeypatch.setattr(Launch, "handle", property(lambda self: "HANDLE"))
    with pytest.raises(NotSupportedError) as e:
        b.prepare_call(launch, True, 9, rnn.algo)
    msg = str(e.value)
    for part in (
        "cuDNN does not support this RNN",
        "algo='persist_dynamic'",
        "dtype=float64",
        "cell='gru'",
        "hidden_size=7",
        "num_layers=2",
        "cudnnBuildRNNDynamic for a batch of 9",
        "NVRTC",
    ):
        assert part in msg
    assert b.dyn_batch == {}  # not marked built


def test_U5_not_supported_inside_a_call_is_explained_once():
    from cudnnkit.ops._rnn_desc import _call_info, _explained, _Seq

    rnn = ops.RNN("lstm", 4, 5, algo="persist_static", dtype="float16")
    seq = _Seq(6, 2, (6, 6), np.array([6, 6], np.int32), True)
    call = _call_info("batch_major", seq, True, False)
    with pytest.raises(NotSupportedError, match="layout='batch_major', batch N=2, T=6, sequence lengths all T"):
        with _explained(rnn, None, call):
            raise NotSupportedError(lib.CUDNN_STATUS_NOT_SUPPORTED, "cudnnRNNForward", "")
    with pytest.raises(NotSupportedError) as e:
        with _explained(rnn, None, call):
            with _explained(rnn, None, "; inner"):  # an already explained error passes through unchanged
                raise NotSupportedError(lib.CUDNN_STATUS_NOT_SUPPORTED, "cudnnRNNForward", "")
    assert "; inner" in str(e.value) and str(e.value).count("cuDNN does not support this RNN") == 1
    assert "persistent algorithms refuse" in str(e.value)


# ----------------------------------------------------------------- U11: a required array passed as None


@pytest.mark.parametrize(
    "call, name",
    [
        (lambda: ops.softmax_forward(None), "x"),
        (lambda: ops.softmax_backward(FakeCAI((2, 3)), None), "y"),
        (lambda: ops.lrn_forward(None), "x"),
        (lambda: ops.lrn_backward(FakeCAI((2, 3, 4)), FakeCAI((2, 3, 4)), None), "x"),
        (lambda: ops.divisive_normalization_forward(None), "x"),
        (lambda: ops.divisive_normalization_backward(None, FakeCAI((2, 3, 4))), "dy"),
        (lambda: ops.dropout_forward(None, 0.5), "x"),
        (lambda: ops.dropout_backward(FakeCAI((4,)), None, 0.5), "reserve"),
        (lambda: ops.set_tensor(None, 1.0), "y"),
        (lambda: ops.scale_tensor(None, 1.0), "y"),
        (lambda: ops.add_tensor(None, FakeCAI((2, 3))), "a"),
        (lambda: ops.add_tensor(FakeCAI((2, 3)), None), "c"),
        (lambda: ops.transform_tensor(None), "x"),
        (lambda: ops.grid_sample_forward(FakeCAI((1, 1, 3, 3)), None), "grid"),
        (lambda: ops.grid_sample_backward(FakeCAI((1, 1, 3, 3)), FakeCAI((1, 2, 2, 2)), None), "dy"),
        (lambda: ops.affine_grid_forward(None, size=(1, 1, 2, 2)), "theta"),
        (lambda: ops.affine_grid_backward(None, size=(1, 1, 2, 2)), "dgrid"),
        (lambda: ops.ctc_loss(None, [1], [1], [1]), "x"),
        (lambda: ops.rnn_forward(FakeCAI((3, 2, 4)), None, rnn=R), "w"),
    ],
)
def test_U11_required_array_given_as_none(call, name):
    with pytest.raises(TypeError, match=f"^{name} is required"):
        call()


# ----------------------------------------------------------------- U12: transform_tensor pads


@pytest.mark.parametrize(
    "kw, exc, msg",
    [
        (
            dict(pad_before=100000),
            ValueError,
            r"pad_before=100000 and pad_after=0 give an output of shape .* too large",
        ),
        (dict(pad_after=(0, 0, 0, 2**31)), ValueError, r"pad_after=\(0, 0, 0, 2147483648\) give an output"),
        (
            dict(pad_before=(0, 0, 2**20, 2**20)),
            ValueError,
            "every dim and stride, and the number of elements spanned, must be at most 2147483647",
        ),
        (dict(pad_before=-1), ValueError, "pad_before must be >= 0"),
        (dict(pad_after=1.5), TypeError, "pad_after must be an int or a sequence"),
        (dict(pad_after=(1, 1, 1, "1")), TypeError, "pad_after must hold ints"),
        (dict(pad_before=True), TypeError, "pad_before must be an int or a sequence"),
    ],
)
def test_U12_transform_tensor_pads(kw, exc, msg):
    with pytest.raises(exc, match=msg):
        ops.transform_tensor(FakeCAI((2, 3, 4, 5)), **kw)


def test_W2_transform_tensor_padded_into_a_gapped_out(fake):
    """Padding writes any out layout in place, with no temporary: out is blended by beta as a whole (the border),
    then x is transformed into out's interior view (x's shape, out's strides, pad_before in) with blend 1."""
    ad, rec = fake
    x = Arr((2, 3, 4, 5))
    out = Arr((2, 3, 6, 7), strides=(504, 168, 14, 2))
    assert ops.transform_tensor(x, pad_before=(0, 0, 1, 1), pad_after=(0, 0, 1, 1), out=out, beta=0.5) is out
    assert not rec["cudnnTransformTensorEx"].calls and ad.allocs == [] and ad.copies == []
    assert rec["cudnnScaleTensor"].calls and not rec["cudnnSetTensor"].calls
    (args,) = rec["cudnnTransformTensor"].calls
    assert key(args[5]) == ((2, 3, 4, 5), (504, 168, 14, 2))
    assert args[6] == ptr(out) + (14 + 2) * 4  # one row and one column in, float32
    # beta == 0: the border is set to zero instead of scaled
    ops.transform_tensor(x, pad_before=1, out=Arr((3, 4, 5, 6)))
    assert rec["cudnnSetTensor"].calls
    # a gapped x is read in place: cudnnTransformTensor takes any strides
    xg = Arr((2, 3, 4, 5), strides=(120, 40, 10, 2))
    ops.transform_tensor(xg, pad_before=1, out=Arr((3, 4, 5, 6)))
    assert copied_from(ad, xg) == [] and rec["cudnnTransformTensor"].calls[-1][3] == ptr(xg)


# ----------------------------------------------------------------- out= audit: outputs cuDNN writes packed


@pytest.mark.parametrize(
    "call, msg",
    [
        (
            lambda: ops.ctc_loss(
                FakeCAI((6, 2, 5)), [1, 2], [1, 1], [6, 6], grads_out=FakeCAI((6, 2, 5), strides=(4, 240, 48))
            ),
            "grads_out must be C-contiguous",
        ),
        (
            lambda: ops.ctc_loss(FakeCAI((6, 2, 5)), [1, 2], [1, 1], [6, 6], costs_out=FakeCAI((2,), strides=(8,))),
            "costs_out must be contiguous",
        ),
        (
            lambda: ops.affine_grid_forward(
                FakeCAI((2, 2, 3)), size=(2, 1, 4, 5), out=FakeCAI((2, 4, 5, 2), strides=(160, 8, 32, 4))
            ),
            "out must be C-contiguous",
        ),
        (
            lambda: ops.affine_grid_backward(
                FakeCAI((2, 4, 5, 2)), size=(2, 1, 4, 5), out=FakeCAI((2, 2, 3), strides=(24, 4, 8))
            ),
            "out must be C-contiguous",
        ),
        (
            lambda: ops.grid_sample_backward(
                FakeCAI((1, 2, 3, 3)),
                FakeCAI((1, 2, 2, 2)),
                FakeCAI((1, 2, 2, 2)),
                dx_out=FakeCAI((1, 2, 3, 3)),
                dgrid_out=FakeCAI((1, 2, 2, 2), strides=(64, 32, 8, 4)),
            ),
            "dgrid_out must be C-contiguous",
        ),
    ],
)
def test_W2_outputs_cudnn_writes_packed_are_refused_by_name(call, msg):
    """CTC's costs/grads, the grid generator's grid/dtheta and the sampler's dgrid are written by cuDNN as packed
    arrays through bare pointers: an out of any other layout is refused naming it (never written wrongly)."""
    with pytest.raises(ValueError, match=msg):
        call()


# ----------------------------------------------------------------- named refusals found by the fuzzer


@pytest.mark.parametrize(
    "call, msg",
    [
        (lambda: ops.softmax_forward(FakeCAI((2, 2**32 + 3))), r"^x \(shape \(2, 4294967299\)\) is too large"),
        (
            lambda: ops.dropout_forward(FakeCAI((4, 2**32 + 3, 5)), 0.5),
            r"^x \(shape \(4, 4294967299, 5\)\) is too large",
        ),
        (lambda: ops.lrn_forward(FakeCAI((2, 2**31, 4))), r"^x \(shape .*\) is too large"),
        (lambda: ops.set_tensor(FakeCAI((3, 2**31 + 1)), 0.0), r"^y \(shape .*\) is too large"),
        (lambda: ops.add_tensor(FakeCAI((1, 2**31)), FakeCAI((1, 2**31))), r"^a \(shape .*\) is too large"),
    ],
)
def test_U12_arrays_too_large_for_cudnn_descriptors_are_named(fake, call, msg):
    """A dim past cuDNN's int gave int_array's "shape value ... does not fit cuDNN's int", naming no argument."""
    with pytest.raises(ValueError, match=msg):
        call()


@pytest.mark.parametrize(
    "call, name",
    [
        (lambda y: ops.set_tensor(y, 1.0), "y"),
        (lambda y: ops.scale_tensor(y, 2.0), "y"),
        (lambda y: ops.add_tensor(FakeCAI((2, 3)), y), "c"),
    ],
)
def test_W2_read_only_arrays_written_in_place_are_refused(call, name):
    y = FakeCAI((2, 3))
    y.__cuda_array_interface__["data"] = (y.__cuda_array_interface__["data"][0], True)
    with pytest.raises(ValueError, match=f"^{name} is read-only"):
        call(y)


def test_U11_dropout_state_names_like():
    with pytest.raises(TypeError, match="^like must be a CUDA array"):
        ops.default_state((1, 2, 3))
    with pytest.raises(TypeError, match="^like must be an array of a library with a cudnnkit adapter"):
        ops.DropoutState(FakeCAI((8,)))
    with pytest.raises(TypeError, match="^like must be an array of a library with a cudnnkit adapter"):
        ops.default_state(FakeCAI((8,)))


@pytest.mark.parametrize("strides", [None, (60, 1, 15, 3), (1, 40, 10, 2)])
def test_W2_dense_inputs_with_default_outputs_make_no_copy(fake, strides):
    """The fast path: a dense x (C order, channels-last, another axis order whose dims merge) with the default
    outputs is handed to cuDNN as it is and every new output is allocated in its layout, forward and backward
    (divisive normalization: for NCHW and NHWC, the layouts it is relied on for)."""
    ad, rec = fake
    x = Arr((2, 3, 4, 5), strides=strides)
    want = x.strides
    outs = [
        ops.softmax_forward(x, axis=1),
        ops.softmax_backward(x, x, axis=1),
        ops.lrn_forward(x, size=3),
        ops.lrn_backward(x, x, x, size=3),
    ]
    y, reserve = ops.dropout_forward(x, 0.5)
    outs += [y, ops.dropout_backward(x, reserve, 0.5)]
    if strides != (1, 40, 10, 2):
        outs += [
            ops.divisive_normalization_forward(x, x, size=3),
            *ops.divisive_normalization_backward(x, x, x, size=3),
        ]
        assert key(rec["cudnnDivisiveNormalizationForward"].calls[-1][4])[1] == want
    assert ad.copies == []
    assert all(o.strides == want for o in outs)
    assert key(rec["cudnnLRNCrossChannelForward"].calls[-1][4])[1] == want
    assert key(rec["cudnnDropoutForward"].calls[-1][2])[1] == want


# ----------------------------------------------------------------- an emulated device: the W2 audit end to end
#
# The same ops on arrays that live in host memory standing in for the device, with the cuDNN calls emulated from
# their descriptors and pointers alone (each call asserts what cuDNN requires or is relied on for: one layout for
# softmax, LRN, divisive normalization and dropout; dropout's mask is indexed by memory position, the worst case
# for a backward in another layout). Every combination of input and out= layout is compared with NumPy, and a
# gapped out's buffer is checked untouched outside its view. The GPU tier checks cuDNN itself.


class Memory:
    """Allocations of the emulated device, by base pointer; views are bounds-checked."""

    def __init__(self):
        self.blocks, self._next = {}, 0x10000000

    def alloc(self, nbytes: int) -> int:
        p = self._next
        self._next += (nbytes // 4096 + 2) * 4096
        self.blocks[p] = np.zeros(max(nbytes, 1), np.uint8)
        return p

    def view(self, ptr, shape, strides, dtype=np.float64):
        base = next(b for b in self.blocks if b <= ptr < b + len(self.blocks[b]))
        mem, isz = self.blocks[base], np.dtype(dtype).itemsize
        end = (ptr - base) + isz * (1 + sum((d - 1) * s for d, s in zip(shape, strides))) if all(shape) else 0
        assert end <= len(mem) and all(s >= 0 for s in strides), "out of bounds"
        flat = mem.view(dtype)[(ptr - base) // isz :]
        return np.lib.stride_tricks.as_strided(flat, tuple(shape), tuple(s * isz for s in strides))


class DevArr(FakeCAI):
    """A float64 (or uint8) array of the emulated device; ``strides`` in elements."""

    def __init__(self, mem, shape, strides=None, ptr=None, typestr="<f8"):
        shape = tuple(shape)
        strides = contiguous_strides(shape) if strides is None else tuple(strides)
        isz = _ITEMSIZE[typestr]
        if ptr is None:
            ptr = mem.alloc(isz * (1 + sum((d - 1) * s for d, s in zip(shape, strides)) if all(shape) else 1))
        super().__init__(shape, typestr, tuple(s * isz for s in strides), ptr=ptr)
        self.mem, self.shape_, self.strides_ = mem, shape, strides

    @property
    def np(self):
        dtype = np.uint8 if self.__cuda_array_interface__["typestr"] == "|u1" else np.float64
        return self.mem.view(ptr(self), self.shape_, self.strides_, dtype)


class DevLib(Fake):
    """The emulated device's library: allocations and copies really move the values."""

    def __init__(self, mem):
        super().__init__()
        self.mem = mem

    def empty(self, shape, dtype, device, strides=None, stream=None):
        return DevArr(self.mem, shape, strides, typestr=_TYPESTR[dtype])

    def contiguous(self, arr, stream=None):
        new = DevArr(self.mem, arr.shape_)
        new.np[...] = arr.np
        self.copies.append((arr, new))
        return new

    def copy(self, dst, src, stream=None):
        dst.np[...] = src.np
        self.copies.append((src, dst))


def _dview(mem, desc, p):
    return mem.view(p, desc.key[2], desc.key[3])


def _blend(y, a, r, b):
    y[...] = a._obj.value * r + (b._obj.value * y if b._obj.value else 0)  # beta 0: y is not read (may be NaN)


def _emulate(mem):
    """The emulated cuDNN calls, by name."""

    def softmax_fwd(h, algo, mode, a, xd, xp, b, yd, yp):
        assert xd.key == yd.key, "cuDNN's softmax is given one layout"
        x = _dview(mem, xd, xp).copy()
        ax = (1,) if mode == lib.CUDNN_SOFTMAX_MODE_CHANNEL else (1, 2, 3)
        m = x.max(axis=ax, keepdims=True)
        e = np.exp(x - m)
        s = e.sum(axis=ax, keepdims=True)
        _blend(_dview(mem, yd, yp), a, (x - m - np.log(s)) if algo == lib.CUDNN_SOFTMAX_LOG else e / s, b)

    def softmax_bwd(h, algo, mode, a, yd, yp, dyd, dyp, b, dxd, dxp):
        assert yd.key == dyd.key == dxd.key, "!isTensorSameStrides"
        y, dy = _dview(mem, yd, yp).copy(), _dview(mem, dyd, dyp).copy()
        ax = (1,) if mode == lib.CUDNN_SOFTMAX_MODE_CHANNEL else (1, 2, 3)
        if algo == lib.CUDNN_SOFTMAX_LOG:
            r = dy - np.exp(y) * dy.sum(axis=ax, keepdims=True)
        else:
            r = y * (dy - (dy * y).sum(axis=ax, keepdims=True))
        _blend(_dview(mem, dxd, dxp), a, r, b)

    def lrn_fwd(h, d, mode, a, xd, xp, b, yd, yp):
        shape, strides = xd.key[2], xd.key[3]
        assert xd.key == yd.key and (len(shape) == 4 or merge(shape[2:], strides[2:])[1] == 1)
        n, al, be, k = d.key[1:]
        x = _dview(mem, xd, xp).copy()
        _blend(_dview(mem, yd, yp), a, _ref_lrn(x, n, al, be, k), b)

    def lrn_bwd(h, d, mode, a, yd, yp, dyd, dyp, xd, xp, b, dxd, dxp):
        assert yd.key == dyd.key == xd.key == dxd.key
        y, dy, x = (_dview(mem, yd, p).copy() for p in (yp, dyp, xp))
        _blend(_dview(mem, dxd, dxp), a, y + 2 * dy + 3 * x, b)  # the data flow, not LRN's gradient

    def dn_fwd(h, d, mode, a, xd, xp, mp, t1, t2, b, yd, yp):
        assert xd.key == yd.key
        x, m = _dview(mem, xd, xp).copy(), (_dview(mem, xd, mp).copy() if mp else 0)
        _dview(mem, xd, t1)[...] = _dview(mem, xd, t2)[...] = 1  # the scratch buffers hold the whole tensor
        _blend(_dview(mem, yd, yp), a, 3 * x + m, b)

    masks = {}
    draws = np.random.default_rng(7)

    def offsets(desc):
        return sum(np.indices(desc.key[2])[i] * s for i, s in enumerate(desc.key[3]))

    def drop_fwd(h, d, xd, xp, yd, yp, rp, n):
        assert xd.key == yd.key
        off = offsets(xd)
        masks[rp] = {int(o): bool(draws.random() < 0.5) for o in off.ravel()}  # by memory position
        keep = np.vectorize(lambda o: masks[rp][int(o)])(off)
        _dview(mem, yd, yp)[...] = np.where(keep, 2 * _dview(mem, xd, xp), 0)

    def drop_bwd(h, d, dyd, dyp, dxd, dxp, rp, n):
        assert dyd.key == dxd.key
        keep = np.vectorize(lambda o: masks[rp][int(o)])(offsets(dyd))
        _dview(mem, dxd, dxp)[...] = np.where(keep, 2 * _dview(mem, dyd, dyp), 0)

    def set_t(h, d, p, v):
        assert len(d.key[2]) == 4  # at most 4 dims per call, padded
        _dview(mem, d, p)[...] = v._obj.value

    def scale_t(h, d, p, v):
        t = _dview(mem, d, p)
        t[...] = t * v._obj.value

    def transform(h, a, xd, xp, b, yd, yp):
        _blend(_dview(mem, yd, yp), a, _dview(mem, xd, xp).copy(), b)

    def transform_ex(h, td, a, xd, xp, b, yd, yp):
        _, nd, fmt, before, after = td.key
        shape, strides = yd.key[2], yd.key[3]
        want = "nhwc" if fmt == int(lib.CUDNN_TENSOR_NHWC) else "nchw"
        assert ops.tensor._packed_as(shape, strides, want), "TransformEx writes packed dest"
        x = _dview(mem, xd, xp).copy()
        full = np.zeros(shape)
        full[tuple(slice(p, p + d) for p, d in zip(before, x.shape))] = x
        _blend(_dview(mem, yd, yp), a, full, b)

    def states(h, size):
        size._obj.value = 64

    return {
        "cudnnSoftmaxForward": softmax_fwd,
        "cudnnSoftmaxBackward": softmax_bwd,
        "cudnnLRNCrossChannelForward": lrn_fwd,
        "cudnnLRNCrossChannelBackward": lrn_bwd,
        "cudnnDivisiveNormalizationForward": dn_fwd,
        "cudnnDropoutForward": drop_fwd,
        "cudnnDropoutBackward": drop_bwd,
        "cudnnDropoutGetStatesSize": states,
        "cudnnSetDropoutDescriptor": lambda *a: None,
        "cudnnRestoreDropoutDescriptor": lambda *a: None,
        "cudnnSetTensor": set_t,
        "cudnnScaleTensor": scale_t,
        "cudnnTransformTensor": transform,
        "cudnnTransformTensorEx": transform_ex,
    }


def _ref_lrn(x, n, alpha, beta, k):
    c, lo, hi = x.shape[1], (n - 1) // 2, n // 2
    den = np.empty_like(x)
    for i in range(c):
        den[:, i] = k + alpha / n * (x**2)[:, max(0, i - lo) : min(c, i + hi + 1)].sum(axis=1)
    return x * den**-beta


def _ref_softmax(x, axes, log):
    m = x.max(axis=axes, keepdims=True)
    e = np.exp(x - m)
    s = e.sum(axis=axes, keepdims=True)
    return (x - m - np.log(s)) if log else e / s


LAYOUTS = ("c", "transposed", "channels_last", "gapped")


class Device:
    def __init__(self, mem):
        self.mem = mem

    def place(self, a, kind):
        """``a`` in layout ``kind``: (array, buffer, mask of the view's elements in the buffer or None)."""
        a = np.asarray(a, np.float64)
        nd, mem = a.ndim, self.mem
        if kind == "c":
            x = DevArr(mem, a.shape)
            x.np[...] = a
            return x, x, None
        if kind == "transposed":
            buf = DevArr(mem, a.shape[::-1])
            buf.np[...] = a.transpose(tuple(reversed(range(nd))))
            return DevArr(mem, a.shape, tuple(reversed(buf.strides_)), ptr=ptr(buf)), buf, None
        if kind == "channels_last":
            buf = DevArr(mem, (a.shape[0], *a.shape[2:], a.shape[1]))
            buf.np[...] = np.moveaxis(a, 1, -1)
            cs = buf.strides_
            return DevArr(mem, a.shape, (cs[0], cs[-1], *cs[1:-1]), ptr=ptr(buf)), buf, None
        idx = (slice(1, None),) + (slice(None),) * (nd - 2) + (slice(None, None, 2),)
        buf = DevArr(mem, (a.shape[0] + 1, *a.shape[1:-1], 2 * a.shape[-1]))
        buf.np[...] = np.nan
        buf.np[idx] = a
        mask = np.zeros(buf.shape_, bool)
        mask[idx] = True
        st = buf.strides_
        return DevArr(mem, a.shape, st[:-1] + (2 * st[-1],), ptr=ptr(buf) + 8 * st[0]), buf, mask

    def poisoned(self, shape, kind, values=None):
        return self.place(np.full(shape, np.nan) if values is None else values, kind)


def untouched(buf, mask):
    return mask is None or bool(np.isnan(buf.np[~mask]).all())


@pytest.fixture
def device(monkeypatch):
    mem = Memory()
    ad = DevLib(mem)
    real = adapters.for_object
    monkeypatch.setattr(adapters, "for_object", lambda obj: ad if isinstance(obj, Arr | DevArr) else real(obj))
    for name, fn in _emulate(mem).items():
        monkeypatch.setattr(lib, name, fn, raising=False)
    monkeypatch.setattr(Launch, "handle", property(lambda self: "HANDLE"))
    from cudnnkit.ops import dropout

    monkeypatch.setattr(dropout, "_defaults", {})
    return Device(mem)


@pytest.mark.parametrize("x_kind", LAYOUTS)
@pytest.mark.parametrize("out_kind", LAYOUTS)
@pytest.mark.parametrize("log", [False, True])
@pytest.mark.parametrize("axis", [1, -1])
def test_W1_W2_U2_softmax_every_layout_emulated(device, x_kind, out_kind, log, axis):
    rng = np.random.default_rng(0)
    shape = (3, 5, 4, 6)
    a, old, g = rng.standard_normal(shape), rng.standard_normal(shape), rng.standard_normal(shape)
    ref = _ref_softmax(a, (axis % 4,), log)
    x, xbuf, _ = device.place(a, x_kind)
    for beta in (0.0, 0.5):
        out, buf, mask = device.poisoned(shape, out_kind, old if beta else None)
        assert ops.softmax_forward(x, axis=axis, log=log, out=out, alpha=2.0, beta=beta) is out
        assert np.allclose(out.np, 2 * ref + beta * old, rtol=1e-13, atol=1e-13) and untouched(buf, mask)
    assert np.array_equal(x.np, a)  # the input is untouched
    assert np.allclose(ops.softmax_forward(x, axis=axis, log=log).np, ref, rtol=1e-13, atol=1e-13)
    # backward: y in x's layout, dy in out's, dx into a third
    y, _, _ = device.place(ref, x_kind)
    dy, _, _ = device.place(g, out_kind)
    dxo, buf, mask = device.poisoned(shape, LAYOUTS[(LAYOUTS.index(out_kind) + 1) % 4])
    ops.softmax_backward(dy, y, axis=axis, log=log, out=dxo)
    ax = (axis % 4,)
    want = g - np.exp(ref) * g.sum(axis=ax, keepdims=True) if log else ref * (g - (g * ref).sum(axis=ax, keepdims=True))
    assert np.allclose(dxo.np, want, rtol=1e-12, atol=1e-12) and untouched(buf, mask)


@pytest.mark.parametrize("shape", [(2, 5, 3, 4), (2, 5, 3, 4, 2), (2, 5, 2, 3, 2, 2), (2, 4, 2, 1, 2, 3, 2, 2)])
@pytest.mark.parametrize("x_kind", LAYOUTS)
@pytest.mark.parametrize("out_kind", LAYOUTS)
def test_W2_U4_lrn_every_layout_emulated(device, shape, x_kind, out_kind):
    rng = np.random.default_rng(1)
    a, g, yv = (rng.standard_normal(shape) for _ in range(3))
    x, _, _ = device.place(a, x_kind)
    out, buf, mask = device.poisoned(shape, out_kind)
    ops.lrn_forward(x, size=3, alpha=0.7, beta=0.6, k=1.3, out=out)
    assert np.allclose(out.np, _ref_lrn(a, 3, 0.7, 0.6, 1.3), rtol=1e-13) and untouched(buf, mask)
    dxo, buf, mask = device.poisoned(shape, x_kind)
    ops.lrn_backward(device.place(g, out_kind)[0], device.place(yv, "gapped")[0], x, size=3, out=dxo)
    assert np.allclose(dxo.np, yv + 2 * g + 3 * a) and untouched(buf, mask)


@pytest.mark.parametrize("x_kind", LAYOUTS)
@pytest.mark.parametrize("means_kind", (*LAYOUTS, None))
@pytest.mark.parametrize("out_kind", LAYOUTS)
def test_W2_divisive_normalization_every_layout_emulated(device, x_kind, means_kind, out_kind):
    rng = np.random.default_rng(2)
    shape = (2, 3, 5, 6)
    a, m, old = (rng.standard_normal(shape) for _ in range(3))
    means = None if means_kind is None else device.place(m, means_kind)[0]
    for beta in (0.0, 1.0):
        out, buf, mask = device.poisoned(shape, out_kind, old if beta else None)
        ops.divisive_normalization_forward(device.place(a, x_kind)[0], means, size=3, out=out, y_beta=beta)
        want = 3 * a + (0 if means is None else m) + beta * old
        assert np.allclose(out.np, want) and untouched(buf, mask)


@pytest.mark.parametrize("x_kind", LAYOUTS)
@pytest.mark.parametrize("out_kind", LAYOUTS)
def test_W2_dropout_every_layout_with_a_memory_indexed_mask_emulated(device, x_kind, out_kind):
    """If cuDNN indexed the mask by memory position, a backward in another layout than its forward would apply
    other elements' bits: the backward runs in the forward's layout, so every element meets its own bit."""
    rng = np.random.default_rng(3)
    shape = (3, 4, 4, 4)
    a = rng.uniform(0.5, 1.5, shape)
    out, buf, mask = device.poisoned(shape, out_kind)
    y, reserve = ops.dropout_forward(device.place(a, x_kind)[0], 0.5, out=out)
    kept = y.np != 0
    assert np.allclose(y.np[kept], 2 * a[kept]) and untouched(buf, mask) and 0.2 < kept.mean() < 0.8
    for dy_kind in LAYOUTS:
        g = rng.uniform(0.5, 1.5, shape)
        assert np.allclose(ops.dropout_backward(device.place(g, dy_kind)[0], reserve, 0.5).np, np.where(kept, 2 * g, 0))
        dxo, buf, mask = device.poisoned(shape, out_kind)
        ops.dropout_backward(device.place(g, dy_kind)[0], reserve, 0.5, out=dxo)
        assert np.allclose(dxo.np, np.where(kept, 2 * g, 0)) and untouched(buf, mask)


def test_U1_U3_dropout_on_an_overlapping_view_emulated(device):
    rng = np.random.default_rng(4)
    base = rng.uniform(0.5, 1.5, 40)
    buf = DevArr(device.mem, (40,))
    buf.np[...] = base
    x = DevArr(device.mem, (8, 33), (1, 1), ptr=ptr(buf))  # x[i, j] = base[i + j]
    want = np.lib.stride_tricks.as_strided(base, (8, 33), (8, 8))
    y, reserve = ops.dropout_forward(x, 0.5)
    kept = y.np != 0
    assert np.allclose(y.np[kept], 2 * want[kept]) and np.array_equal(buf.np, base)
    g = rng.uniform(0.5, 1.5, (8, 33))
    assert np.allclose(ops.dropout_backward(device.place(g, "gapped")[0], reserve, 0.5).np, np.where(kept, 2 * g, 0))


@pytest.mark.parametrize(
    "index",
    [
        (slice(None),) * 5 + (slice(None, None, 2),),
        (slice(1, None), slice(None), slice(None, None, 2)) + (slice(None),) * 3,
        (slice(None, None, 2),) * 6,
        (slice(2, None),) + (slice(None),) * 5,
    ],
)
def test_U4_set_and_scale_6d_emulated(device, index):
    rng = np.random.default_rng(5)
    a = rng.standard_normal((3, 4, 4, 3, 4, 6))
    buf = DevArr(device.mem, a.shape)
    buf.np[...] = a
    ptr0, shape, strides = ptr(buf), [], []
    for s, d, st in zip(index, buf.shape_, buf.strides_):
        start, stop, step = s.indices(d)
        ptr0 += 8 * start * st
        shape.append(len(range(start, stop, step)))
        strides.append(st * step)
    v = DevArr(device.mem, shape, strides, ptr=ptr0)
    want = a.copy()
    ops.scale_tensor(v, -1.5)
    want[index] *= -1.5
    assert np.array_equal(buf.np, want)
    ops.set_tensor(v, 0.25)
    want[index] = 0.25
    assert np.array_equal(buf.np, want)


@pytest.mark.parametrize("x_kind", LAYOUTS)
@pytest.mark.parametrize("out_kind", LAYOUTS)
def test_W2_transform_tensor_every_layout_emulated(device, x_kind, out_kind):
    rng = np.random.default_rng(6)
    a = rng.standard_normal((2, 3, 4, 5))
    x, _, _ = device.place(a, x_kind)
    out, buf, mask = device.poisoned(a.shape, out_kind)
    assert ops.transform_tensor(x, out=out) is out
    assert np.array_equal(out.np, a) and untouched(buf, mask)
    out, buf, mask = device.poisoned((2, 3, 7, 8), out_kind)
    ops.transform_tensor(x, pad_before=(0, 0, 1, 2), pad_after=(0, 0, 2, 1), out=out)
    assert np.array_equal(out.np, np.pad(a, ((0, 0), (0, 0), (1, 2), (2, 1)))) and untouched(buf, mask)


def test_U11_dropout_default_state_names_the_ops_argument():
    """Without state=, dropout's default state is made from x (dy in the backward): errors name that argument."""
    x = FakeCAI((7, 6))
    with pytest.raises(TypeError, match="^x must be an array of a library with a cudnnkit adapter"):
        ops.dropout_forward(x, 0.3, out=FakeCAI((7, 6)))
    with pytest.raises(TypeError, match="^x must be a CUDA array|^x .*got|^x "):
        ops.default_state((1, 2, 3), name="x")


def test_C1_default_state_checks_its_stream():
    with pytest.raises(TypeError, match="^stream must be None or a CUDA stream object"):
        ops.default_state(FakeCAI((8,)), stream=1.5)


# ----------------------------------------------------------------- the legacy descriptors' int range (fuzzer)


@pytest.mark.parametrize(
    "call, name",
    [
        (lambda: ops.pooling_forward(Arr((2, 3, 2**31 + 3, 1)), mode="avg_include_padding", window=(2, 1)), "x"),
        (lambda: ops.reduce_tensor(Arr((4, 2**31 + 1)), "norm1"), "a"),
        # every dim fits, but the span (3 * 2**30 elements) does not: cuDNN would answer NOT_SUPPORTED
        (lambda: ops.pooling_forward(Arr((3, 1, 32768, 32768)), mode="avg_include_padding", window=(2, 2)), "x"),
        # channels-last float32: the bias gradient's graph form, whose int64 strides overflow (named by the graph)
        (lambda: ops.convolution_backward_bias(Arr((2, 3, 2**62, 4), strides=(3 * 4 * 2**62, 1, 12, 3))), "dy"),
        (lambda: ops.convolution_backward_bias(Arr((2, 3, 2**31), "<f8")), "dy"),
    ],
    ids=["pooling", "reduce", "pooling-span", "conv-bias-nhwc", "conv-bias"],
)
def test_a_dim_past_cudnns_int_is_refused_naming_the_array(fake, call, name):
    """A legacy call whose descriptor cannot take a dim or stride (past 2**31 - 1) raises the ValueError of
    check_fits naming the caller's array, not the descriptor's bare "shape value ... does not fit" (found by the
    fuzzer: pooling, reduce_tensor, the convolution's bias gradient), or, where the graph form sees the array
    first, the graph layer's error naming its tensor (int64 strides overflowed); no cuDNN compute call ran."""
    ad, recs = fake
    want = rf"^({name} \(shape .*too large for cuDNN's tensor descriptors|tensor {name}: strides must hold int64)"
    with pytest.raises(ValueError, match=want):
        call()
    assert not any(r.calls for r in recs.values() if r is not recs["cudnnDropoutGetStatesSize"])


def test_bias_gradient_of_no_channels_is_empty(fake):
    """dy with zero channels (found by the fuzzer: the legacy call described a (1, 0, 1, 1) db, which cuDNN's
    descriptors refuse): nothing to write, an empty (0,) db, no cuDNN call; an empty batch still writes zeros."""
    ad, recs = fake
    db = ops.convolution_backward_bias(Arr((2, 0, 4, 5), "<f8"))
    assert tuple(db.shape) == (0,)
    assert not any(r.calls for r in recs.values() if r is not recs["cudnnDropoutGetStatesSize"])
    ops.convolution_backward_bias(Arr((0, 3, 4, 5), "<f8"))
    assert len(recs["cudnnSetTensor"].calls) == 1
