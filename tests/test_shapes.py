"""Host-side shape inference against cuDNN's own GetOutputDim calls, over generated parameters."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
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
    if any(di * (ki - 1) % 2 for di, ki in zip(d, k)):  # an odd total padding: not symmetric
        with pytest.raises(ValueError, match=r"padding='same' with dilated kernel \d+ in spatial dim \d+ needs"):
            shapes.conv_output_shape(x_shape, w_shape, padding="same", dilation=d)
        return
    ours = shapes.conv_output_shape(x_shape, w_shape, padding="same", dilation=d)
    assert ours == (2, 4, *x)
    pad = [di * (ki - 1) // 2 for di, ki in zip(d, k)]
    assert ours == oracles.cudnn_conv_output_shape(x_shape, w_shape, padding=pad, dilation=d)


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
    with pytest.raises(ValueError, match=r"padding='same' with window 2 in spatial dim 0 needs 1 padding in all"):
        shapes.pool_output_shape((1, 3, 9, 8), (2, 3), stride=1, padding="same")
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
            lambda: shapes.conv_output_shape((1, 3, 8, 8), (4, 3, 2, 3), padding="same"),
            ValueError,
            r"padding='same' with dilated kernel 2 in spatial dim 0 needs 1 padding in all, which cuDNN's symmetric",
        ),
        (
            lambda: shapes.conv_output_shape((1, 3, 8, 8), (4, 3, 3, 3), padding="full"),
            ValueError,
            r"padding must be an int, a sequence of 2 ints, 'valid' or 'same', got 'full'",
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
