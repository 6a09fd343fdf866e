"""RNN on the CPU: config checks, the descriptors cuDNN builds from a config (read back), bad input refused before any
GPU work, torch's parameter names, and the float64 per-step reference itself against torch.nn's modules."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from cudnnkit import lib
from cudnnkit.ops._rnn_desc import _fill_bytes
from cudnnkit.ops.rnn import RNN, RNN_DATA, rnn_backward, rnn_descriptor, rnn_forward, torch_param_names
from cudnnkit.runtime import get_cached

from .conftest import FakeCAI

# ------------------------------------------------------------------ config


@pytest.mark.parametrize(
    "kw,exc,msg",
    [
        (dict(hidden_size=0), ValueError, r"hidden_size must be an int in \[1, 2\*\*31 - 1\], got 0"),
        (dict(input_size=-1), ValueError, r"input_size must be an int in \[1, "),
        (dict(num_layers=0), ValueError, r"num_layers must be an int in \[1, "),
        (dict(hidden_size=2**31), ValueError, r"^hidden_size must be an int in \[1, 2\*\*31 - 1\], got 2147483648"),
        (dict(input_size=2**31), ValueError, r"^input_size must be an int in \[1, 2\*\*31 - 1\], got 2147483648"),
        (dict(num_layers=2**32 + 1), ValueError, r"^num_layers must be an int in \[1, 2\*\*31 - 1\]"),
        (dict(proj_size=2**31), ValueError, r"^proj_size must be an int in \[0, 2\*\*31 - 1\], got 2147483648"),
        (dict(proj_size=-1), ValueError, r"^proj_size must be an int in \[0, "),
        (dict(hidden_size=8.0), ValueError, r"^hidden_size must be an int"),
        (dict(cell="lstmx"), ValueError, "cell must be one of"),
        (dict(cell="gru", proj_size=2), ValueError, "proj_size is for LSTM only"),
        (dict(proj_size=8), ValueError, "proj_size must be smaller than hidden_size=8"),
        (dict(input_mode="skip"), ValueError, r"input_size \(4\) must equal hidden_size \(8\)"),
        (dict(bias_mode="both"), ValueError, "bias_mode must be one of"),
        (dict(dtype="bfloat16"), TypeError, "cuDNN 9 RNNs have no bfloat16"),
        (dict(dtype="float32", math_precision="float16"), ValueError, "math_precision float16 is not supported"),
        (dict(math_type="tf32"), ValueError, "math_type must be one of"),
        (dict(cell="gru", cell_clip=1.0), ValueError, "cell_clip clips the LSTM cell state"),
        (dict(cell_clip=(1.0, -1.0)), ValueError, "needs lo <= hi"),
        (dict(cell_clip=-1.0), ValueError, "cell_clip must be > 0"),
        (dict(dropout=1.0), ValueError, r"^dropout must be in \[0, 1\), got 1.0"),
        (dict(dropout=1.5), ValueError, r"^dropout must be in \[0, 1\), got 1.5"),
        (dict(dropout="0.1"), TypeError, r"^dropout must be a float in \[0, 1\)"),
        (dict(dropout_seed=-1), ValueError, r"^dropout_seed must be an int in \[0, 2\*\*64\)"),
        (dict(dtype="complex64"), TypeError, r"^dtype 'complex64' is not a type cuDNN supports"),
        (dict(math_precision="complex64"), TypeError, r"^math_precision 'complex64' is not a type cuDNN supports"),
        (dict(cell_clip=("a", 1.0)), TypeError, r"^cell_clip \(lo, hi\) must be two floats"),
        (dict(cell_clip="big"), TypeError, r"^cell_clip must be a positive float or a \(lo, hi\) pair"),
        (dict(algo="fast"), ValueError, "algo must be one of"),
        (dict(bidirectional=1), TypeError, "bidirectional must be a bool"),
        (dict(padded_io=1), TypeError, "padded_io must be a bool or None"),
    ],
)
def test_bad_config(kw, exc, msg):
    args = dict(cell="lstm", input_size=4, hidden_size=8) | kw
    with pytest.raises(exc, match=msg):
        RNN(**args)


def test_config_is_hashable_and_normalised():
    a = RNN("lstm", 4, 8, cell_clip=2, dtype="half")
    b = RNN("lstm", 4, 8, cell_clip=(-2.0, 2.0), dtype="float16")
    assert a == b and hash(a) == hash(b) and a.dtype == "float16"
    c = RNN("lstm", np.int64(4), np.int32(8), num_layers=np.int8(1), cell_clip=np.float32(2), dtype=np.float16)
    assert c == a and type(c.input_size) is int and type(c.hidden_size) is int and c.cell_clip == (-2.0, 2.0)
    assert RNN("lstm", 2**31 - 1, 8).input_size == 2**31 - 1  # the largest int32 is a size
    assert a != RNN("lstm", 4, 8, cell_clip=2.5, dtype="float16")
    r = RNN("lstm", 4, 8, num_layers=3, bidirectional=True, proj_size=5)
    assert r.hidden_shape(7) == (6, 7, 5) and r.cell_shape(7) == (6, 7, 8) and r.output_size == 5
    assert r.gates == ("W_i", "W_f", "W_c", "W_o", "R_i", "R_f", "R_c", "R_o", "P")
    assert RNN("lstm", 4, 8).gates[-1] == "R_o" and RNN("gru", 4, 8).gates == ("W_r", "W_z", "W_h", "R_r", "R_z", "R_h")


def test_math_type_follows_settings():
    from cudnnkit import settings

    assert RNN("lstm", 4, 8, dtype="float16").resolved_math() == ("float32", "tensor_op")
    assert RNN("lstm", 4, 8).resolved_math() == ("float32", "default")
    with settings(allow_tf32=False):
        assert RNN("lstm", 4, 8).resolved_math() == ("float32", "fma")
    assert RNN("lstm", 4, 8, dtype="float64").resolved_math() == ("float64", "default")
    assert RNN("lstm", 4, 8, dtype="float16", math_precision="float16", math_type="fma").resolved_math() == (
        "float16",
        "fma",
    )


# ------------------------------------------------------------------ descriptors, read back from cuDNN


def _read_back(desc):
    vals = [ctypes.c_int() for _ in range(8)] + [ctypes.c_int32() for _ in range(4)]
    drop, aux = ctypes.c_void_p(), ctypes.c_uint32()
    lib.cudnnGetRNNDescriptor_v8(desc, *[ctypes.byref(v) for v in vals], ctypes.byref(drop), ctypes.byref(aux))
    return [v.value for v in vals] + [drop.value, aux.value]


@pytest.mark.parametrize(
    "rnn",
    [
        RNN("lstm", 4, 8, num_layers=3, bidirectional=True, proj_size=5, cell_clip=(-1.5, 2.0)),
        RNN("gru", 6, 6, input_mode="skip", bias_mode="single_recurrent", dtype="float16"),
        RNN("gru", 6, 6, input_mode="skip", algo="persist_static", dtype="float16"),
        RNN("relu", 3, 7, bias_mode="none", dtype="float64", padded_io=False),
        RNN(
            "tanh",
            3,
            7,
            bias_mode="single_input",
            dtype="float16",
            math_precision="float16",
            math_type="tensor_op_allow_conversion",
        ),
        RNN("tanh", 3, 7, algo="persist_dynamic", dtype="float16", math_type="tensor_op_allow_conversion"),
    ],
)
def test_descriptor_read_back(rnn):
    d = rnn_descriptor(rnn)
    (algo, cell, bias, dirm, inmode, dt, prec, mt, insz, hid, proj, layers, drop, aux) = _read_back(d)
    prec_name, mt_name = rnn.resolved_math()
    from cudnnkit.ops import _rnn_desc as m
    from cudnnkit.runtime import cudnn_dtype

    assert (
        algo == m._ALGOS["standard" if rnn.algo == "auto" else rnn.algo]
        and cell == m._CELLS[rnn.cell]
        and bias == m._BIAS_MODES[rnn.bias_mode]
    )
    assert dirm == (lib.CUDNN_BIDIRECTIONAL if rnn.bidirectional else lib.CUDNN_UNIDIRECTIONAL)
    assert inmode == m._INPUT_MODES[rnn.input_mode]
    assert dt == cudnn_dtype(rnn.dtype) and prec == cudnn_dtype(prec_name) and mt == m._MATH[mt_name]
    assert (insz, hid, proj, layers) == (rnn.input_size, rnn.hidden_size, rnn.output_size, rnn.num_layers)
    assert drop is None and aux == (0 if rnn.padded_io is False else 1)
    mode, lo, hi = ctypes.c_int(), ctypes.c_double(), ctypes.c_double()
    lib.cudnnRNNGetClip_v9(d, ctypes.byref(mode), ctypes.byref(lo), ctypes.byref(hi))
    if rnn.cell_clip is None:
        assert mode.value == lib.CUDNN_RNN_CLIP_NONE
    else:
        assert mode.value == lib.CUDNN_RNN_CLIP_MINMAX and (lo.value, hi.value) == rnn.cell_clip


def test_descriptor_algo_override_and_auto_default():
    """``RNN()`` defaults to algo="auto", whose base descriptor is the standard algorithm's; ``algo=`` builds the
    descriptor of the algorithm auto chose."""
    from cudnnkit.ops import _rnn_desc as m

    rnn = RNN("lstm", 8, 16, dtype="float16")
    assert rnn.algo == "auto"
    assert _read_back(rnn_descriptor(rnn))[0] == lib.CUDNN_RNN_ALGO_STANDARD
    for name in ("persist_static", "persist_static_small_h", "standard"):
        assert _read_back(rnn_descriptor(rnn, algo=name))[0] == m._ALGOS[name]
    # a projection is standard-only: auto takes it (it will run standard), a named persistent algorithm does not
    assert RNN("lstm", 8, 16, proj_size=4).algo == "auto"
    with pytest.raises(ValueError, match="proj_size .* needs algo='standard'"):
        RNN("lstm", 8, 16, proj_size=4, algo="persist_static")


@pytest.mark.parametrize(
    "kw, why",
    [
        (dict(proj_size=4), "projection"),
        (dict(bias_mode="single_recurrent"), "single recurrent bias"),
        (dict(math_precision="float16"), "float16 math"),
        (dict(dtype="float64"), "float64"),
    ],
)
def test_auto_never_picks_persistent_where_cudnn_refuses_it(kw, why):
    from cudnnkit.ops._rnn_desc import _auto_algo

    kw = {"dtype": "float16", **kw}
    rnn = RNN("lstm", 256, 256, **kw)
    for n in (1, 8, 16, 64):
        assert _auto_algo(rnn, n, 100, False, True, rnn.resolved_math()) == ("standard",), why
        assert _auto_algo(rnn, n, 100, True, True, rnn.resolved_math()) == ("standard",), why


def test_auto_needs_full_length_batches():
    from cudnnkit.ops._rnn_desc import _auto_algo

    rnn = RNN("lstm", 256, 256, dtype="float16")
    assert _auto_algo(rnn, 8, 100, False, True, rnn.resolved_math()) == ("persist_static", "standard")
    assert _auto_algo(rnn, 8, 100, False, False, rnn.resolved_math()) == ("standard",)


def test_auto_rule_follows_the_measured_work_sizes():
    """The measured rule: small-h first for hidden sizes up to 128 and batches of 2 and more, persistent-static
    up to the work size per step of ``_AUTO_WORK`` (float32's far below float16's), standard always last."""
    from cudnnkit.ops._rnn_desc import _AUTO_WORK, _auto_algo

    def algos(cell, h, n, dtype, training=False):
        rnn = RNN(cell, h, h, dtype=dtype)
        return _auto_algo(rnn, n, 100, training, True, rnn.resolved_math())

    assert algos("lstm", 128, 64, "float32") == ("persist_static_small_h", "standard")  # 4*64*128 > 2**14
    assert algos("lstm", 128, 1, "float32") == ("persist_static", "standard")  # small-h needs a batch of 2+
    assert algos("gru", 512, 8, "float16") == ("persist_static", "standard")
    assert algos("lstm", 1024, 128, "float16") == ("standard",)  # 4*128*1024 = 2**19 > 2**18
    assert algos("lstm", 512, 64, "float16") == ("persist_static", "standard")  # 2**17
    assert algos("lstm", 512, 64, "float16", training=True) == ("persist_static", "standard")
    assert algos("lstm", 512, 64, "float32", training=True) == ("standard",)  # far above 3 * 2**12
    assert _AUTO_WORK[("float32", False)] < _AUTO_WORK[("float16", False)]


def test_unsupported_combination_says_what():
    from cudnnkit.lib.errors import NotSupportedError

    with pytest.raises(
        NotSupportedError,
        match="algo='persist_static', dtype=float16.*bias_mode='single_recurrent'.*persistent algorithms refuse",
    ):
        rnn_descriptor(RNN("gru", 6, 6, bias_mode="single_recurrent", algo="persist_static", dtype="float16"))


@pytest.mark.parametrize(
    "layout,dtype,fill", [("seq_major", "float32", -1.5), ("batch_major", "float16", 2.0), ("packed", "float64", 0.0)]
)
def test_rnn_data_descriptor_read_back(layout, dtype, fill):
    lengths = (5, 3, 3, 1)
    d = get_cached(RNN_DATA, (dtype, layout, 5, 4, 7, lengths, _fill_bytes(dtype, fill)))
    dt, lay, T, N, vec = (ctypes.c_int() for _ in range(5))
    arr = (ctypes.c_int * 4)()
    buf = ctypes.create_string_buffer(8)
    lib.cudnnGetRNNDataDescriptor(
        d, ctypes.byref(dt), ctypes.byref(lay), ctypes.byref(T), ctypes.byref(N), ctypes.byref(vec), 4, arr, buf
    )
    from cudnnkit.ops import _rnn_desc as m

    assert (lay.value, T.value, N.value, vec.value, tuple(arr)) == (m._LAYOUTS[layout], 5, 4, 7, lengths)
    np_dt = {"float32": np.float32, "float16": np.float16, "float64": np.float64}[dtype]
    assert np.frombuffer(buf.raw[: np.dtype(np_dt).itemsize], np_dt)[0] == fill


# ------------------------------------------------------------------ bad input, before any GPU work


def _fake(shape, typestr="<f4", strides=None):
    return FakeCAI(shape, typestr, strides=strides)


R = RNN("lstm", 4, 5, num_layers=2)
W = _fake((1000,))


@pytest.mark.parametrize(
    "call,exc,msg",
    [
        (lambda: rnn_forward(np.zeros((3, 2, 4), np.float32), W, rnn=R), TypeError, r"^x is a host array"),
        (lambda: rnn_forward(_fake((3, 2, 4), "<f8"), W, rnn=R), TypeError, "x has dtype float64 but the RNN's dtype"),
        (
            lambda: rnn_forward(_fake((3, 2, 3)), W, rnn=R),
            ValueError,
            "x has feature size 3 but the RNN's input_size is 4",
        ),
        (lambda: rnn_forward(_fake((3, 2)), W, rnn=R), ValueError, r"x must be \(T, N, input_size\)"),
        (
            lambda: rnn_forward(_fake((3, 2, 4)), W, rnn=R, seq_lengths=[3, 4]),
            ValueError,
            r"seq_lengths\[1\] is 4; each length must be in \[1, T=3\]",
        ),
        (lambda: rnn_forward(_fake((3, 2, 4)), W, rnn=R, seq_lengths=[3, 0]), ValueError, r"seq_lengths\[1\] is 0"),
        (
            lambda: rnn_forward(_fake((3, 2, 4)), W, rnn=R, seq_lengths=[3, 2, 1]),
            ValueError,
            "seq_lengths has 3 values but x has a batch of 2",
        ),
        (lambda: rnn_forward(_fake((3, 2, 4)), W, rnn=R, seq_lengths=[1.5, 2]), TypeError, "seq_lengths must be a 1-d"),
        (
            lambda: rnn_forward(_fake((5, 4)), W, rnn=R, layout="packed", seq_lengths=[2, 3]),
            ValueError,
            "decreasing order",
        ),
        (
            lambda: rnn_forward(_fake((6, 4)), W, rnn=R, layout="packed", seq_lengths=[3, 2]),
            ValueError,
            r"packed x has 6 rows but sum\(seq_lengths\) is 5",
        ),
        (lambda: rnn_forward(_fake((5, 4)), W, rnn=R, layout="packed"), ValueError, "needs seq_lengths"),
        (lambda: rnn_forward(_fake((3, 2, 4)), W, rnn=R, layout="time_major"), ValueError, "layout must be one of"),
        (
            lambda: rnn_forward(_fake((3, 2, 4)), W, rnn=RNN("gru", 4, 5, padded_io=False)),
            ValueError,
            "needs padded I/O",
        ),
        (
            lambda: rnn_forward(_fake((3, 2, 4)), W, _fake((2, 2, 4)), rnn=R),
            ValueError,
            r"hx must have shape \(2, 2, 5\), got \(2, 2, 4\)",
        ),
        (
            lambda: rnn_forward(_fake((3, 2, 4)), W, None, _fake((2, 2, 5), "<f2"), rnn=R),
            TypeError,
            "cx has dtype float16",
        ),
        (
            lambda: rnn_forward(_fake((3, 2, 4)), W, None, _fake((1, 2, 5)), rnn=RNN("gru", 4, 5)),
            ValueError,
            "cx is the LSTM cell state",
        ),
        (
            lambda: rnn_forward(_fake((3, 2, 4), strides=(16, 48, 4)), W, rnn=R),
            TypeError,
            "rnn_forward allocates y, hy, cy and its workspace with the inputs' library",
        ),
        (lambda: rnn_forward(None, W, rnn=R), TypeError, "x is required"),
        (
            lambda: rnn_backward(_fake((3, 2, 4)), _fake((3, 2, 5)), _fake((3, 2, 5)), W, None, rnn=R),
            TypeError,
            "reserve is required",
        ),
        (lambda: rnn_forward(_fake((3, 2, 4)), W, rnn="lstm"), TypeError, "rnn must be a cudnnkit.ops.RNN config"),
        (lambda: rnn_forward(_fake((3, 2, 4)), W, rnn=R, training=1), TypeError, "training must be a bool"),
        (
            lambda: rnn_backward(*[_fake((3, 2, 4))] * 2, _fake((3, 2, 5)), W, _fake((10,), "|u1"), rnn=R),
            ValueError,
            r"y must have the forward output's shape \(3, 2, 5\)",
        ),
        (
            lambda: rnn_backward(
                _fake((3, 2, 4)), _fake((3, 2, 5)), _fake((3, 2, 5)), W, _fake((10,), "|u1"), rnn=R, accumulate=True
            ),
            ValueError,
            "accumulate=True adds into an existing weight gradient",
        ),
    ],
)
def test_bad_input_before_gpu(call, exc, msg):
    with pytest.raises(exc, match=msg):
        call()


# ------------------------------------------------------------------ torch layout names; the reference itself


def _module(cell, **kw):
    torch = pytest.importorskip("torch")

    cls = {"lstm": torch.nn.LSTM, "gru": torch.nn.GRU, "relu": torch.nn.RNN, "tanh": torch.nn.RNN}[cell]
    if cell in ("relu", "tanh"):
        kw["nonlinearity"] = cell
    return cls(**kw).double()


@pytest.mark.parametrize(
    "cell,proj,bias,bidir",
    [("lstm", 0, True, True), ("lstm", 2, False, True), ("gru", 0, True, False), ("tanh", 0, False, True)],
)
def test_torch_param_names(cell, proj, bias, bidir):
    pytest.importorskip("torch")
    kw = dict(input_size=3, hidden_size=4, num_layers=2, bidirectional=bidir, bias=bias)
    if proj:
        kw["proj_size"] = proj
    rnn = RNN(cell, 3, 4, num_layers=2, bidirectional=bidir, proj_size=proj, bias_mode="double" if bias else "none")
    assert torch_param_names(rnn) == [n for n, _ in _module(cell, **kw).named_parameters()]
    with pytest.raises(ValueError, match="no torch equivalent"):
        torch_param_names(RNN(cell, 3, 4, bias_mode="single_input"))
    with pytest.raises(ValueError, match="no skip-input mode"):
        torch_param_names(RNN(cell, 4, 4, input_mode="skip"))


def _params_from_torch(mod, rnn):
    """torch's stacked parameters split into the reference's per-pseudo-layer, per-linear-id (matrix, bias)."""
    G = {"lstm": 4, "gru": 3, "relu": 1, "tanh": 1}[rnn.cell]
    H = rnn.hidden_size
    p = {n: t.detach().numpy() for n, t in mod.named_parameters()}
    out = []
    for layer in range(rnn.num_layers):
        for d in range(rnn.num_directions):
            s = f"_l{layer}" + ("_reverse" if d else "")
            row = []
            for side in ("ih", "hh"):
                for g in range(G):
                    b = p.get(f"bias_{side}{s}")
                    row.append(
                        (p[f"weight_{side}{s}"][g * H : (g + 1) * H], None if b is None else b[g * H : (g + 1) * H])
                    )
            if rnn.proj_size:
                row.append((p[f"weight_hr{s}"], None))
            out.append(row)
    return out


@pytest.mark.parametrize("cell,proj", [("lstm", 0), ("lstm", 2), ("gru", 0), ("relu", 0), ("tanh", 0)])
def test_reference_matches_torch_modules(cell, proj):
    """The per-step reference the GPU tests use, against torch.nn on the CPU (float64), with variable lengths."""
    torch = pytest.importorskip("torch")
    from .rnn_reference import Reference

    torch.manual_seed(0)
    kw = dict(input_size=3, hidden_size=4, num_layers=2, bidirectional=True)
    if proj:
        kw["proj_size"] = proj
    mod = _module(cell, **kw)
    rnn = RNN(cell, 3, 4, num_layers=2, bidirectional=True, proj_size=proj, dtype="float64")
    T, N = 5, 3
    lengths = np.array([5, 3, 2])
    rng = np.random.default_rng(0)
    x = rng.standard_normal((T, N, 3))
    hx = rng.standard_normal(rnn.hidden_shape(N))
    cx = rng.standard_normal(rnn.cell_shape(N)) if cell == "lstm" else None
    ref = Reference(rnn, x, _params_from_torch(mod, rnn), hx, cx, lengths, fill=0.0)
    ry, rhy, rcy = ref.outputs()

    xt = torch.tensor(x, requires_grad=True)
    packed = torch.nn.utils.rnn.pack_padded_sequence(xt, torch.tensor(lengths))
    h0 = torch.tensor(hx, requires_grad=True)
    c0 = None if cx is None else torch.tensor(cx, requires_grad=True)
    out, st = mod(packed, (h0, c0) if cell == "lstm" else h0)
    ty, _ = torch.nn.utils.rnn.pad_packed_sequence(out, total_length=T)
    th = st[0] if cell == "lstm" else st
    np.testing.assert_allclose(ry, ty.detach().numpy(), rtol=0, atol=1e-12)
    np.testing.assert_allclose(rhy, th.detach().numpy(), rtol=0, atol=1e-12)
    if cell == "lstm":
        np.testing.assert_allclose(rcy, st[1].detach().numpy(), rtol=0, atol=1e-12)
    dy = rng.standard_normal(ry.shape) * ref.valid[:, :, None]
    dh = rng.standard_normal(rhy.shape)
    rdx, rdhx, _, _ = ref.grads(dy, dh)
    loss = (ty * torch.tensor(dy)).sum() + (th * torch.tensor(dh)).sum()
    tdx, tdh = torch.autograd.grad(loss, [xt, h0])
    np.testing.assert_allclose(rdx, tdx.numpy(), rtol=0, atol=1e-11)
    np.testing.assert_allclose(rdhx, tdh.numpy(), rtol=0, atol=1e-11)


# ------------------------------------------------------------------ torch parameters on the CPU; collection


@pytest.mark.parametrize("with_w", [False, True])
def test_load_torch_params_names_the_cpu_parameter(with_w):
    torch = pytest.importorskip("torch")
    from cudnnkit.ops.rnn import load_torch_params

    rnn = RNN("lstm", 4, 8)
    params = dict(torch.nn.LSTM(4, 8).named_parameters())
    w = FakeCAI((4 * 8 * (4 + 8 + 2),), "<f4") if with_w else None
    with pytest.raises(TypeError, match=r"^params\['weight_ih_l0'\] is a torch tensor on cpu; cudnnkit needs a CUDA"):
        load_torch_params(rnn, params, w)


def test_load_torch_params_checks_every_parameter_before_any_gpu_work():
    from cudnnkit.ops.rnn import load_torch_params

    rnn = RNN("gru", 3, 4)
    names = torch_param_names(rnn)
    params = {
        n: FakeCAI((12, 3) if n.startswith("weight_ih") else (12, 4) if n.startswith("weight") else (12,))
        for n in names
    }
    params["bias_hh_l0"] = np.zeros(12, np.float32)  # a host array, last
    with pytest.raises(TypeError, match=r"^params\['bias_hh_l0'\] is a host array \(numpy.ndarray\)"):
        load_torch_params(rnn, params)
    params["bias_hh_l0"] = FakeCAI((12,), "<f8")
    with pytest.raises(TypeError, match=r"^params\['bias_hh_l0'\] has dtype float64 but the RNN's dtype is float32"):
        load_torch_params(rnn, params)


def test_the_rnn_gpu_tests_collect_without_torch_or_cupy():
    import pathlib
    import subprocess
    import sys

    root = pathlib.Path(__file__).resolve().parents[1]
    code = "import sys\nsys.modules['torch'] = sys.modules['cupy'] = None\nimport tests.gpu.test_rnn_gpu\n"
    subprocess.run([sys.executable, "-c", code], cwd=root, check=True)
