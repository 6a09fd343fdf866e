"""``python -m cudnnkit doctor``: what is installed, and does cuDNN work here.

It prints the cuDNN version, path and loaded sub-libraries, the array libraries,
each GPU with its compute capability; it runs host-side checks (descriptors,
shape inference against cuDNN's own); and, where a CUDA GPU and an array
library are present, a small real cuDNN call per op family and library
(legacy ops, and a convolution and an attention plan of the graph layer),
checked against NumPy float64 references.

Each check reports ``ok``, ``skipped`` (it cannot run here: no CUDA driver, for
the backend finalization that cuDNN 9.28 ties to ``libcuda.so.1``) or
``FAILED``. Text cuDNN writes to stdout/stderr from C during a check (such as
"Unable to load any of {libcudnn_engines_runtime_compiled.so...}") is captured
at the file-descriptor level and shown as a note under the check's row. Exit
status 0 when every check that could run here passed, 1 otherwise.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib.util
import math
import os
import platform
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator

import numpy as np

from . import __version__, lib, ops
from .graph import Graph, plan_cache
from .runtime import adapters, shapes
from .runtime.arrays import contiguous_strides
from .runtime.descriptors import owned_descriptor, tensor_descriptor
from .runtime.dtypes import scaling
from .runtime.launch import prepare

Check = Callable[[], str]

#: the reason reported for a check that needs the CUDA driver on a machine without one
NO_DRIVER = "the CUDA driver is not installed: execution and backend finalization need it"


class Skipped(Exception):
    """Raised by a check that cannot run on this machine; the row says ``skipped`` with this reason."""


def _row(cols, widths) -> str:
    return "  ".join(str(c).ljust(w) for c, w in zip(cols, widths)).rstrip()


def _table(title: str, rows: list[tuple]) -> None:
    print(f"\n{title}")
    if not rows:
        return
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  " + _row(r, widths))


def _flush_c_stdio() -> None:
    """``fflush(NULL)``: push what C code buffered for stdout/stderr to the file descriptors now."""
    try:
        ctypes.CDLL(None).fflush(None)
    except (OSError, AttributeError):  # pragma: no cover - no libc symbols in this process
        pass


@contextlib.contextmanager
def captured_fds() -> Iterator[list[str]]:
    """Collect everything written to fd 1 and fd 2 inside the block (by C code such as cuDNN's loader too).

    Yields a list that holds the captured text once the block has ended. The
    descriptors are restored in ``finally``; where one cannot be duplicated
    (closed), nothing is captured from it.
    """
    text: list[str] = []
    sys.stdout.flush()
    sys.stderr.flush()
    _flush_c_stdio()
    saved: dict[int, int] = {}
    with tempfile.TemporaryFile() as sink:
        try:
            for fd in (1, 2):
                try:
                    saved[fd] = os.dup(fd)
                    os.dup2(sink.fileno(), fd)
                except OSError:
                    saved.pop(fd, None)
            yield text
        finally:
            try:
                sys.stdout.flush()
                sys.stderr.flush()
            except Exception:  # pragma: no cover - a broken stream must not keep the fds redirected
                pass
            _flush_c_stdio()
            for fd, dup in saved.items():
                os.dup2(dup, fd)
                os.close(dup)
            sink.seek(0)
            text.append(sink.read().decode(errors="replace"))


def _notes(captured: list[str]) -> list[tuple]:
    """Rows under a check for the lines it printed (each line once, in order)."""
    lines = dict.fromkeys(ln.strip() for t in captured for ln in t.splitlines())
    return [("", "", "", f"note: printed {ln!r}") for ln in lines if ln]


def _run(name: str, fn: Check, results: list[tuple], ok: list[bool]) -> None:
    t = time.perf_counter()
    error = None
    with captured_fds() as printed:
        try:
            row = (name, "ok", fn())
        except lib.DriverNotFoundError:
            row = (name, "skipped", NO_DRIVER)
        except Skipped as exc:
            row = (name, "skipped", str(exc))
        except Exception as exc:  # report and continue
            ok[0] = False
            error = exc
            row = (name, "FAILED", f"{type(exc).__name__}: {exc}")
    ms = f"{(time.perf_counter() - t) * 1e3:.1f} ms"
    results.append((row[0], row[1], ms, row[2]))
    results.extend(_notes(printed))
    if error is not None and "-v" in sys.argv:
        traceback.print_exception(error)


def _summary(ok: bool, rows: list[tuple], scope: str = "") -> str:
    if not ok:
        return "\nPROBLEMS found (see FAILED above)"
    skipped = sum(r[1] == "skipped" for r in rows)
    parts = [p for p in (scope, f"{skipped} check(s) skipped" if skipped else "") if p]
    return "\nhealthy" + (f" ({'; '.join(parts)})" if parts else "")


# ----------------------------------------------------------------- host checks


def _dims_array(values) -> ctypes.Array:
    return (ctypes.c_int * len(values))(*values)


def _cudnn_conv_output_shape(x_shape, w_shape, *, stride, padding, dilation, groups) -> tuple[int, ...]:
    """cuDNN's own answer for a float32 NCHW convolution's output shape: ``cudnnGetConvolutionNdForwardOutputDim``
    (legacy descriptors, host-side; the parameters are per spatial dim)."""
    nd, nsp = len(x_shape), len(x_shape) - 2
    x = owned_descriptor("cudnnCreateTensorDescriptor", "cudnnDestroyTensorDescriptor")
    lib.cudnnSetTensorNdDescriptor(
        x, lib.CUDNN_DATA_FLOAT, nd, _dims_array(x_shape), _dims_array(contiguous_strides(x_shape))
    )
    w = owned_descriptor("cudnnCreateFilterDescriptor", "cudnnDestroyFilterDescriptor")
    lib.cudnnSetFilterNdDescriptor(w, lib.CUDNN_DATA_FLOAT, lib.CUDNN_TENSOR_NCHW, nd, _dims_array(w_shape))
    c = owned_descriptor("cudnnCreateConvolutionDescriptor", "cudnnDestroyConvolutionDescriptor")
    lib.cudnnSetConvolutionNdDescriptor(
        c,
        nsp,
        _dims_array(padding),
        _dims_array(stride),
        _dims_array(dilation),
        lib.CUDNN_CROSS_CORRELATION,
        lib.CUDNN_DATA_FLOAT,
    )
    lib.cudnnSetConvolutionGroupCount(c, groups)
    out = _dims_array([0] * nd)
    lib.cudnnGetConvolutionNdForwardOutputDim(c, x, w, nd, out)
    return tuple(out)


def _cudnn_pool_output_shape(x_shape, window, *, stride, padding) -> tuple[int, ...]:
    """cuDNN's own answer for a max pooling's output shape: ``cudnnGetPoolingNdForwardOutputDim`` (legacy
    descriptors, host-side; the parameters are per spatial dim)."""
    nd = len(x_shape)
    x = owned_descriptor("cudnnCreateTensorDescriptor", "cudnnDestroyTensorDescriptor")
    lib.cudnnSetTensorNdDescriptor(
        x, lib.CUDNN_DATA_FLOAT, nd, _dims_array(x_shape), _dims_array(contiguous_strides(x_shape))
    )
    pd = owned_descriptor("cudnnCreatePoolingDescriptor", "cudnnDestroyPoolingDescriptor")
    lib.cudnnSetPoolingNdDescriptor(
        pd,
        lib.CUDNN_POOLING_MAX,
        lib.CUDNN_NOT_PROPAGATE_NAN,
        nd - 2,
        _dims_array(window),
        _dims_array(padding),
        _dims_array(stride),
    )
    out = _dims_array([0] * nd)
    lib.cudnnGetPoolingNdForwardOutputDim(pd, x, nd, out)
    return tuple(out)


def _host_checks() -> list[tuple[str, Check]]:
    def tensor_desc() -> str:
        d = tensor_descriptor("float16", (8, 16, 32, 32), (16384, 1, 512, 16))
        dt, nb = ctypes.c_int(), ctypes.c_int()
        dims, strides = (ctypes.c_int * 8)(), (ctypes.c_int * 8)()
        lib.cudnnGetTensorNdDescriptor(d, 8, ctypes.byref(dt), ctypes.byref(nb), dims, strides)
        got = tuple(dims[: nb.value]), tuple(strides[: nb.value])
        assert got == ((8, 16, 32, 32), (16384, 1, 512, 16)), got
        return "NHWC fp16 set/get round trip"

    def conv_shape() -> str:
        args = ((4, 6, 17, 23), (12, 3, 3, 5))
        kw = dict(stride=(2, 1), padding=(1, 2), dilation=(1, 2), groups=2)
        ours, theirs = shapes.conv_output_shape(*args, **kw), _cudnn_conv_output_shape(*args, **kw)
        assert ours == theirs, (ours, theirs)
        return f"grouped dilated conv -> {ours} (matches cudnnGetConvolutionNdForwardOutputDim)"

    def pool_shape() -> str:
        ours = shapes.pool_output_shape((2, 3, 11, 9, 7), (3, 2, 2), stride=(2, 2, 1), padding=(1, 0, 1))
        theirs = _cudnn_pool_output_shape((2, 3, 11, 9, 7), (3, 2, 2), stride=(2, 2, 1), padding=(1, 0, 1))
        assert ours == theirs, (ours, theirs)
        return f"3-d pooling -> {ours} (matches cudnnGetPoolingNdForwardOutputDim)"

    def backend_desc() -> str:
        from .lib import backend

        with backend.BackendDescriptor("CUDNN_BACKEND_TENSOR_DESCRIPTOR") as t:
            t.set("CUDNN_ATTR_TENSOR_DATA_TYPE", lib.CUDNN_DATA_FLOAT)
            t.set("CUDNN_ATTR_TENSOR_DIMENSIONS", [2, 3, 4, 5])
            t.set("CUDNN_ATTR_TENSOR_STRIDES", [60, 20, 5, 1])
            t.set("CUDNN_ATTR_TENSOR_UNIQUE_ID", 7)
            t.set("CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT", 16)
            t.finalize()
            dims = t.get("CUDNN_ATTR_TENSOR_DIMENSIONS")
            assert list(dims) == [2, 3, 4, 5], dims
        return "backend tensor descriptor finalized and read back"

    def error_text() -> str:
        try:
            tensor_descriptor("float32", (2, 3, 4, 5), (60, 20, 5, 1))  # fine
            p = ctypes.c_void_p()
            lib.cudnnCreateRNNDescriptor(ctypes.byref(p))
            try:
                lib.cudnnSetRNNDescriptor_v8(
                    p,
                    lib.CUDNN_RNN_ALGO_STANDARD,
                    lib.CUDNN_LSTM,
                    lib.CUDNN_RNN_DOUBLE_BIAS,
                    lib.CUDNN_UNIDIRECTIONAL,
                    lib.CUDNN_LINEAR_INPUT,
                    lib.CUDNN_DATA_FLOAT,
                    lib.CUDNN_DATA_FLOAT,
                    lib.CUDNN_DEFAULT_MATH,
                    8,
                    0,
                    0,
                    1,
                    None,
                    0,
                )
            finally:
                lib.cudnnDestroyRNNDescriptor(p)
        except lib.BadParamError as exc:
            return f"bad call raises BadParamError with cuDNN's text ({exc.last_error or 'no text'})"
        raise AssertionError("hiddenSize=0 was accepted")

    return [
        ("tensor descriptor", tensor_desc),
        ("conv shape inference", conv_shape),
        ("pool shape inference", pool_shape),
        ("backend descriptor", backend_desc),
        ("error reporting", error_text),
    ]


# ----------------------------------------------------------------- GPU checks
# One small real call per op family available, for each array library.


def _rounded(a: np.ndarray, dtype: str) -> np.ndarray:
    """The float64 values ``a`` takes stored as ``dtype`` (bfloat16: round to nearest even, in NumPy)."""
    if dtype != "bfloat16":
        return np.asarray(a).astype(dtype).astype(np.float64)
    bits = np.ascontiguousarray(a, np.float32).view(np.uint32)
    bits = (bits + np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1))) & np.uint32(0xFFFF0000)
    return bits.view(np.float32).astype(np.float64)


def _put(ad, a: np.ndarray, dtype: str, device: int, strides=None):
    """A device array of ``dtype`` (strides in elements, default C order) holding ``_rounded(a, dtype)``.

    Allocated with ``ad.empty`` and filled with ``ad.copy`` from an uploaded
    host array, so any layout works. bfloat16 is staged through ``ml_dtypes``
    where it is installed (CuPy needs it for bfloat16 arrays at all), else as
    float32 that the copy converts (torch; exact, the values are bfloat16's).
    """
    host = _rounded(a, dtype)
    if dtype == "bfloat16":
        try:
            import ml_dtypes

            host = host.astype(ml_dtypes.bfloat16)
        except ImportError:
            if ad.name != "torch":
                raise Skipped(f"bfloat16 arrays of {ad.name} need ml_dtypes, which is not installed") from None
            host = host.astype(np.float32)
    else:
        host = host.astype(dtype)
    out = ad.empty(np.shape(a), dtype, device, strides)
    ad.copy(out, ad.from_numpy(host, device))
    return out


def _built(g, device: int) -> tuple:
    """``g.build(device)``, and how: ``"built in N ms"`` or ``"from the plan cache"`` (an earlier check's)."""
    hits = plan_cache(device).stats["hits"]
    t = time.perf_counter()
    plan = g.build(device)
    ms = (time.perf_counter() - t) * 1e3
    how = "from the plan cache" if plan_cache(device).stats["hits"] > hits else f"built in {ms:.0f} ms"
    return plan, how


def _gpu_checks(ad, device: int) -> list[tuple[str, Check]]:
    rng = np.random.default_rng(0)

    def handle() -> str:
        x = ad.from_numpy(np.zeros(4, np.float32), device)
        launch, _ = prepare(("x", x))
        got = ctypes.c_void_p()
        lib.cudnnGetStream(launch.handle, ctypes.byref(got))
        assert (got.value or 0) == launch.stream, (got.value, launch.stream)
        return f"cudnnCreate ok, stream {launch.stream:#x}"

    def set_tensor() -> str:
        base = ad.from_numpy(np.full((4, 6, 5, 7), np.nan, np.float32), device)
        view = base[:, ::2, 1:, :]  # strided
        launch, (v,) = prepare(("y", view))
        lib.cudnnSetTensor(
            launch.handle, tensor_descriptor(v.dtype, v.shape, v.strides), v.ptr, ctypes.byref(scaling(v.dtype, 2.5))
        )
        got = ad.to_numpy(base)
        want = np.full((4, 6, 5, 7), np.nan, np.float32)
        want[:, ::2, 1:, :] = 2.5
        assert np.array_equal(got, want, equal_nan=True), "cudnnSetTensor wrote the wrong elements"
        return "cudnnSetTensor on a strided view"

    def scale_tensor() -> str:
        a = rng.standard_normal((3, 4, 5, 6)).astype(np.float64)
        x = ad.from_numpy(a, device)
        launch, (v,) = prepare(("x", x))
        lib.cudnnScaleTensor(
            launch.handle, tensor_descriptor(v.dtype, v.shape, v.strides), v.ptr, ctypes.byref(scaling(v.dtype, -0.75))
        )
        err = np.abs(ad.to_numpy(x) - a * -0.75).max()
        assert err == 0, err
        return "cudnnScaleTensor float64 exact"

    def rel(got, ref) -> float:
        return float(np.linalg.norm(got - ref) / np.linalg.norm(ref))

    def softmax() -> str:
        a = rng.standard_normal((8, 10, 3)).astype(np.float32)
        y = ad.to_numpy(ops.softmax_forward(ad.from_numpy(a, device), axis=1)).astype(np.float64)
        ref = np.exp(a - a.max(axis=1, keepdims=True))
        ref /= ref.sum(axis=1, keepdims=True)
        err = rel(y, ref)
        assert err < 1e-5, err
        return f"softmax_forward over axis 1, rel err {err:.1e}"

    def dropout() -> str:
        a = rng.uniform(1, 2, (64, 1024)).astype(np.float32)
        x = ad.from_numpy(a, device)
        y, reserve = ops.dropout_forward(x, 0.25, state=ops.DropoutState(x, seed=7))
        y = ad.to_numpy(y)
        kept = y != 0
        assert abs(1 - kept.mean() - 0.25) < 0.02 and np.allclose(y[kept], a[kept] / 0.75, rtol=1e-6)
        return f"dropout_forward p=0.25, dropped {1 - kept.mean():.3f}"

    def lrn() -> str:
        a = rng.standard_normal((2, 7, 4, 4))
        y = ad.to_numpy(ops.lrn_forward(ad.from_numpy(a, device), size=3, alpha=0.5, beta=0.75, k=2.0))
        sq = np.pad(a**2, ((0, 0), (1, 1), (0, 0), (0, 0)))
        ref = a / (2.0 + 0.5 / 3 * (sq[:, :-2] + sq[:, 1:-1] + sq[:, 2:])) ** 0.75
        err = rel(y, ref)
        assert err < 1e-12, err
        return f"lrn_forward float64, rel err {err:.1e}"

    def spatial_transformer() -> str:
        theta = np.tile(np.array([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]]), (2, 1, 1))
        a = rng.standard_normal((2, 3, 5, 6))
        grid = ops.affine_grid_forward(ad.from_numpy(theta, device), size=(2, 3, 5, 6))
        y = ad.to_numpy(ops.grid_sample_forward(ad.from_numpy(a, device), grid))
        err = rel(y, a)
        assert err < 1e-12, err
        return f"identity affine grid + bilinear sampler reproduce x, rel err {err:.1e}"

    def ctc() -> str:
        x = ad.from_numpy(rng.standard_normal((6, 2, 4)).astype(np.float32), device)
        costs, grads = ops.ctc_loss(x, [1, 2, 3], [2, 1], [6, 4])
        c = ad.to_numpy(costs)
        g = ad.to_numpy(grads)
        assert np.isfinite(c).all() and (c > 0).all() and np.allclose(g.sum(axis=2), 0, atol=1e-5)
        return f"ctc_loss costs {np.round(c, 3).tolist()}"

    def rnn() -> str:
        r = ops.RNN("tanh", input_size=3, hidden_size=4, dtype="float64")
        like = ad.from_numpy(np.zeros(1), device)
        w = ad.from_numpy(rng.uniform(-0.5, 0.5, r.weight_count(like)), device)
        (wi, wh) = r.weight_params(w)[0]
        W, bW, R, bR = (ad.to_numpy(a) for a in (wi.matrix, wi.bias, wh.matrix, wh.bias))
        a = rng.standard_normal((3, 2, 3))
        y, hy, _ = ops.rnn_forward(ad.from_numpy(a, device), w, rnn=r)
        h, ref = np.zeros((2, 4)), []
        for t in range(3):
            h = np.tanh(a[t] @ W.T + bW + h @ R.T + bR)
            ref.append(h)
        err = rel(ad.to_numpy(y), np.array(ref))
        assert err < 1e-12 and rel(ad.to_numpy(hy)[0], h) < 1e-12, err
        return f"rnn_forward tanh float64 over 3 steps, rel err {err:.1e}"

    def graph_conv() -> str:
        dtype, (n, c, h, w, k) = "float16", (2, 8, 8, 8, 8)
        a, f = rng.standard_normal((n, c, h, w)), rng.standard_normal((k, c, 3, 3)) * 0.3
        x_arr = _put(ad, a, dtype, device, (h * w * c, 1, w * c, c))  # NHWC memory, NCHW dims
        w_arr = _put(ad, f, dtype, device, (9 * c, 1, 3 * c, c))
        g = Graph(name="doctor conv")
        x, wt = g.tensor_like(x_arr, "x"), g.tensor_like(w_arr, "w")
        y = g.mark_output(g.conv_fprop(x, wt, pre_padding=1, name="y"), dtype)
        y_arr = _put(ad, np.full(y.dims, np.nan), dtype, device, y.strides)  # poisoned: unwritten shows
        plan, how = _built(g, device)
        plan.execute({x: x_arr, wt: w_arr, y: y_arr})
        got = ad.to_numpy(y_arr).astype(np.float64)
        padded, f64 = np.pad(_rounded(a, dtype), ((0, 0), (0, 0), (1, 1), (1, 1))), _rounded(f, dtype)
        ref = sum(
            np.einsum("nchw,kc->nkhw", padded[:, :, i : i + h, j : j + w], f64[:, :, i, j])
            for i in range(3)
            for j in range(3)
        )
        assert np.isfinite(got).all(), f"plan {plan.name} left output elements unwritten (NaN)"
        err = rel(got, ref)
        assert err < 1e-2, f"plan {plan.name}: rel err {err:.1e}"
        return f"conv_fprop fp16 NHWC {n}x{c}x{h}x{w}, {k} 3x3 filters: plan {plan.name}, {how}, rel err {err:.1e}"

    def graph_sdpa() -> str:
        dtype, shape = "bfloat16", (1, 2, 64, 64)
        qa, ka, va = (rng.standard_normal(shape) for _ in range(3))
        q_arr, k_arr, v_arr = (_put(ad, t, dtype, device) for t in (qa, ka, va))
        g = Graph(name="doctor sdpa")
        q, k, v = g.tensor_like(q_arr, "q"), g.tensor_like(k_arr, "k"), g.tensor_like(v_arr, "v")
        r = g.sdpa_forward(q, k, v)
        o, st = g.mark_output(r.o), g.mark_output(r.stats)
        o_arr = _put(ad, np.full(o.dims, np.nan), o.dtype, device, o.strides)
        st_arr = _put(ad, np.full(st.dims, np.nan), st.dtype, device, st.strides)
        plan, how = _built(g, device)
        plan.execute({q: q_arr, k: k_arr, v: v_arr, o: o_arr, st: st_arr})
        got_o, got_st = (ad.to_numpy(t).astype(np.float64) for t in (o_arr, st_arr))
        q64, k64, v64 = (_rounded(t, dtype) for t in (qa, ka, va))
        s = np.einsum("bhqd,bhkd->bhqk", q64, k64) / math.sqrt(shape[3])
        mx = s.max(axis=-1, keepdims=True)
        e = np.exp(s - mx)
        ref_o, ref_st = (e / e.sum(axis=-1, keepdims=True)) @ v64, mx + np.log(e.sum(axis=-1, keepdims=True))
        assert np.isfinite(got_o).all() and np.isfinite(got_st).all(), (
            f"plan {plan.name} left output elements unwritten (NaN)"
        )
        err, err_st = rel(got_o, ref_o), rel(got_st, ref_st)
        assert err < 1e-2 and err_st < 1e-3, f"plan {plan.name}: rel err o {err:.1e}, stats {err_st:.1e}"
        return f"sdpa_forward bf16 B1 H2 S64 D64: plan {plan.name}, {how}, rel err {err:.1e} (stats {err_st:.1e})"

    return [
        ("handle", handle),
        ("tensor: set", set_tensor),
        ("tensor: scale", scale_tensor),
        ("softmax", softmax),
        ("dropout", dropout),
        ("lrn", lrn),
        ("spatial transformer", spatial_transformer),
        ("ctc loss", ctc),
        ("rnn", rnn),
        ("graph: conv plan", graph_conv),
        ("graph: sdpa plan", graph_sdpa),
    ]


# ----------------------------------------------------------------- entry


def doctor() -> int:
    ok = [True]
    print(f"cudnnkit {__version__}  (Python {platform.python_version()}, {platform.machine()})")
    try:
        loaded = lib.load()
    except ImportError as exc:
        print(f"\ncuDNN: NOT LOADED\n  {exc}")
        return 1
    major, minor, patch = lib.version_tuple()
    print(f"\ncuDNN {major}.{minor}.{patch} (cudnnGetVersion {loaded.version}), from {loaded.source}")
    print(f"  path: {loaded.path}")
    print(f"  bindings generated from headers {lib.HEADER_VERSION_STRING}; {len(lib.FUNCTIONS)} functions")
    (lo, hi), here = lib.SUPPORTED, (major, minor, patch)
    print(f"  supported releases: {'.'.join(map(str, lo))} to {'.'.join(map(str, hi))}")
    if here < lo:
        print(f"  WARNING: cuDNN {major}.{minor}.{patch} is older than the oldest supported release")
    elif here > hi:
        print("  note: newer than the bindings' headers; what it added is not bound yet (tools/gen_bindings.py)")
    else:
        newer = sum(not lib.available(n) for n in (*lib._since.FUNCTIONS, *lib._since.ENUM_MEMBERS))
        if newer:
            print(
                f"  note: {newer} names of the bindings are newer than this release; using one raises "
                "FeatureVersionError (values, attributes) or SymbolNotFoundError (functions), naming the release"
            )
    checks = []
    for sub in ("Graph", "Ops", "Cnn", "Adv"):
        fn = f"cudnn{sub}VersionCheck"
        try:
            lib.function(fn)()
            checks.append((sub.lower(), "version check ok"))
        except lib.CudnnError as exc:
            checks.append((sub.lower(), f"{exc.status_name}"))
            ok[0] = False
    subs = lib.loaded_sublibraries()
    _table(
        "sub-libraries",
        [(n, subs.get(n) or "not loaded", c) for n, c in checks]
        + [(n, p or "not loaded", "") for n, p in subs.items() if n not in dict(checks)],
    )

    libs = []
    present = []
    for name in adapters.names():
        if importlib.util.find_spec(name) is None:
            libs.append((name, "not installed", ""))
            continue
        try:
            ad = adapters.get(name)
            libs.append((name, ad.version(), f"{ad.device_count()} CUDA device(s)"))
            present.append(ad)
        except Exception as exc:
            libs.append((name, "import failed", f"{type(exc).__name__}: {exc}"))
    _table("array libraries", libs)

    host: list[tuple] = []
    for name, fn in _host_checks():
        _run(name, fn, host, ok)
    _table("host-side checks (no GPU needed)", host)

    gpus_from = next((ad for ad in present if ad.device_count() > 0), None)
    if gpus_from is None:
        why = "no array library installed" if not present else "no CUDA device visible"
        h = ctypes.c_void_p()
        with captured_fds() as printed:
            try:
                lib.cudnnCreate(ctypes.byref(h))
                lib.cudnnDestroy(h)
            except lib.CudnnError as exc:
                why += f"; cudnnCreate: {exc.status_name}: {exc.last_error}"
        print(f"\nGPU: none. Execution needs a CUDA GPU ({why}).")
        if lib.driver_available():
            print("  CUDA driver: libcuda.so.1 loads")
        else:
            also = any(r[3] == NO_DRIVER for r in host)
            print(
                "  CUDA driver: NOT INSTALLED (libcuda.so.1 not found); execution needs it"
                + ("; with this cuDNN, backend finalization too (skipped above)" if also else "")
            )
        for *_, note in _notes(printed):
            print(f"  {note}")
        print(_summary(ok[0], host, "host side"))
        return 0 if ok[0] else 1

    gpus = [(i, *gpus_from.device_info(i)) for i in range(gpus_from.device_count())]
    _table("GPUs", [(f"cuda:{i}", n, f"compute capability {cc[0]}.{cc[1]}") for i, n, cc in gpus])
    results: list[tuple] = []
    for ad in present:
        if ad.device_count() == 0:
            continue
        for name, fn in _gpu_checks(ad, 0):
            _run(f"{name} [{ad.name}]", fn, results, ok)
    _table("GPU calls on cuda:0 (one per op family and array library, graph plans included)", results)
    print(_summary(ok[0], host + results))
    return 0 if ok[0] else 1
