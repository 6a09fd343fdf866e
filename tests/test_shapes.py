"""Host-side shape inference against cuDNN's own GetOutputDim calls, over generated parameters."""

from __future__ import annotations

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from cudnnkit import lib
from cudnnkit.runtime import shapes

from . import oracles


@st.composite
def conv_case(draw):
    nsp = draw(st.integers(1, 3))
    groups = draw(st.integers(1, 4))
    cg = draw(st.integers(1, 4))
    kpg = draw(st.integers(1, 3))
    n = draw(st.integers(1, 4))
    k = [draw(st.integers(1, 5)) for _ in range(nsp)]
    d = [draw(st.integers(1, 3)) for _ in range(nsp)]
    p = [draw(st.integers(0, 4)) for _ in range(nsp)]
    s = [draw(st.integers(1, 4)) for _ in range(nsp)]
    x = [draw(st.integers(1, 24)) for _ in range(nsp)]
    # cuDNN's Nd conv descriptors need at least 2 spatial dims for the query: pad 1-d with a trivial dim
    if nsp == 1:
        k, d, p, s, x = k + [1], d + [1], p + [0], s + [1], x + [1]
    return (n, cg * groups, *x), (kpg * groups, cg, *k), dict(stride=s, padding=p, dilation=d, groups=groups)


@settings(max_examples=300, deadline=None)
@given(conv_case())
def test_conv_output_shape_matches_cudnn(case):
    x, w, kw = case
    try:
        ours = shapes.conv_output_shape(x, w, **kw)
    except ValueError:
        # we reject: cuDNN must reject too (or produce a non-positive size)
        try:
            theirs = oracles.cudnn_conv_output_shape(x, w, **kw)
        except lib.BadParamError:
            return
        assert min(theirs[2:]) <= 0, (x, w, kw, theirs)
        return
    assert ours == oracles.cudnn_conv_output_shape(x, w, **kw)


@st.composite
def pool_case(draw):
    nsp = draw(st.integers(2, 3))
    win = [draw(st.integers(1, 5)) for _ in range(nsp)]
    pad = [draw(st.integers(0, w - 1)) for w in win]
    stride = [draw(st.integers(1, 4)) for _ in range(nsp)]
    x = [draw(st.integers(1, 30)) for _ in range(nsp)]
    return (draw(st.integers(1, 3)), draw(st.integers(1, 5)), *x), win, dict(stride=stride, padding=pad)


@settings(max_examples=300, deadline=None)
@given(pool_case())
def test_pool_output_shape_matches_cudnn(case):
    x, win, kw = case
    try:
        ours = shapes.pool_output_shape(x, win, **kw)
    except ValueError:
        with pytest.raises(lib.BadParamError):
            oracles.cudnn_pool_output_shape(x, win, **kw)
        return
    assert ours == oracles.cudnn_pool_output_shape(x, win, **kw)


def test_grouped_channel_mismatch_is_a_clear_error_and_cudnn_agrees():
    with pytest.raises(ValueError, match=r"x has 6 channels but w expects 4 per group x 2 groups = 8"):
        shapes.conv_output_shape((1, 6, 8, 8), (4, 4, 3, 3), groups=2)
    with pytest.raises(lib.BadParamError, match="groupCount"):
        oracles.cudnn_conv_output_shape((1, 6, 8, 8), (4, 4, 3, 3), groups=2)


@pytest.mark.parametrize(
    "call, msg",
    [
        (lambda: shapes.conv_output_shape((1, 3, 8, 8), (4, 3, 3, 3), stride=0), "stride must be >= 1"),
        (lambda: shapes.conv_output_shape((1, 3, 8, 8), (4, 3, 3, 3), padding=-1), "padding must be >= 0"),
        (lambda: shapes.conv_output_shape((1, 3, 8, 8), (4, 3, 3, 3), dilation=(1, 2, 3)), "dilation must have 2"),
        (lambda: shapes.conv_output_shape((1, 3, 8, 8), (4, 3, 3), groups=1), "w must have as many dims as x"),
        (lambda: shapes.conv_output_shape((1, 3, 2, 2), (4, 3, 5, 5)), "smaller than the dilated kernel 5"),
        (lambda: shapes.conv_output_shape((1, 4, 8, 8), (6, 1, 3, 3), groups=4), "divisible by groups"),
        (lambda: shapes.conv_output_shape((1, 3, 8, 8), (4, 3, 3, 3), groups=0), "groups must be a positive int"),
        (lambda: shapes.pool_output_shape((1, 3, 8, 8), 3, padding=3), "padding 3 must be smaller than the window 3"),
        (lambda: shapes.pool_output_shape((1, 3, 2, 8), 3), "smaller than the window 3"),
        (lambda: shapes.pool_output_shape((1, 3), 3), "at least 3 dims"),
        (lambda: shapes.conv_output_shape((1, 3, 8, 8), (4, 3, 3, 3), stride=True), "stride must be an int"),
    ],
)
def test_invalid_parameters_raise_clear_value_errors(call, msg):
    with pytest.raises((ValueError, TypeError), match=msg):
        call()


def test_transpose_shape_inverts_forward():
    x, w = (2, 6, 17, 12), (8, 3, 3, 4)
    kw = dict(stride=(2, 3), padding=(1, 2), dilation=(2, 1), groups=2)
    y = shapes.conv_output_shape(x, w, **kw)
    rec = shapes.conv_transpose_output_shape(y, w, **kw)
    # forward floors: recovered size is at most the original and within stride-1 of it
    assert rec[:2] == x[:2]
    for r, xi, s in zip(rec[2:], x[2:], kw["stride"]):
        assert xi - s < r <= xi
        op = xi - r
        assert shapes.conv_transpose_output_shape(y, w, **kw, output_padding=(op, 0) if s == 2 else 0)[2] >= r


# ----------------------------------------------------------------- string padding ("valid", "same")


@settings(max_examples=200, deadline=None)
@given(
    st.integers(2, 3).flatmap(
        lambda nsp: st.tuples(
            st.lists(st.integers(1, 20), min_size=nsp, max_size=nsp),  # input
            st.lists(st.integers(1, 5), min_size=nsp, max_size=nsp),  # kernel
            st.lists(st.integers(1, 3), min_size=nsp, max_size=nsp),  # dilation
        )
    )
)
def test_same_padding_keeps_the_size_and_cudnn_agrees(case):
    x, k, d = case
    x_shape, w_shape = (2, 3, *x), (4, 3, *k)
    ours = shapes.conv_output_shape(x_shape, w_shape, padding="same", dilation=d)
    assert ours == (2, 4, *x)
    ext = tuple(di * (ki - 1) + 1 for di, ki in zip(d, k))
    pre, post = shapes.resolve_padding("same", len(x), (1,) * len(x), ext)
    assert all(b - a in (0, 1) and a + b == e - 1 for a, b, e in zip(pre, post, ext))  # torch's split
    if pre == post:  # symmetric: cuDNN's own output-dim query agrees
        assert ours == oracles.cudnn_conv_output_shape(x_shape, w_shape, padding=list(pre), dilation=d)


def test_valid_padding_is_no_padding():
    x, w = (1, 3, 9, 8), (4, 3, 3, 5)
    assert shapes.conv_output_shape(x, w, padding="valid", stride=2) == shapes.conv_output_shape(x, w, stride=2)
    assert shapes.conv_output_shape(x, w, padding="valid") == (1, 4, 7, 4)
    assert shapes.pool_output_shape(x, 3, padding="valid") == shapes.pool_output_shape(x, 3) == (1, 3, 3, 2)


def test_same_padding_for_pooling():
    assert shapes.pool_output_shape((1, 3, 9, 8), 3, stride=1, padding="same") == (1, 3, 9, 8)
    assert shapes.pool_output_shape((1, 3, 9, 8), 3, stride=1, padding="same") == oracles.cudnn_pool_output_shape(
        (1, 3, 9, 8), 3, stride=1, padding=1
    )
    assert shapes.pool_output_shape((1, 3, 9, 8), (2, 3), stride=1, padding="same") == (1, 3, 9, 8)  # (0, 1), 1
    with pytest.raises(
        ValueError, match=r"padding='same' needs stride 1 .* got stride \(3, 3\) \(the default: the window\)"
    ):
        shapes.pool_output_shape((1, 3, 9, 8), 3, padding="same")


@pytest.mark.parametrize(
    "call, exc, msg",
    [
        (
            lambda: shapes.conv_output_shape((1, 3, 8, 8), (4, 3, 3, 3), padding="same", stride=2),
            ValueError,
            r"padding='same' needs stride 1 \(as in torch\), got stride \(2, 2\)",
        ),
        (
            lambda: shapes.conv_output_shape((1, 3, 8, 8), (4, 3, 3, 3), padding="full"),
            ValueError,
            r"padding must be an int, a sequence of 2 ints, a sequence of 2 \(before, after\) pairs, 'valid' or "
            r"'same', got 'full'",
        ),
        (
            lambda: shapes.conv_output_shape((1, 3, 8, 8), (4, 3, 3, 3), padding=((1, 2), (1,))),
            ValueError,
            r"padding pairs must be \(before, after\), got \(1,\)",
        ),
        (
            lambda: shapes.conv_output_shape((1, 3, 8, 8), (4, 3, 3, 3), padding=((1, 2),)),
            ValueError,
            r"padding must have 2 \(before, after\) pairs \(one per spatial dim\), got 1",
        ),
        (
            lambda: shapes.conv_output_shape((1, 3, 8, 8), (4, 3, 3, 3), padding=((1, -2), (0, 0))),
            ValueError,
            r"padding must be >= 0",
        ),
        (
            lambda: shapes.conv_output_shape((1, 3, 8, 8), (4, 3, 3, 3), padding=1.5),
            TypeError,
            r"padding must be an int, a sequence of 2 ints, .* got 1.5",
        ),
        (
            lambda: shapes.conv_output_shape((1, 3, 8, 8), (4, 3, 3, 3), dilation=2**31),
            ValueError,
            r"dilation must be at most 2147483647",
        ),
        (
            lambda: shapes.conv_transpose_output_shape((1, 6, 8, 8), (6, 3, 3, 3), groups=4),
            ValueError,
            r"w's output channels \(6\) must be divisible by groups \(4\)",
        ),
        (
            lambda: shapes.pool_output_shape((1, 3, 8, 8), 3, padding=((0, 3), (1, 1))),
            ValueError,
            r"padding \(0, 3\) must be smaller than the window 3 \(dim 0\)",
        ),
        (
            lambda: shapes.pool_output_shape((1, 3, 8, 8), 3, ceil_mode=1),
            TypeError,
            r"ceil_mode must be a bool, got 1",
        ),
        (
            lambda: shapes.conv_output_shape((1, 3, 8, 8), (4, 3, 3, 3), padding="SAME"),
            ValueError,
            r"'valid' or 'same', got 'SAME'",
        ),
        (
            lambda: shapes.conv_transpose_output_shape((1, 4, 8, 8), (4, 3, 3, 3), padding="same"),
            TypeError,
            r"padding must be an int or a sequence of 2 ints, got 'same'",
        ),
        (
            lambda: shapes.conv_output_shape((1, 3, 8, 8), (4, 3, 3, 3), dilation="ab"),
            TypeError,
            r"dilation must be an int or a sequence of 2 ints, got 'ab'",
        ),
    ],
)
def test_string_padding_errors_name_padding(call, exc, msg):
    with pytest.raises(exc, match=msg):
        call()


def test_same_and_valid_padding_agree_with_torch():
    torch = pytest.importorskip("torch")
    x = torch.zeros(2, 3, 9, 8)
    for k, d in (((3, 5), (1, 1)), ((3, 3), (2, 3)), ((1, 3), (1, 2)), ((2, 3), (2, 1)), ((1, 1), (1, 1))):
        w = torch.zeros(4, 3, *k)
        for padding in ("same", "valid"):
            want = tuple(torch.nn.functional.conv2d(x, w, padding=padding, dilation=d).shape)
            assert shapes.conv_output_shape(tuple(x.shape), tuple(w.shape), padding=padding, dilation=d) == want


@pytest.mark.filterwarnings("ignore:Using padding=.same. with even kernel lengths")
def test_asymmetric_and_same_padding_agree_with_torch():
    """``(before, after)`` pairs, and ``"same"`` with even dilated kernels (one more after, torch's split), give
    torch's shapes; the split is checked numerically: conv of the explicitly padded input equals torch's
    ``padding="same"`` result."""
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 9, 8, generator=g, dtype=torch.float64)
    for k, d in (((2, 3), (1, 1)), ((4, 2), (1, 3)), ((2, 2), (2, 1)), ((3, 5), (1, 1))):
        w = torch.randn(4, 3, *k, generator=g, dtype=torch.float64)
        want = F.conv2d(x, w, padding="same", dilation=d)
        ext = tuple(di * (ki - 1) + 1 for di, ki in zip(d, k))
        pre, post = shapes.resolve_padding("same", 2, (1, 1), ext)
        got = F.conv2d(F.pad(x, (pre[1], post[1], pre[0], post[0])), w, dilation=d)
        assert torch.equal(got, want)
        assert shapes.conv_output_shape(tuple(x.shape), tuple(w.shape), padding="same", dilation=d) == want.shape
    for pads in (((0, 2), (1, 0)), ((3, 1), (2, 2))):
        w = torch.zeros(4, 3, 3, 3, dtype=torch.float64)
        want = F.conv2d(F.pad(x, (pads[1][0], pads[1][1], pads[0][0], pads[0][1])), w, stride=(2, 1)).shape
        assert shapes.conv_output_shape(tuple(x.shape), tuple(w.shape), padding=pads, stride=(2, 1)) == want


@settings(max_examples=300, deadline=None)
@given(
    st.integers(1, 3).flatmap(
        lambda nsp: st.tuples(
            st.lists(st.integers(1, 17), min_size=nsp, max_size=nsp),  # input
            st.lists(st.integers(1, 5), min_size=nsp, max_size=nsp),  # window
            st.lists(st.integers(1, 4), min_size=nsp, max_size=nsp),  # stride
            st.lists(st.integers(0, 2), min_size=nsp, max_size=nsp),  # padding
        )
    )
)
def test_ceil_mode_pool_shapes_agree_with_torch(case):
    """``ceil_mode=True`` gives torch's output sizes (max pooling, 1- to 3-d), including torch's rule that the last
    window starts inside the input or its padding before; torch's own limit (padding at most half the window) is
    where it refuses. An input shorter than the window: torch's ceil mode can still give one window (ours too);
    where torch computes no output, ours refuses."""
    torch = pytest.importorskip("torch")
    x, win, stride, pad = case
    if any(p > w // 2 for p, w in zip(pad, win)):
        assume(False)  # torch refuses these (cudnnkit's own limits are tested above); not counted as a pass
    pool = {1: torch.nn.functional.max_pool1d, 2: torch.nn.functional.max_pool2d, 3: torch.nn.functional.max_pool3d}
    t = torch.zeros(1, 2, *x)
    for ceil in (False, True):
        try:
            want = tuple(pool[len(x)](t, win, stride, pad, ceil_mode=ceil).shape)
        except RuntimeError:  # torch's "Invalid computed output size" (or its input-smaller-than-kernel error)
            with pytest.raises(ValueError, match="smaller than the window"):
                shapes.pool_output_shape(tuple(t.shape), win, stride=stride, padding=pad, ceil_mode=ceil)
            continue
        assert shapes.pool_output_shape(tuple(t.shape), win, stride=stride, padding=pad, ceil_mode=ceil) == want
        pre, post = shapes.pool_padding(x, win, stride=stride, padding=pad, ceil_mode=ceil)
        assert pre == tuple(pad) and all(b >= a for a, b in zip(pre, post))
        # what cuDNN is given (round-down with the extra padding after) lands on the same sizes
        assert shapes.pool_output_sizes(x, win, stride=stride, pre_padding=pre, post_padding=post) == want[2:]
