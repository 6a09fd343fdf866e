"""One description per op: the table the fuzzer is written over (``SPECS``).

Every public name of :mod:`cudnnkit.ops` (``cudnnkit.ops.__all__``) and the graph API's entry points
(``Graph(...)``, ``Graph.tensor``, ``pointwise``, ``matmul``, ``conv_fprop``, ``reduction``, ``resample_forward``/
``resample_backward``, ``norm_forward``/``norm_backward``, ``sdpa_forward``; each graph op built, then executed
with bindings) has an :class:`OpSpec` here saying

* how to make a VALID call (``draw``): its array arguments (:class:`Role`: input, output, in-place, index; the
  dtypes they take; whether their shape is tied to the others), their shapes relative to each other, and the
  options with their domains (:class:`Param`);
* what a valid result is (``check``): a float64 NumPy reference where one is cheap (softmax and log-softmax,
  set/scale/add/transform, LRN and divisive normalization, dropout's mask and scale, the spatial transformer,
  CTC, the RNN's forward and backward, pointwise, matmul, convolution, reduction, pooling, layer norm, SDPA), most
  of them the GPU tests' own (``tests/gpu/test_*``, ``tests/rnn_reference.py``), else shape and finiteness;
* the op-specific mutations the generic ones (:mod:`.strategies`) cannot know about (CTC label values, an RNN's
  weight size, a graph tensor's dims, raw pointers in graph bindings).

``test_fuzz_cpu.py`` asserts that every name in ``cudnnkit.ops.__all__`` has a description, so a new op fails the
suite until it is described here. The structure issue moves these descriptions onto the primitive registry in
``src``; the fuzzer then reads them from there.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from .model import A, Case, Mutation, Opaque, Rnn, Setup, State, Weights, layout_strides
from .strategies import ALL_DTYPES, FLOATS, Draw, RandomDraw, draw_bad_pointer, draw_layout

__all__ = ["Param", "Role", "OpSpec", "SPECS", "GRAPH_ENTRY_POINTS", "TOL"]


# ----------------------------------------------------------------- the description types


@dataclass
class Param:
    """The domain of a non-array argument (for the value mutations; the valid values are ``draw``'s).

    ``kind``: "float" (``lo``/``hi`` bounds, ``finite``; ``scaling``: a blend factor, whose 1e300 overflows
    unless the data is float64; ``f32``: a float parameter cuDNN keeps as a C float), "int" (``strict``: bools and
    integral floats are refused; ``int32``: 2**31 is out of range), "choice", "bool", "ints" (a tuple of ints;
    ``length``, ``fixed_length``), "dtype" (a dtype name). ``nullable``: None is valid. ``late``: checked only
    after the op's first device query (so refused on the GPU tier only). ``bad``: a custom list of
    (value, description, verdict) for the case."""

    kind: str
    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False
    hi_open: bool = False
    finite: bool = True
    scaling: bool = False
    f32: bool = False
    nullable: bool = False
    strict: bool = True
    int32: bool = False
    length: int | None = None
    fixed_length: bool = True
    strict_verdict: str = "any"
    optional_kw: bool = False
    late: bool = False
    bad: Callable[[Case], list] | None = None
    choices: tuple = ()
    #: other words a refusal may name the parameter by (``padding`` for ``pre_padding``)
    names: tuple[str, ...] = ()
    name: str = ""


@dataclass
class Role:
    """An array argument. ``kind``: "in", "out" (``out=``), "inout" (written in place), "index" (integer
    labels or lengths). ``dtypes``: the dtypes it takes; ``group``: roles of one group share a dtype;
    ``shaped``: True if its dims are tied to the others' (a changed dim is invalid), "broadcast" (a dim may
    become 1), False (any shape is a valid call); ``ranks``: the valid ranks; ``host_ok``: a host array or list
    is accepted; ``elementwise``: written element by element (an expanded view may be written); ``late``: its
    checks come after the op's first device query."""

    kind: str = "in"
    dtypes: tuple[str, ...] = FLOATS
    group: str | None = "data"
    shaped: bool | str = True
    ranks: tuple[int, int] | None = None
    required: bool = True
    host_ok: bool = False
    elementwise: bool = False
    fixed_dtype: bool = False
    late: bool = False
    #: the CPU tier may give it a dim of 2**31 or more (False where the op allocates host memory per element)
    huge: bool = True


class Base(NamedTuple):
    """A valid call as ``draw`` makes it: arguments by name, the ones passed positionally, and setup data
    (``setup["dtype"]`` the call's data type; anything the op's ``setup``/``check`` need)."""

    kwargs: dict[str, Any]
    positional: tuple[str, ...]
    setup: dict[str, Any]


@dataclass
class OpSpec:
    name: str
    draw: Callable[[Draw, str], Base]
    roles: dict[str, Role] = field(default_factory=dict)
    params: dict[str, Param] = field(default_factory=dict)
    #: runs the call on the materialized arguments (default: the public function ``name`` of cudnnkit.ops)
    call: Callable[[Any], Any] | None = None
    #: problems with a result (empty: correct); ``ctx`` gives inputs, outputs and the backend
    check: Callable[[Any, Any], list[str]] | None = None
    #: runs before the call (a forward for a backward): fills ``ctx.setup_values``
    setup: Callable[[Any], None] | None = None
    #: fills ``A(fill="derived:<key>")`` arrays from the other inputs: (ctx, key, a) -> values
    derive: Callable[[Any, str, A], np.ndarray] | None = None
    mutations: Callable[[Draw, Case, bool], tuple[Case, Mutation] | None] | None = None
    mutation_weight: float = 4.0
    shape_rule: Callable | None = None
    layout_rule: Callable | None = None
    dtype_rule: Callable | None = None
    lib_rule: Callable | None = None
    nonarray_rule: Callable | None = None
    param_rule: Callable | None = None
    streams: bool = True
    #: argument pairs whose changes may agree again (affine_grid_backward's size and dgrid): never both mutated
    coupled: tuple[frozenset[str], ...] = ()
    #: unknown keywords reach the public function (False for a program that builds the call itself)
    keywords: bool = True
    weight: float = 1.0
    graph: bool = False
    #: operands the op's setup makes (a forward's outputs for its backward), so they are not drawn as roles
    from_setup: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for n, p in self.params.items():
            p.name = n


#: relative error allowed by dtype (NaN never passes where the reference is finite)
TOL = {"float64": 1e-10, "float32": 1e-5, "float16": 1e-2, "bfloat16": 1e-2}


def _tol(dtype: str, scale: float = 1.0, f32: float | None = None, half: float | None = None) -> float:
    if dtype == "float32" and f32 is not None:
        return f32
    if dtype in ("float16", "bfloat16") and half is not None:
        return half
    return TOL.get(dtype, 1e-5) * scale


# ----------------------------------------------------------------- drawing helpers


def valid_layout(d: Draw, shape: tuple[int, ...], p: float = 0.35) -> tuple:
    """C order mostly; else a layout every op takes as an input (transposed, gapped, misaligned by an element)."""
    if not d.bool(p):
        return ("c",)
    return draw_layout(d, shape, allow=("perm", "gap"))


def dense_layout(d: Draw, shape: tuple[int, ...], p: float = 0.3) -> tuple:
    if not d.bool(p) or len(shape) < 2:
        return ("c",)
    return draw_layout(d, shape, allow=("perm",))


def nchw_or_nhwc(d: Draw, nd: int) -> tuple:
    if nd >= 3 and d.bool(0.5):
        return ("perm", (0, *range(2, nd), 1))
    return ("c",)


def draw_blend(d: Draw, kw: dict, dt: str, shape, *, out: str = "out", alpha: str = "alpha", beta: str = "beta",
               layout: tuple = ("c",), p_out: float = 0.4) -> None:  # fmt: skip
    """Maybe an ``out=`` (poisoned, or holding values when it blends) and alpha/beta."""
    if d.bool(0.3):
        kw[alpha] = d.choice([1.0, 0.5, -2.0, 0.0])
    if d.bool(p_out):
        b = d.choice([0.0, 0.0, 0.5, -1.0])
        kw[out] = A(tuple(shape), dt, fill="normal" if b else "nan", layout=layout, out=True, seed=d.seed())
        if b or d.bool(0.3):
            kw[beta] = b


def side_draw(a: A, what: str) -> Draw:
    """Draws of their own (for ``what``), seeded by array ``a``'s seed, for options added to a spec after its seeds
    were in use: the case's own draws stay as they were, so an old seed regenerates its case (the repros, the tests
    that pin them)."""
    return RandomDraw(f"{a.seed} {what}")  # type: ignore[arg-type]  # random.Random takes a str seed (sha512)


def out_tuple_call(fn: str, outs: tuple[str, ...]) -> Callable[[Any], Any]:
    """The call of an op whose outputs the spec draws by their deprecated per-output names (``dx_out=``, ...): where
    the draw set ``setup["out_tuple"]``, those given go as ``out=`` (one array or None per output), else as drawn."""

    def call(ctx: Any) -> Any:
        import cudnnkit.ops as ops

        args, kw = list(ctx.call_args()), dict(ctx.call_kwargs())
        if ctx.case.setup.get("out_tuple") and any(n in kw for n in outs):
            kw["out"] = tuple(kw.pop(n, None) for n in outs)
        return getattr(ops, fn)(*args, **kw)

    return call


def draw_axis(d: Draw, nd: int) -> Any:
    if d.bool(0.7):
        return d.int(-nd, nd - 1)
    first = d.int(0, nd - 1)
    last = d.int(first, nd - 1)
    axes = list(range(first, last + 1))
    if d.bool(0.3):
        axes = [a - nd for a in axes]
    return tuple(axes)


def axes_of(axis: Any, nd: int) -> tuple[int, ...]:
    items = [axis] if isinstance(axis, (int, np.integer)) else list(axis)
    return tuple(sorted(int(a) % nd for a in items))


def fnum(v: Any, default: float = 0.0) -> float:
    """A parameter as the op used it (a NumPy scalar or a bool, where one was accepted)."""
    if v is None:
        return default
    try:
        return float(v)
    except (TypeError, ValueError):
        return default


F = FLOATS
F3 = ("float16", "float32", "float64")  # LRN, dropout, spatial transformer: cuDNN refuses bfloat16
SCALE = Param("float", scaling=True)
BETA = Param("float", scaling=True)


def _in(dtypes=F, **kw) -> Role:
    return Role("in", dtypes, **kw)


def _out(dtypes=F, **kw) -> Role:
    return Role("out", dtypes, required=False, **kw)


# ----------------------------------------------------------------- softmax


def _softmax_draw(d: Draw, lib: str, backward: bool = False) -> Base:
    dt = d.choice(F)
    shape = tuple(d.int(0, 5) if d.bool(0.03) else d.int(1, 6) for _ in range(d.int(1, 5)))
    nd = len(shape)
    log = d.bool(0.4)
    kw: dict[str, Any] = {}
    lay = valid_layout(d, shape)
    if backward:
        kw["dy"] = A(shape, dt, layout=lay, seed=d.seed())
        kw["y"] = A(shape, dt, layout=lay if d.bool(0.8) else valid_layout(d, shape), seed=d.seed())
    else:
        kw["x"] = A(shape, dt, fill="normal:2", layout=lay, seed=d.seed())
    kw["axis"] = draw_axis(d, nd)
    if log or d.bool(0.3):
        kw["log"] = log
    if not log and d.bool(0.15):
        kw["algo"] = "fast"
    draw_blend(d, kw, dt, shape, layout=lay if lay[0] == "perm" and d.bool() else ("c",))
    return Base(kw, ("dy", "y") if backward else ("x",), {"dtype": dt})


def _softmax_check(ctx: Any, y: Any, backward: bool = False) -> list[str]:
    from ..gpu.test_softmax_gpu import ref_backward, ref_softmax

    first = "dy" if backward else "x"
    x = ctx.x(first)
    nd = x.ndim
    axes = axes_of(ctx.param("axis", -1), nd)
    log = bool(ctx.param("log", False))
    if x.size == 0:
        ref = x
    elif backward:
        ref = ref_backward(ctx.x("y"), x, axes, log)
    else:
        ref = ref_softmax(x, axes, log)
    ref = ctx.blend(ref, "out", "alpha", "beta")
    dt = ctx.dtype
    tol = _tol(dt, f32=2e-5 if backward else 1e-5)
    return ctx.compare(y, ref, dt, "dx" if backward else "y", tol)


SOFTMAX_PARAMS = {
    "axis": Param("int", bad=lambda c: _bad_axis(c)),
    "algo": Param("choice", optional_kw=True, choices=("accurate", "fast")),
    "log": Param("bool", optional_kw=True),
    "alpha": SCALE,
    "beta": BETA,
}


def _bad_axis(case: Case) -> list:
    nd = case.kwargs[next(iter(case.kwargs))].ndim if isinstance(case.kwargs[next(iter(case.kwargs))], A) else 2
    out = [
        (nd, f"{nd} (out of range)", "refuse"),
        (-nd - 1, f"{-nd - 1} (out of range)", "refuse"),
        ((), "an empty tuple", "refuse"),
        (1.0, "a float", "refuse"),
        ("1", "a str", "refuse"),
        (True, "a bool", "refuse"),
        (None, "None", "refuse"),
        (np.int64(-1), "a NumPy int", "any"),
        ((0, 0), "a repeated axis", "refuse"),
    ]
    if nd >= 3:
        out.append(((0, 2), "non-adjacent axes", "refuse"))
    return out


# ----------------------------------------------------------------- dropout


def _dropout_draw(d: Draw, lib: str, backward: bool = False) -> Base:
    dt = d.choice(F3)
    shape = tuple(d.int(0, 4) if d.bool(0.03) else d.int(1, 7) for _ in range(d.int(1, 5)))
    p = d.choice([0.0, 0.1, 0.5, 0.9, d.float(0.0, 0.95)])
    lay = valid_layout(d, shape, 0.25)
    seed = d.int(0, 2**40)
    kw: dict[str, Any] = {}
    if backward:
        kw["dy"] = A(shape, dt, layout=lay, seed=d.seed())
        kw["reserve"] = Setup("reserve")
        kw["p"] = p
        kw["state"] = Setup("state")
        setup = {"dtype": dt, "x": A(shape, dt, fill="uniform:0.5:1.5", seed=d.seed()), "p": p, "seed": seed}
    else:
        kw["x"] = A(shape, dt, fill="uniform:0.5:1.5", layout=lay, seed=d.seed())
        kw["p"] = p
        if d.bool(0.6):
            kw["state"] = State(kw["x"].with_(layout=("c",)), seed)
        setup = {"dtype": dt}
    if d.bool(0.35):
        kw["out"] = A(shape, dt, fill="nan", out=True, layout=lay if lay[0] == "perm" else ("c",), seed=d.seed())
    return Base(kw, ("dy", "reserve", "p") if backward else ("x", "p"), setup)


def _dropout_setup(ctx: Any) -> None:
    from cudnnkit import ops
    from cudnnkit.runtime import tensor_descriptor

    a = ctx.case.setup["x"]
    if not ctx.gpu:
        import ctypes

        from cudnnkit import lib

        n = ctypes.c_size_t()
        strides = layout_strides(a.shape, ("c",))[0]
        if a.size:
            lib.cudnnDropoutGetReserveSpaceSize(tensor_descriptor(a.dtype, a.shape, strides), ctypes.byref(n))
        ctx.setup_values["reserve"] = ctx.make(A((n.value,), "uint8", fill="zeros"))
        ctx.setup_values["state"] = None
        ctx.setup_values["y"] = None
        return
    x = ctx.make(a)
    st = ops.DropoutState(x, seed=ctx.case.setup["seed"])
    y, reserve = ops.dropout_forward(x, ctx.case.setup["p"], state=st)
    ctx.setup_values.update(state=st, reserve=reserve, y=ctx.got(y))


def _dropout_check(ctx: Any, res: Any, backward: bool = False) -> list[str]:
    dt = ctx.dtype
    p = fnum(ctx.param("p", 0.0))
    scale = float(np.float32(1.0 / (1.0 - p)))
    tol = {"float64": 5e-7, "float32": 2e-6, "float16": 2e-3}[dt]
    if backward:
        dy = ctx.x("dy")
        y = ctx.setup_values.get("y")
        if y is None:
            return ctx.compare(res, dy, dt, "dx", None)
        ref = np.where(y != 0, dy * scale, 0.0)
        return ctx.compare(res, ref, dt, "dx", tol)
    if not isinstance(res, tuple) or len(res) != 2:
        return [f"dropout_forward returned {type(res).__name__}, not (y, reserve)"]
    y, reserve = res
    x = ctx.x("x")
    problems = ctx.compare_shape(y, x.shape, "y")
    rs = ctx.shape_of(reserve)
    if rs is None or len(rs) != 1:
        problems.append(f"reserve has shape {rs}, not 1-d")
    got = ctx.got(y)
    if got is None or problems or x.size == 0:
        return problems
    kept = got != 0
    if np.isnan(got).any():
        return ["y holds NaN (an element was not written)"]
    if p == 0 and not kept.all():
        return [f"p=0 dropped {int((~kept).sum())} elements"]
    ref = np.where(kept, x * scale, 0.0)
    return ctx.compare(y, ref, dt, "y", tol)


DROPOUT_PARAMS = {"p": Param("float", lo=0.0, hi=1.0, hi_open=True, f32=True)}


def _dropout_mutations(d: Draw, case: Case, gpu: bool):
    kw = dict(case.kwargs)
    v, what, expect = d.choice(
        [
            ("state", "a str", "refuse"),
            (Opaque("object"), "a plain object()", "refuse"),
            (A((16,), "uint8"), "an array", "refuse"),
        ]
    )
    kw["state"] = v
    from dataclasses import replace

    return replace(case, kwargs=kw), Mutation("value", "state", f"state is {what}", expect)


def _dropout_bwd_shape(case: Case, name: str, old, new) -> str | None:
    """The reserve of a forward on another shape: the GPU tier ran that forward (a recorded reserve); the CPU
    fakes' reserve only has a size."""
    return "refuse_gpu" if name == "dy" else None


def _state_draw(d: Draw, lib: str, default: bool = False) -> Base:
    kw: dict[str, Any] = {"like": A((d.int(1, 8),), d.choice(F3), seed=d.seed())}
    if not default and d.bool(0.8):
        kw["seed"] = d.int(0, 2**64 - 1)
    return Base(kw, ("like",), {"dtype": kw["like"].dtype})


def _state_check(ctx: Any, st: Any) -> list[str]:
    from cudnnkit import ops

    if not isinstance(st, ops.DropoutState):
        return [f"returned {type(st).__name__}, not a DropoutState"]
    if st.nbytes <= 0 or st.device != 0:
        return [f"state has {st.nbytes} bytes on cuda:{st.device}"]
    return []


# ----------------------------------------------------------------- LRN and divisive normalization


def _lrn_params(d: Draw, kw: dict) -> None:
    # the formula's lrn_alpha/lrn_beta; now and then their deprecated names alpha/beta (a FutureWarning)
    pre = "lrn_" if side_draw(kw["x"], "lrn names").bool(0.8) else ""
    if d.bool(0.8):
        kw["size"] = d.int(1, 16) if d.bool(0.5) else d.choice([1, 3, 5])
    if d.bool(0.6):
        kw[pre + "alpha"] = d.choice([1e-4, 0.7, d.float(0.0, 1.5)])
    if d.bool(0.6):
        kw[pre + "beta"] = d.choice([0.75, 0.6, d.float(0.01, 1.5)])
    if d.bool(0.6):
        kw["k"] = d.choice([2.0, 1.3, d.float(0.5, 3.0)])


def _lrn_kw(ctx: Any) -> dict[str, float]:
    return {
        "size": int(ctx.param("size", 5)),
        # the deprecated alpha=/beta= win where given (a non-default lrn_alpha beside them is refused)
        "alpha": fnum(ctx.param("alpha", ctx.param("lrn_alpha", 1e-4)), 1e-4),
        "beta": fnum(ctx.param("beta", ctx.param("lrn_beta", 0.75)), 0.75),
        "k": fnum(ctx.param("k", 2.0), 2.0),
    }


LRN_PARAMS = {
    "size": Param("int", lo=1, hi=16, optional_kw=True),
    "lrn_alpha": Param("float", f32=True, optional_kw=True),
    "lrn_beta": Param("float", lo=0.01, f32=True, optional_kw=True),
    "alpha": Param("float", f32=True, optional_kw=True),
    "beta": Param("float", lo=0.01, f32=True, optional_kw=True),
    "k": Param("float", lo=1e-5, f32=True, optional_kw=True),
}


def _lrn_draw(d: Draw, lib: str, backward: bool = False) -> Base:
    dt = d.choice(F3)
    nd = d.int(3, 5)
    shape = (d.int(0, 3) if d.bool(0.05) else d.int(1, 3), d.int(1, 9), *(d.int(1, 5) for _ in range(nd - 2)))
    lay = nchw_or_nhwc(d, nd) if d.bool(0.8) else valid_layout(d, shape, 1.0)
    kw: dict[str, Any] = {}
    if backward:
        kw["dy"] = A(shape, dt, layout=lay, seed=d.seed())
        kw["y"] = A(shape, dt, fill="derived:y", layout=lay, seed=d.seed())
        kw["x"] = A(shape, dt, layout=lay, seed=d.seed())
    else:
        kw["x"] = A(shape, dt, layout=lay, seed=d.seed())
    _lrn_params(d, kw)
    if backward:
        draw_blend(d, kw, dt, shape, alpha="dx_alpha", beta="dx_beta")
    else:
        draw_blend(d, kw, dt, shape, alpha="y_alpha", beta="y_beta")
    return Base(kw, ("dy", "y", "x") if backward else ("x",), {"dtype": dt})


def _lrn_derive(ctx: Any, key: str, a: A) -> np.ndarray | None:
    from ..gpu.test_norm_dropout_gpu import ref_lrn

    x = ctx.x("x")
    if x is None or x.shape != a.shape:
        return None
    return ref_lrn(x, **_lrn_kw(ctx))[0]


def _lrn_check(ctx: Any, y: Any, backward: bool = False) -> list[str]:
    from ..gpu.test_norm_dropout_gpu import ref_lrn, ref_lrn_backward

    x, p, dt = ctx.x("x"), _lrn_kw(ctx), ctx.dtype
    if backward:
        ref = ref_lrn_backward(x, ctx.x("dy"), **p)
        ref = ctx.blend(ref, "out", "dx_alpha", "dx_beta")
        return ctx.compare(y, ref, dt, "dx", _tol(dt, f32=1e-4, half=3e-2))
    ref = ctx.blend(ref_lrn(x, **p)[0], "out", "y_alpha", "y_beta")
    return ctx.compare(y, ref, dt, "y", _tol(dt, f32=1e-5, half=1e-2))


def _divnorm_draw(d: Draw, lib: str, backward: bool = False) -> Base:
    dt = d.choice(F3)
    shape = (d.int(0, 2) if d.bool(0.05) else d.int(1, 2), d.int(1, 3), d.int(1, 7), d.int(1, 6))
    lay = nchw_or_nhwc(d, 4) if d.bool(0.8) else valid_layout(d, shape, 1.0)
    kw: dict[str, Any] = {}
    means = d.bool(0.3)
    if backward:
        kw["dy"] = A(shape, dt, layout=lay, seed=d.seed())
    kw["x"] = A(shape, dt, layout=lay, seed=d.seed())
    if means:
        kw["means"] = A(shape, dt, fill="normal:0.3", layout=lay, seed=d.seed())
    _lrn_params(d, kw)
    dense = lay[0] in ("c", "perm")
    out_lay = lay if dense else ("c",)
    if backward:
        if d.bool(0.3):
            kw["dx_out"] = A(shape, dt, fill="nan", layout=out_lay, out=True, seed=d.seed())
        if means and d.bool(0.3):
            kw["dmeans_out"] = A(shape, dt, fill="nan", layout=out_lay, out=True, seed=d.seed())
        if d.bool(0.2):
            kw["dx_alpha"] = d.choice([1.0, 0.5, -1.0])
        side = side_draw(kw["x"], "blend")
        if side.bool(0.2):  # dx_beta != 0 blends into the given outputs (dmeans_out too with means): values then
            kw["dx_beta"] = side.choice([0.5, -1.0])
            for o in ("dx_out", "dmeans_out") if means else ("dx_out",):
                kw[o] = A(shape, dt, layout=out_lay, out=True, seed=side.seed())
        elif side.bool(0.1):
            kw["dx_beta"] = 0.0
        setup = {"dtype": dt, "out_tuple": side.bool(0.6)}
        return Base(kw, ("dy", "x", "means") if means else ("dy", "x"), setup)
    draw_blend(d, kw, dt, shape, alpha="y_alpha", beta="y_beta", layout=out_lay)
    return Base(kw, ("x",), {"dtype": dt})


def ref_divnorm(x, size, alpha, beta, k):
    """cuDNN's divisive normalization without means (the formula of the GPU tests, identified on an H200)."""
    from ..gpu.test_norm_dropout_gpu import ref_divnorm as ref

    return ref(x, size, alpha, beta, k)


def ref_divnorm_backward(x, dy, size, alpha, beta, k, mirrored=True):
    from ..gpu.test_norm_dropout_gpu import ref_divnorm_backward as ref

    return ref(x, dy, size, alpha, beta, k, mirrored)


def _divnorm_check(ctx: Any, res: Any, backward: bool = False) -> list[str]:
    x, p, dt = ctx.x("x"), _lrn_kw(ctx), ctx.dtype
    means = ctx.arg("means") is not None
    tol = _tol(dt, f32=1e-5, half=1e-2)
    if backward:
        if not isinstance(res, tuple) or len(res) != 2:
            return [f"returned {type(res).__name__}, not (dx, dmeans)"]
        dx, dm = res
        if means:
            return ctx.compare(dx, None, dt, "dx", None, shape=x.shape) + ctx.compare(
                dm, None, dt, "dmeans", None, shape=x.shape
            )
        if dm is not None:
            return ["dmeans is not None without means"]
        # cuDNN 9.19's backward is the exact gradient for odd sizes; for even ones it sums over the forward's
        # window (tests/gpu/test_norm_dropout_gpu.py)
        ref = ref_divnorm_backward(x, ctx.x("dy"), **p, mirrored=p["size"] % 2 == 1) if x.size else x
        ref = ctx.blend(ref, "dx_out", "dx_alpha", "dx_beta")
        return ctx.compare(dx, ref, dt, "dx", _tol(dt, f32=1e-4, half=3e-2))
    if means:
        out0 = ctx.x("out")
        if out0 is not None and fnum(ctx.param("y_beta", 0.0), 0.0) != 0 and np.isnan(out0).any():
            # beta * NaN is NaN: only the shape can be checked
            return ctx.compare_shape(res, x.shape, "y")
        return ctx.compare(res, None, dt, "y", None, shape=x.shape)
    ref = ctx.blend(ref_divnorm(x, **p)[0] if x.size else x, "out", "y_alpha", "y_beta")
    return ctx.compare(res, ref, dt, "y", tol)


# ----------------------------------------------------------------- spatial transformer


def _theta(rng: np.random.Generator, n: int) -> np.ndarray:
    from ..gpu.test_spatial_transformer_gpu import random_theta

    return random_theta(rng, n)


def _affine_draw(d: Draw, lib: str, backward: bool = False) -> Base:
    dt = d.choice(F3)
    n = d.int(0, 3) if d.bool(0.1) else d.int(1, 3)
    size = (n, d.int(1, 4), d.int(2, 7), d.int(2, 7))
    kw: dict[str, Any] = {}
    if backward:
        kw["dgrid"] = A((n, size[2], size[3], 2), dt, layout=valid_layout(d, (n, size[2], size[3], 2), 0.2))
    else:
        kw["theta"] = A((n, 2, 3), dt, fill="derived:theta", layout=valid_layout(d, (n, 2, 3), 0.2), seed=d.seed())
    kw["size"] = size
    if d.bool(0.3):
        shape = (n, 2, 3) if backward else (n, size[2], size[3], 2)
        kw["out"] = A(shape, dt, fill="nan", out=True, seed=d.seed())
    return Base(kw, ("dgrid",) if backward else ("theta",), {"dtype": dt})


def _st_derive(ctx: Any, key: str, a: A) -> np.ndarray | None:
    rng = np.random.default_rng(a.seed)
    if key == "theta":
        return _theta(rng, a.shape[0]) if a.ndim == 3 and a.shape[1:] == (2, 3) else None
    if key == "grid":
        from ..gpu.test_spatial_transformer_gpu import sample_grid

        x = ctx.case.kwargs.get("x")
        if not isinstance(x, A) or x.ndim != 4 or a.ndim != 4 or x.shape[2] < 2 or x.shape[3] < 2:
            return None
        n, ho, wo, _ = a.shape
        return sample_grid(rng, n, ho, wo, x.shape[2], x.shape[3], dtype=a.dtype, margin=0.08)
    return None


def _affine_check(ctx: Any, res: Any, backward: bool = False) -> list[str]:
    from ..gpu.test_spatial_transformer_gpu import ref_affine_grid, ref_affine_grid_backward

    size, dt = tuple(ctx.param("size")), ctx.dtype
    tol = _tol(dt, f32=1e-5, half=5e-3)
    if backward:
        return ctx.compare(res, ref_affine_grid_backward(ctx.x("dgrid"), size), dt, "dtheta", tol * 4)
    return ctx.compare(res, ref_affine_grid(ctx.x("theta"), size), dt, "grid", tol)


def _sample_draw(d: Draw, lib: str, backward: bool = False) -> Base:
    dt = d.choice(F3)
    n = d.int(0, 2) if d.bool(0.08) else d.int(1, 2)
    c, h, w, ho, wo = d.int(1, 4), d.int(2, 6), d.int(2, 6), d.int(1, 5), d.int(1, 5)
    xs = (n, c, h, w)
    kw: dict[str, Any] = {
        "x": A(xs, dt, layout=nchw_or_nhwc(d, 4) if d.bool(0.6) else valid_layout(d, xs), seed=d.seed())
    }
    kw["grid"] = A((n, ho, wo, 2), dt, fill="derived:grid", seed=d.seed())
    if backward:
        kw["dy"] = A((n, c, ho, wo), dt, layout=valid_layout(d, (n, c, ho, wo), 0.2), seed=d.seed())
        if d.bool(0.3):
            kw["dx_out"] = A(xs, dt, fill="nan", out=True, seed=d.seed())
        if d.bool(0.3):
            kw["dgrid_out"] = A((n, ho, wo, 2), dt, fill="nan", out=True, seed=d.seed())
        if d.bool(0.2):
            kw["alpha"] = d.choice([0.5, 2.0])
        _sample_blends(kw)
        return Base(kw, ("x", "grid", "dy"), {"dtype": dt, "out_tuple": side_draw(kw["x"], "out").bool(0.6)})
    draw_blend(d, kw, dt, (n, c, ho, wo))
    return Base(kw, ("x", "grid"), {"dtype": dt})


def _sample_blends(kw: dict) -> None:
    """The backward's other blends, from a side generator (old seeds regenerate): maybe ``beta`` into a given
    ``dx_out`` (which then holds values, not NaN), ``alpha_dgrid``, and ``beta_dgrid`` into a given ``dgrid_out``."""
    side = side_draw(kw["x"], "sample blends")
    for out, alpha, beta in (("dx_out", None, "beta"), ("dgrid_out", "alpha_dgrid", "beta_dgrid")):
        if alpha is not None and side.bool(0.35):
            kw[alpha] = side.choice([0.5, -2.0, 0.0, 1.0])
        if out in kw and side.bool(0.5):
            kw[beta] = b = side.choice([0.5, -1.0, 0.0])
            if b:
                kw[out] = kw[out].with_(fill="normal")


def _sample_shape(case: Case, name: str, old, new) -> str | None:
    """x's H and W are free (the grid says where to sample); the grid's H_out, W_out are free in the forward
    without out=; N (and C, tied to dy and out) are tied."""
    backward = "dy" in case.kwargs
    out = "out" in case.kwargs or "dx_out" in case.kwargs
    if len(new) != 4 or new[0] != old[0] or any(d < 1 for d in new[1:]):
        return "refuse"
    if name == "x":
        return "any" if new[1] == old[1] or not (backward or out) else "refuse"
    if name == "grid" and not backward and not out:
        return "any" if new[3] == 2 else "refuse"
    return "refuse"


def _sample_check(ctx: Any, res: Any, backward: bool = False) -> list[str]:
    from ..gpu.test_spatial_transformer_gpu import ref_grid_sample, ref_grid_sample_backward

    x, g, dt = ctx.x("x"), ctx.x("grid"), ctx.dtype
    tol = _tol(dt, f32=2e-5, half=1e-2)
    if backward:
        if not isinstance(res, tuple) or len(res) != 2:
            return [f"returned {type(res).__name__}, not (dx, dgrid)"]
        dxr, dgr = ref_grid_sample_backward(x, g, ctx.x("dy"))
        dxr = ctx.blend(dxr, "dx_out", "alpha", "beta")
        dgr = ctx.blend(dgr, "dgrid_out", "alpha_dgrid", "beta_dgrid")
        return ctx.compare(res[0], dxr, dt, "dx", tol) + ctx.compare(res[1], dgr, dt, "dgrid", tol * 5)
    return ctx.compare(res, ctx.blend(ref_grid_sample(x, g), "out", "alpha", "beta"), dt, "y", tol)


ST_SIZE = Param("ints", length=4, bad=lambda c: _bad_size(c))


def _bad_size(case: Case) -> list:
    n, c, h, w = case.kwargs["size"]
    return [
        ((n, c, h), "3 values", "refuse"),
        ((n, c, h, w, 1), "5 values", "refuse"),
        (7, "an int", "refuse"),
        ((n, c, float(h), w), "a float H", "refuse"),
        ((n, True, h, w), "a bool C", "refuse"),
        ((n, c, 0, w), "H = 0", "refuse"),
        ((n, c, 1, w), "H = 1", "refuse"),
        ((-1, c, h, w), "N = -1", "refuse"),
        ((n, c, 2**31, w), "H = 2**31", "refuse"),
        ((n + 1, c, h, w), "another N", "refuse"),
        ((n, c, h + 1, w), "another H", "refuse" if "dgrid" in case.kwargs else "any"),
        (None, "None", "refuse"),
        ("abcd", "a str", "refuse"),
        ((n, c + 1, h, w), "another C (unused)", "any"),
        ([n, c, h, w], "a list", "any"),
        (tuple(np.int64(v) for v in (n, c, h, w)), "NumPy ints", "any"),
    ]


# ----------------------------------------------------------------- CTC


def _ctc_batch(d: Draw, T: int, N: int, A_: int) -> tuple[list[int], list[int], list[int]]:
    labels, ll, il = [], [], []
    for _ in range(N):
        L = d.int(1, max(1, min(T // 2, 6)))
        lab = [d.int(1, A_ - 1) for _ in range(L)]
        if L >= 2 and d.bool(0.4):
            i = d.int(1, L - 1)
            lab[i] = lab[i - 1]
        need = L + sum(1 for i in range(1, L) if lab[i] == lab[i - 1])
        labels += lab
        ll.append(L)
        il.append(d.int(min(need, T), T))
    return labels, ll, il


def _index(d: Draw, values: list[int], name: str) -> Any:
    form = d.choice(["list", "numpy", "device_int32", "device_int32", "device_int64"])
    if form == "list":
        return list(values)
    if form == "numpy":
        return A((len(values),), "int64", lib="host", values=tuple(values))
    return A((len(values),), "int32" if form == "device_int32" else "int64", values=tuple(values))


def _ctc_draw(d: Draw, lib: str) -> Base:
    T, N, A_ = d.int(2, 12), (d.int(0, 3) if d.bool(0.08) else d.int(1, 3)), d.int(2, 6)
    norm = "softmax" if d.bool(0.8) else "none"
    labels, ll, il = _ctc_batch(d, T, N, A_)
    kw: dict[str, Any] = {
        "x": A(
            (T, N, A_),
            "float32",
            fill="probs" if norm == "none" else "normal:2",
            layout=valid_layout(d, (T, N, A_), 0.2),
            seed=d.seed(),
        ),  # fmt: skip
        "labels": _index(d, labels, "labels"),
        "label_lengths": _index(d, ll, "label_lengths"),
        "input_lengths": _index(d, il, "input_lengths"),
    }
    if norm != "softmax" or d.bool(0.2):
        kw["normalization"] = norm
    if d.bool(0.3):
        kw["algo"] = d.choice(["deterministic", "non_deterministic"])
    if d.bool(0.2):
        kw["oob_grads"] = d.choice(["zero", "skip"])
    if d.bool(0.2):
        kw["costs_out"] = A((N,), "float32", fill="nan", out=True, seed=d.seed())
    if d.bool(0.2):
        kw["grads_out"] = A((T, N, A_), "float32", fill="nan", out=True, seed=d.seed())
    side = side_draw(kw["x"], "ctc")
    if side.bool(0.1):
        kw["blank"] = 0  # the only blank cuDNN has
    return Base(
        kw, ("x", "labels", "label_lengths", "input_lengths"), {"dtype": "float32", "out_tuple": side.bool(0.6)}
    )


def _index_values(v: Any, ctx: Any, name: str) -> np.ndarray:
    if isinstance(v, A):
        seen_values = ctx.x(name)  # what the array holds: an expanded layout repeats its first value
        if seen_values is not None:
            return np.rint(np.asarray(seen_values, np.float64)).astype(np.int64).reshape(-1)
        return np.asarray(v.values, np.int64)
    return np.asarray(ctx.case.kwargs[name], np.int64)


def _ctc_check(ctx: Any, res: Any) -> list[str]:
    from ..gpu.test_ctc_gpu import ctc_ref, valid_frames

    if not isinstance(res, tuple) or len(res) != 2:
        return [f"returned {type(res).__name__}, not (costs, grads)"]
    x = ctx.x("x")
    T, N, A_ = x.shape
    labels = _index_values(ctx.case.kwargs["labels"], ctx, "labels")
    ll = _index_values(ctx.case.kwargs["label_lengths"], ctx, "label_lengths")
    il = _index_values(ctx.case.kwargs["input_lengths"], ctx, "input_lengths")
    lab = ctx.case.kwargs["labels"]
    if isinstance(lab, A) and len(lab.shape) == 2:  # padded (N, S): row n's first label_lengths[n] values, packed
        rows = labels.reshape(lab.shape)
        labels = np.concatenate([rows[n, : ll[n]] for n in range(lab.shape[0])] or [labels[:0]])
    norm = ctx.param("normalization", "softmax")
    costs, grads = res
    problems = ctx.compare_shape(costs, (N,), "costs") + ctx.compare_shape(grads, (T, N, A_), "grads")
    c, g = ctx.got(costs), ctx.got(grads)
    if problems or c is None or N == 0:
        return problems
    ref_c, ref_g = ctc_ref(x, labels, ll, il, norm if norm in ("softmax", "none") else "softmax")
    finite = np.isfinite(ref_c)
    if not np.array_equal(np.isfinite(c), finite):
        return [f"costs {c} vs reference {ref_c}: finiteness differs"]
    err = np.abs(c[finite] - ref_c[finite]).max() / max(np.abs(ref_c[finite]).max(), 1e-30) if finite.any() else 0.0
    if err > 1e-4:
        problems.append(f"costs: rel error {err:.3g} (got {c}, reference {ref_c})")
    if norm == "softmax":
        mask = valid_frames(il, x.shape) & finite[None, :, None]
        problems += ctx.compare(grads, np.where(mask, ref_g, 0.0), "float32", "grads", 1e-4, mask=mask)
    elif np.isnan(g).any():
        problems.append("grads hold NaN")
    return problems


def _ctc_mutations(d: Draw, case: Case, gpu: bool):
    from dataclasses import replace

    kw = dict(case.kwargs)
    x = kw["x"]
    T, N, A_ = x.shape if isinstance(x, A) and x.ndim == 3 else (4, 1, 3)
    labels = list(_raw(kw["labels"]))
    ll, il = list(_raw(kw["label_lengths"])), list(_raw(kw["input_lengths"]))
    options = []
    if labels:
        options += [
            ("labels", "a label 0 (the blank)", lambda: _set(labels, 0, 0)),
            ("labels", f"a label {A_} (>= A)", lambda: _set(labels, -1, A_)),
            ("labels", "a negative label", lambda: _set(labels, 0, -3)),
            ("labels", "one label too many", lambda: labels + [1]),
        ]
    if ll:
        options += [
            ("label_lengths", "a label length of 0", lambda: _set(ll, 0, 0)),
            ("label_lengths", "a label length longer than its input", lambda: _set(ll, 0, il[0] + 1)),
            ("label_lengths", "N + 1 values", lambda: ll + [1]),
            ("label_lengths", "a negative length", lambda: _set(ll, -1, -1)),
        ]
    if il:
        options += [
            ("input_lengths", f"an input length of {T + 1} (> T)", lambda: _set(il, 0, T + 1)),
            ("input_lengths", "an input length of 0", lambda: _set(il, -1, 0)),
            ("input_lengths", "N - 1 values", lambda: il[:-1]),
            ("input_lengths", "2**31", lambda: _set(il, 0, 2**31)),
        ]
    if not options:
        return None
    name, what, fn = d.choice(options)
    old = kw[name]
    new = fn()
    if isinstance(old, A):
        kw[name] = old.with_(shape=(len(new),), values=tuple(new))
    elif isinstance(old, list):
        kw[name] = list(new)
    else:
        kw[name] = new
    return replace(case, kwargs=kw), Mutation("ctc", name, f"{name}: {what}", "refuse")


def _raw(v: Any) -> list[int]:
    if isinstance(v, A):
        return list(v.values or ())
    if isinstance(v, (list, tuple)):
        return list(v)
    return []


def _set(seq: list, i: int, v: int) -> list:
    seq = list(seq)
    seq[i] = v
    return seq


CTC_ROLES = {
    "x": _in(("float32",), shaped=True),
    "labels": Role("index", ("int32", "int64", "int8", "uint8"), None, shaped=False, host_ok=True),
    "label_lengths": Role("index", ("int32", "int64", "int8", "uint8"), None, shaped=True, host_ok=True),
    "input_lengths": Role("index", ("int32", "int64", "int8", "uint8"), None, shaped=True, host_ok=True),
    "costs_out": _out(("float32",), fixed_dtype=True),
    "grads_out": _out(("float32",), fixed_dtype=True),
}


def _ctc_shape_rule(case: Case, name: str, old, new) -> str | None:
    if name == "labels":
        x, ll = case.kwargs.get("x"), _raw(case.kwargs.get("label_lengths"))
        if (
            len(new) == 2
            and isinstance(x, A)
            and len(x.shape) == 3
            and new[0] == x.shape[1]
            and (not ll or new[1] >= max(ll))
        ):
            return "any"  # padded (N, S) labels, S at least every length (any S when N = 0): a valid call
        return "refuse"  # sum(label_lengths) no longer matches
    if name == "x" and len(new) == 3 and len(old) == 3 and "grads_out" not in case.kwargs:
        labels = _raw(case.kwargs.get("labels"))
        il = _raw(case.kwargs.get("input_lengths"))
        T, N, A_ = new
        if N == old[1] and (not il or T >= max(il)) and (not labels or A_ > max(labels)):
            return "any"  # longer inputs or a larger alphabet are a valid call
    return None


def _ctc_index_dtype(case: Case, name: str, new: str) -> str | None:
    if name in ("labels", "label_lengths", "input_lengths"):
        a = case.kwargs[name]
        if isinstance(a, A) and a.lib == "host" and a.size == 0:
            return "any"  # an empty host array of floats is taken as no values (np.asarray([]) is float64)
        if isinstance(a, A) and a.lib == "host":
            return "any" if new in ("int8", "uint8", "int32", "int64") else "refuse"
    return None


# ----------------------------------------------------------------- RNN


def _rnn_fields(d: Draw, dtype: str | None = None) -> dict[str, Any]:
    cell = d.choice(["relu", "tanh", "lstm", "gru"])
    h = d.int(1, 6)
    f: dict[str, Any] = {"cell": cell, "input_size": d.int(1, 6), "hidden_size": h}
    if d.bool(0.3):
        f["num_layers"] = d.int(1, 2)
    if d.bool(0.3):
        f["bidirectional"] = d.bool()
    if cell == "lstm" and h >= 2 and d.bool(0.25):
        f["proj_size"] = d.int(1, h - 1)
    if d.bool(0.25):
        f["bias_mode"] = d.choice(["double", "single_input", "single_recurrent", "none"])
    if d.bool(0.15):
        f["input_mode"] = "skip"
        f["input_size"] = h
    f["dtype"] = dtype or d.choice(["float32", "float64", "float16"])
    if cell == "lstm" and d.bool(0.15):
        f["cell_clip"] = d.choice([1.0, (-0.5, 2.0)])
    if d.bool(0.1):
        f["padded_io"] = True
    if d.bool(0.05):
        f["dropout"] = 0.0
    return f


def _rnn_named_defaults(side: Draw, f: dict[str, Any]) -> None:
    """Options of the RNN whose values here give the reference's results: the dropout seed (no dropout), the
    standard algorithm ("auto"'s fallback), the default math precision, and a math type (float32: FMA, which
    ``allow_tf32=False`` resolves to; the others their default)."""
    if side.bool(0.05):
        f["dropout_seed"] = side.int(0, 2**32)
    if side.bool(0.05):
        f["algo"] = "standard"
    if side.bool(0.05):
        f["math_precision"] = "float64" if f["dtype"] == "float64" else "float32"
    if side.bool(0.05):
        f["math_type"] = {"float16": "tensor_op", "float32": "fma", "float64": "default"}[f["dtype"]]


def _rnn_obj(fields: dict[str, Any]) -> Any:
    from cudnnkit import ops

    return ops.RNN(**fields)


RNN_PARAMS = {
    "cell": Param("choice"),
    "input_size": Param("int", lo=1, hi=2**31 - 1, int32=True),
    "hidden_size": Param("int", lo=1, hi=2**31 - 1, int32=True),
    "num_layers": Param("int", lo=1, hi=2**31 - 1, int32=True, optional_kw=True),
    "bidirectional": Param("bool", strict_verdict="refuse", optional_kw=True),
    "input_mode": Param("choice", optional_kw=True),
    "bias_mode": Param("choice", optional_kw=True),
    "proj_size": Param("int", lo=0, int32=True, optional_kw=True),
    "dropout": Param("float", lo=0.0, hi=1.0, hi_open=True, optional_kw=True),
    "dropout_seed": Param("int", lo=0, hi=2**64 - 1, optional_kw=True),
    "algo": Param("choice", optional_kw=True, choices=("persist_static", "persist_dynamic", "persist_static_small_h")),
    "dtype": Param("dtype", optional_kw=True),
    "math_precision": Param("dtype", nullable=True, optional_kw=True),
    "math_type": Param(
        "choice", nullable=True, optional_kw=True, choices=("default", "tensor_op", "tensor_op_allow_conversion", "fma")
    ),
    "padded_io": Param("bool", strict_verdict="refuse", nullable=True, optional_kw=True),
}


def _rnn_param_rule(case: Case, name: str, value: Any) -> str | None:
    f = case.kwargs
    if name == "proj_size":
        if isinstance(value, (int, np.integer)) and not isinstance(value, bool) and value >= 0:
            return "any" if value == 0 or (f.get("cell") == "lstm" and value < f.get("hidden_size", 1)) else "refuse"
    if name in ("input_size", "hidden_size") and f.get("input_mode") == "skip":
        # skip needs input_size == hidden_size: a value equal to the other one (a NumPy int of it) stays valid
        other = f.get("hidden_size" if name == "input_size" else "input_size")
        ok = isinstance(value, (int, np.integer)) and not isinstance(value, bool) and value == other
        return "any" if ok else "refuse"
    if name in ("hidden_size",) and f.get("proj_size"):
        if isinstance(value, (int, np.integer)) and not isinstance(value, bool) and value > f["proj_size"]:
            return "any"
        return "refuse"
    if name == "dtype" and value is np.float32:
        return "any"
    if name == "math_precision" and f.get("dtype") != "float16" and value is not None:
        return "refuse" if value not in (np.float32,) or f.get("dtype") != "float32" else "any"
    if name == "dropout" and isinstance(value, (float, np.floating)) and value == value and 0 < value < 1:
        return "any"
    return None


def _rnn_ctor_draw(d: Draw, lib: str) -> Base:
    return Base(_rnn_fields(d), ("cell", "input_size", "hidden_size"), {"dtype": "float32"})


def _rnn_ctor_check(ctx: Any, r: Any) -> list[str]:
    from cudnnkit import ops

    if not isinstance(r, ops.RNN):
        return [f"returned {type(r).__name__}"]
    f = ctx.case.kwargs
    for k in ("cell", "input_size", "hidden_size", "num_layers", "bias_mode", "input_mode", "proj_size"):
        if k in f and getattr(r, k) != f[k]:
            return [f"RNN.{k} is {getattr(r, k)!r}, given {f[k]!r}"]
    if r.output_size != (r.proj_size or r.hidden_size):
        return [f"output_size {r.output_size}"]
    return []


def torch_shapes(f: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """The parameter shapes ``torch.nn.LSTM``/``GRU``/``RNN`` give an RNN config (torch's layout)."""
    g = {"lstm": 4, "gru": 3, "relu": 1, "tanh": 1}[f["cell"]]
    h, i = f["hidden_size"], f["input_size"]
    p = f.get("proj_size", 0) or h
    dirs = 2 if f.get("bidirectional") else 1
    out: dict[str, tuple[int, ...]] = {}
    for layer in range(f.get("num_layers", 1)):
        for dr in range(dirs):
            s = f"_l{layer}" + ("_reverse" if dr else "")
            inp = i if layer == 0 else dirs * p
            out[f"weight_ih{s}"] = (g * h, inp)
            out[f"weight_hh{s}"] = (g * h, p)
            if f.get("bias_mode", "double") == "double":
                out[f"bias_ih{s}"] = (g * h,)
                out[f"bias_hh{s}"] = (g * h,)
            if f.get("proj_size"):
                out[f"weight_hr{s}"] = (p, h)
    return out


def _seq_draw(d: Draw, f: dict[str, Any]) -> tuple[str, int, int, list[int] | None]:
    layout = d.choice(["seq_major", "seq_major", "batch_major", "packed"])
    T, N = d.int(1, 5), d.int(1, 4)
    lengths = None
    if layout == "packed":
        lengths = sorted((d.int(1, T) for _ in range(N)), reverse=True)
        lengths[0] = T
    elif d.bool(0.4):
        lengths = [d.int(1, T) for _ in range(N)]
    return layout, T, N, lengths


def _x_shape(layout: str, T: int, N: int, feat: int, lengths) -> tuple[int, ...]:
    if layout == "packed":
        return (int(sum(lengths)), feat)
    return (T, N, feat) if layout == "seq_major" else (N, T, feat)


def _rnn_draw(d: Draw, lib: str, backward: bool = False) -> Base:
    f = _rnn_fields(d)
    dt = f["dtype"]
    D = 2 if f.get("bidirectional") else 1
    L, H = f.get("num_layers", 1), f["hidden_size"]
    P = f.get("proj_size") or H
    layout, T, N, lengths = _seq_draw(d, f)
    xs = _x_shape(layout, T, N, f["input_size"], lengths)
    ys = _x_shape(layout, T, N, D * P, lengths)
    kw: dict[str, Any] = {"x": A(xs, dt, fill="normal:0.8", layout=valid_layout(d, xs, 0.15), seed=d.seed())}
    _rnn_named_defaults(side_draw(kw["x"], "rnn"), f)
    kw["w"] = Weights(seed=d.seed())
    if d.bool(0.4):
        kw["hx"] = A((L * D, N, P), dt, fill="normal:0.5", seed=d.seed())
    if f["cell"] == "lstm" and d.bool(0.4):
        kw["cx"] = A((L * D, N, H), dt, fill="normal:0.5", seed=d.seed())
    kw["rnn"] = Rnn(tuple(f.items()))
    if layout != "seq_major":
        kw["layout"] = layout
    if lengths is not None:
        kw["seq_lengths"] = list(lengths)
    setup = {"dtype": dt, "rnn": f, "layout": layout, "T": T, "N": N, "lengths": lengths, "ys": ys, "w": kw["w"],
             "fwd": {"x": kw["x"], "hx": kw.get("hx"), "cx": kw.get("cx")}}  # fmt: skip
    if backward:
        kw["y"] = Setup("y")
        kw["dy"] = A(ys, dt, fill="normal:0.5", seed=d.seed())
        kw["reserve"] = Setup("reserve")
        if d.bool(0.3):
            kw["dhy"] = A((L * D, N, P), dt, fill="normal:0.5", seed=d.seed())
        if f["cell"] == "lstm" and d.bool(0.3):
            kw["dcy"] = A((L * D, N, H), dt, fill="normal:0.5", seed=d.seed())
        side = side_draw(kw["dy"], "reserve")
        if side.bool(0.2):  # True: the backward works on a copy of the reserve (the same gradients)
            kw["keep_reserve"] = side.bool(0.7)
        return Base(kw, ("x", "y", "dy", "w", "reserve"), setup)
    if d.bool(0.3):
        kw["training"] = True
    if layout != "packed" and lengths is not None and d.bool(0.3):
        kw["padding_fill"] = d.choice([0.0, -1.5])
    if d.bool(0.2):
        kw["out"] = A(ys, dt, fill="nan", out=True, seed=d.seed())
    return Base(kw, ("x", "w", "hx", "cx") if "cx" in kw and "hx" in kw else ("x", "w"), setup)


def _rnn_setup(ctx: Any) -> None:
    """The RNN (and, for the backward, a training forward on the valid inputs, for its ``y`` and reserve)."""
    from cudnnkit import ops

    s = ctx.case.setup
    rnn = ctx.setup_values.get("rnn") or ops.RNN(**s["rnn"])
    ctx.setup_values["rnn"] = rnn
    if ctx.spec.name != "rnn_backward":
        return
    if not ctx.gpu:
        ctx.setup_values["y"] = ctx.make(A(s["ys"], s["dtype"]))
        ctx.setup_values["reserve"] = ctx.make(A((64,), "uint8", fill="zeros"))
        return
    fwd = s["fwd"]
    kw: dict[str, Any] = {"rnn": rnn, "training": True, "layout": s["layout"]}
    if s["lengths"] is not None:
        kw["seq_lengths"] = list(s["lengths"])

    def forward(mutated: bool) -> tuple:
        # the backward's reference recomputes the forward from the case's own x/hx/cx, so the reserve must come
        # from those same values: a mutated argument that is still valid (another layout or library holds other
        # values drawn for its own buffer) is used as is; only one the forward refuses is replaced
        pick = (lambda k: ctx.objs[k]) if mutated else (lambda k: ctx.objs[k] if ctx.valid_arg(k) else ctx.make(fwd[k]))
        x = pick("x")
        w = ctx.objs["w"] if ctx.valid_arg("w") else ctx.weights(rnn, x, s["w"])
        extra = {k: pick(k) for k in ("hx", "cx") if fwd.get(k) is not None}
        y, _, _, reserve = ops.rnn_forward(x, w, **kw, **extra)
        return y, reserve

    try:
        y, reserve = forward(True)
    except Exception:
        y, reserve = forward(False)
    ctx.setup_values.update(y=y, reserve=reserve)


def _params_host(ctx: Any, rnn: Any, w: Any) -> list:
    return [[(ctx.got(p.matrix), ctx.got(p.bias)) for p in row] for row in rnn.weight_params(w)]


def _to_seq_major(a: np.ndarray, layout: str, lengths, T: int, N: int) -> np.ndarray:
    from ..rnn_reference import unpack

    if layout == "packed":
        return unpack(a, lengths, T, fill=0.0)
    return a if layout == "seq_major" else a.transpose(1, 0, 2)


def _from_seq_major(a: np.ndarray, layout: str, lengths) -> np.ndarray:
    from ..rnn_reference import pack

    if layout == "packed":
        return pack(a, lengths)
    return a if layout == "seq_major" else a.transpose(1, 0, 2)


def _rnn_check(ctx: Any, res: Any, backward: bool = False) -> list[str]:
    import importlib.util

    s = ctx.case.setup
    rnn = ctx.rnn_used()
    dt, layout, T, N, lengths = s["dtype"], s["layout"], s["T"], s["N"], s["lengths"]
    # float32 RNNs run in TF32 (CUDNN_DEFAULT_MATH) while cudnnkit.settings(allow_tf32=True), the default: errors
    # of about 1e-3 compound through the recurrence there (measured on the H200, up to 1.2e-3 in dw)
    from cudnnkit import current_settings

    tol = _tol(dt, f32=5e-3 if current_settings().allow_tf32 else 1e-4, half=2e-2, scale=10)
    want = 4 if (backward or ctx.param("training", False)) else 3
    if not isinstance(res, tuple) or len(res) != want:
        return [f"returned {type(res).__name__} of {len(res) if isinstance(res, tuple) else '?'}, not {want}"]
    if not ctx.gpu or rnn is None or importlib.util.find_spec("torch") is None:
        return ctx.compare_shape(res[0], ctx.x("x").shape if backward else s["ys"], "dx" if backward else "y")
    from ..rnn_reference import Reference

    w = ctx.objs["w"]
    params = _params_host(ctx, rnn, w)
    x = _to_seq_major(ctx.x("x"), layout, lengths, T, N)
    fill = fnum(ctx.param("padding_fill", 0.0))
    ref = Reference(rnn, x, params, ctx.x("hx"), ctx.x("cx"), lengths, fill=0.0 if backward else fill)
    if not backward:
        y, hy, cy = ref.outputs()
        problems = ctx.compare(res[0], _from_seq_major(y, layout, lengths), dt, "y", tol)
        problems += ctx.compare(res[1], hy, dt, "hy", tol)
        if rnn.cell == "lstm":
            problems += ctx.compare(res[2], cy, dt, "cy", tol)
        elif res[2] is not None:
            problems.append("cy is not None for a non-LSTM")
        return problems
    dy = _to_seq_major(ctx.x("dy"), layout, lengths, T, N)
    dx, dhx, dcx, dparams = ref.grads(dy, ctx.x("dhy"), ctx.x("dcy"))
    problems = ctx.compare(res[0], _from_seq_major(dx, layout, lengths), dt, "dx", tol * 3)
    if ctx.arg("hx") is not None:
        problems += ctx.compare(res[1], dhx, dt, "dhx", tol * 3)
    if ctx.arg("cx") is not None:
        problems += ctx.compare(res[2], dcx, dt, "dcx", tol * 3)
    got = _params_host(ctx, rnn, res[3])
    # each block's error is measured against its own norm, floored at 1% of the whole gradient's: a block whose
    # gradient is tiny (a 1 x 1 recurrent matrix of 4e-4) carries TF32's absolute error as a large relative one
    blocks = [(pl, lin, what, r, g) for pl, row in enumerate(dparams) for lin, (dm, db) in enumerate(row)
              for what, r, g in (("matrix", dm, got[pl][lin][0]), ("bias", db, got[pl][lin][1]))
              if r is not None and g is not None]  # fmt: skip
    whole = math.sqrt(sum(float(np.sum(np.square(np.asarray(r, np.float64)))) for *_, r, _g in blocks))
    for pl, lin, what, r, g in blocks:
        r64, g64 = np.asarray(r, np.float64), np.asarray(g, np.float64)
        if g64.shape != r64.shape or not np.isfinite(g64).all():
            problems += ctx.compare_values(g, r, dt, f"dw[{pl}][{lin}].{what}", tol * 5)
            continue
        scale = max(float(np.linalg.norm(r64)), 1e-2 * whole, 1e-30)
        err = float(np.linalg.norm(g64 - r64)) / scale
        if err > tol * 5:
            problems.append(f"dw[{pl}][{lin}].{what}: relative error {err:.3g} > {tol * 5:g} ({dt})")
    return problems


def _rnn_mutations(d: Draw, case: Case, gpu: bool):
    from dataclasses import replace

    kw = dict(case.kwargs)
    s = case.setup
    options = [
        ("w", Weights(delta=-1), "one element too few", "refuse_gpu"),
        ("w", Weights(delta=5), "5 elements too many", "any"),
        ("w", Weights(ndim2=True), "a 2-d buffer", "refuse_gpu"),
        ("w", Weights(dtype="float32" if s["dtype"] != "float32" else "float64"), "another dtype", "refuse_gpu"),
        ("w", Weights(layout=("gap", 0, 2)), "a gapped buffer", "refuse_gpu"),
        ("rnn", "lstm", "a str", "refuse"),
        ("rnn", None, "None", "refuse"),
        ("layout", "bogus", "an unknown layout", "refuse"),
    ]
    if s["lengths"] is not None and s["N"]:
        options += [
            ("seq_lengths", [s["T"] + 1] * s["N"], "longer than T", "refuse"),
            ("seq_lengths", [0] * s["N"], "zeros", "refuse"),
            ("seq_lengths", [1.5] * s["N"], "floats", "refuse"),
            ("seq_lengths", "abc", "a str", "refuse"),
        ]
    if case.op == "rnn_backward":
        options += [
            ("reserve", A((7,), "uint8"), "a wrong-size reserve", "refuse_gpu"),
            ("reserve", A((64,), "float32"), "a float32 reserve", "refuse_gpu"),
        ]
    else:
        options += [("padding_fill", None, "None", "refuse"), ("padding_fill", "0", "a str", "refuse"),
                    ("padding_fill", float("nan"), "NaN", "any"), ("padding_fill", 1e300, "1e300",
                    "any" if s["dtype"] == "float64" else "refuse")]  # fmt: skip
    name, value, what, expect = d.choice(options)
    if isinstance(value, Weights):
        value = replace(value, seed=kw["w"].seed if isinstance(kw.get("w"), Weights) else d.seed())
    kw[name] = value
    return replace(case, kwargs=kw), Mutation("rnn", name, f"{name} {what}", expect)


def _rnn_shape_rule(case: Case, name: str, old, new) -> str | None:
    """x's T and N are free unless seq_lengths, hx/cx or (for the backward) y tie them."""
    if name != "x":
        return None
    f, lay, lengths = case.setup["rnn"], case.setup["layout"], case.setup["lengths"]
    if len(new) != len(old) or new[-1] != f["input_size"] or 0 in new or lay == "packed" or case.op == "rnn_backward":
        return "refuse"
    t_ax, n_ax = (0, 1) if lay == "seq_major" else (1, 0)
    if new[n_ax] != old[n_ax] and ("seq_lengths" in case.kwargs or "hx" in case.kwargs or "cx" in case.kwargs):
        return "refuse"
    if "seq_lengths" in case.kwargs and lengths is not None and new[t_ax] < max(lengths):
        return "refuse"
    if "out" in case.kwargs:
        return "refuse_gpu"
    return "any"


_RNN_DT = ("float16", "float32", "float64")
RNN_ROLES = {
    "x": Role("in", _RNN_DT, huge=False),
    "w": Role("in", _RNN_DT, "data", late=True, huge=False),
    "hx": Role("in", _RNN_DT, "data", required=False, huge=False),
    "cx": Role("in", _RNN_DT, "data", required=False, huge=False),
    "out": Role("out", _RNN_DT, "data", required=False, late=True, huge=False),
}
RNN_BWD_ROLES = {
    "x": Role("in", _RNN_DT, huge=False),
    "dy": Role("in", _RNN_DT, huge=False),
    "w": Role("in", _RNN_DT, "data", late=True, huge=False),
    "hx": Role("in", _RNN_DT, "data", required=False, huge=False),
    "cx": Role("in", _RNN_DT, "data", required=False, huge=False),
    "dhy": Role("in", _RNN_DT, "data", required=False, huge=False),
    "dcy": Role("in", _RNN_DT, "data", required=False, huge=False),
}


def _rnn_dtype_rule(case: Case, name: str, new: str) -> str:
    return "refuse_gpu" if name in ("w", "out") else "refuse"


def _linear_draw(d: Draw, lib: str) -> Base:
    f = _rnn_fields(d)
    return Base({"rnn": Rnn(tuple(f.items())), "w": Weights(seed=d.seed())}, (), {"dtype": f["dtype"], "rnn": f})


def _linear_call(ctx: Any) -> Any:
    rnn = ctx.arg("rnn")
    return rnn.weight_params(ctx.arg("w"), **({"stream": ctx.arg("stream")} if "stream" in ctx.case.kwargs else {}))


def _linear_check(ctx: Any, params: Any) -> list[str]:
    from cudnnkit import ops

    rnn = ctx.rnn_used()
    D = rnn.num_directions
    if len(params) != rnn.num_layers * D:
        return [f"{len(params)} pseudo-layers, not {rnn.num_layers * D}"]
    for pl, row in enumerate(params):
        if len(row) != len(rnn.gates):
            return [f"pseudo-layer {pl}: {len(row)} linear ids, not {len(rnn.gates)}"]
        for p in row:
            if not isinstance(p, ops.LinearParams):
                return [f"an entry is {type(p).__name__}, not LinearParams"]
            if (p.layer, p.direction) != (pl // D, pl % D) or p.gate != rnn.gates[p.lin_id]:
                return [f"LinearParams {p.layer}/{p.direction}/{p.gate} at pseudo-layer {pl}"]
            if p.matrix is not None and p.bias is not None:
                ms, bs = ctx.shape_of(p.matrix), ctx.shape_of(p.bias)
                if ms is None or bs is None or ms[0] != bs[0]:
                    return [f"{p.gate}: matrix {ms} and bias {bs} disagree"]
    return []


def _names_draw(d: Draw, lib: str) -> Base:
    f = _rnn_fields(d)
    f.pop("input_mode", None)
    if f.get("bias_mode") not in (None, "double", "none"):
        f["bias_mode"] = "double"
    return Base({"rnn": Rnn(tuple(f.items()))}, ("rnn",), {"dtype": f["dtype"], "rnn": f})


def _names_check(ctx: Any, names: Any) -> list[str]:
    want = list(torch_shapes(ctx.case.setup["rnn"]))
    if list(names) != want:
        return [f"names {names} vs {want}"]
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        return []
    import torch

    f = ctx.case.setup["rnn"]
    cls = {"lstm": torch.nn.LSTM, "gru": torch.nn.GRU, "relu": torch.nn.RNN, "tanh": torch.nn.RNN}[f["cell"]]
    kw = dict(num_layers=f.get("num_layers", 1), bidirectional=bool(f.get("bidirectional")),
              bias=f.get("bias_mode", "double") == "double")  # fmt: skip
    if f["cell"] in ("relu", "tanh"):
        kw["nonlinearity"] = f["cell"]
    if f.get("proj_size"):
        kw["proj_size"] = f["proj_size"]
    m = cls(f["input_size"], f["hidden_size"], **kw)
    theirs = [n for n, _ in m.named_parameters()]
    shapes = {n: tuple(p.shape) for n, p in m.named_parameters()}
    if theirs != list(names) or shapes != torch_shapes(f):
        return [f"names {list(names)} vs torch's {theirs}"]
    return []


def _load_draw(d: Draw, lib: str) -> Base:
    base = _names_draw(d, lib)
    f = base.setup["rnn"]
    params = {n: A(s, f["dtype"], fill="normal:0.3", seed=d.seed()) for n, s in torch_shapes(f).items()}
    kw: dict[str, Any] = {"rnn": base.kwargs["rnn"], "params": params}
    if d.bool(0.4):
        kw["w"] = Weights(seed=d.seed())
    return Base(kw, ("rnn", "params"), base.setup)


def _load_check(ctx: Any, w: Any) -> list[str]:
    from cudnnkit import ops

    rnn = ctx.rnn_used()
    if not ctx.gpu:
        return []
    back = ops.to_torch_params(rnn, w)
    problems = []
    for name, obj in ctx.objs["params"].items():
        problems += ctx.compare(back[name], ctx.got(obj), rnn.dtype, f"round trip of {name}", 0.0)
    return problems


def _load_mutations(d: Draw, case: Case, gpu: bool):
    from dataclasses import replace

    if not isinstance(case.kwargs.get("params"), dict) or not case.kwargs["params"]:
        return None
    params = dict(case.kwargs["params"])
    names = list(params)
    kind = d.choice(["missing", "extra", "shape", "dtype", "host"])
    name = d.choice(names)
    if kind == "missing":
        del params[name]
    elif kind == "extra":
        params["weight_xx_l9"] = A((2, 2), case.setup["dtype"])
    elif kind == "shape":
        a = params[name]
        params[name] = a.with_(shape=(a.shape[0] + 1, *a.shape[1:]))
    elif kind == "dtype":
        a = params[name]
        params[name] = a.with_(dtype="float32" if a.dtype != "float32" else "float64")
    else:
        params[name] = params[name].with_(lib="host")
    kw = dict(case.kwargs)
    kw["params"] = params
    expect = "refuse_gpu" if kind == "shape" else "refuse"  # shapes are checked against the weight layout
    return replace(case, kwargs=kw), Mutation("params", "params", f"params: {kind} {name}", expect,
                                               (name, "params"))  # fmt: skip


def _to_torch_draw(d: Draw, lib: str) -> Base:
    base = _names_draw(d, lib)
    return Base({"rnn": base.kwargs["rnn"], "w": Weights(seed=d.seed())}, ("rnn", "w"), base.setup)


def _to_torch_check(ctx: Any, out: Any) -> list[str]:
    shapes = torch_shapes(ctx.case.setup["rnn"])
    if not isinstance(out, dict) or list(out) != list(shapes):
        return [f"keys {list(out) if isinstance(out, dict) else type(out).__name__} vs {list(shapes)}"]
    problems = []
    for n, s in shapes.items():
        problems += ctx.compare_shape(out[n], s, n)
    if problems or not ctx.gpu:
        return problems
    from cudnnkit import ops

    rnn = ctx.rnn_used()
    w2 = ops.load_torch_params(rnn, out)
    for row1, row2 in zip(rnn.weight_params(ctx.objs["w"]), rnn.weight_params(w2)):
        for p1, p2 in zip(row1, row2):
            for a, b in ((p1.matrix, p2.matrix), (p1.bias, p2.bias)):
                if a is not None:
                    problems += ctx.compare_values(ctx.got(b), ctx.got(a), rnn.dtype, f"{p1.gate} round trip", 0.0)
    return problems


# ----------------------------------------------------------------- tensor helpers


def _set_draw(d: Draw, lib: str, scale: bool = False) -> Base:
    dt = d.choice(F)
    shape = tuple(d.int(0, 3) if d.bool(0.03) else d.int(1, 5) for _ in range(d.int(1, 6)))
    # a gapped array of more than 4 dims may be refused by name (cuDNN cannot set it in place): not a valid draw
    lay = valid_layout(d, shape, 0.4) if len(shape) <= 4 else dense_layout(d, shape, 0.4)
    kw: dict[str, Any] = {"y": A(shape, dt, layout=lay, seed=d.seed())}
    name = "alpha" if scale else "value"
    kw[name] = d.choice([0.0, 1.5, -2.25, d.float(-10, 10)])
    return Base(kw, ("y", name), {"dtype": dt})


def _set_check(ctx: Any, res: Any, scale: bool = False) -> list[str]:
    from .materialize import seen

    y, dt = ctx.x("y"), ctx.dtype
    if res is not ctx.arg("y"):
        return ["did not return y"]
    v = fnum(ctx.param("alpha" if scale else "value"))
    ref = seen(y * seen(np.array(v), dt), dt) if scale else np.full(y.shape, float(seen(np.array(v), dt)))
    # one rounding to the output type: half an ulp of float16 is 4.9e-4, of bfloat16 3.9e-3 (the reference rounds
    # the scalar first, cuDNN may not: one ulp apart)
    return ctx.compare(res, ref, dt, "y", _tol(dt, f32=1e-6, half=1e-2 if dt == "bfloat16" else 2e-3), inplace="y")


def _add_shape(case: Case, name: str, old, new) -> str | None:
    """a broadcasts over c: each of its dims is c's or 1."""
    c = case.kwargs.get("c")
    if name != "a" or not isinstance(c, A):
        return None
    ok = len(new) == c.ndim and all(n in (cd, 1) for n, cd in zip(new, c.shape))
    return "any" if ok else "refuse"


def _add_draw(d: Draw, lib: str) -> Base:
    dt = d.choice(F)
    cs = tuple(d.int(1, 5) for _ in range(d.int(1, 5)))
    as_ = tuple(c if d.bool(0.6) else 1 for c in cs)
    kw: dict[str, Any] = {
        "a": A(as_, dt, layout=valid_layout(d, as_, 0.3), seed=d.seed()),
        "c": A(cs, dt, layout=valid_layout(d, cs, 0.3), seed=d.seed()),
    }
    if d.bool(0.5):
        kw["alpha"] = d.choice([1.0, 0.5, -1.5])
    if d.bool(0.5):
        kw["beta"] = d.choice([1.0, 0.0, 0.25])
    return Base(kw, ("a", "c"), {"dtype": dt})


def _add_check(ctx: Any, res: Any) -> list[str]:
    a, c, dt = ctx.x("a"), ctx.x("c"), ctx.dtype
    if res is not ctx.arg("c"):
        return ["did not return c"]
    ref = fnum(ctx.param("alpha", 1.0), 1.0) * a + fnum(ctx.param("beta", 1.0), 1.0) * c
    return ctx.compare(res, ref, dt, "c", _tol(dt, f32=1e-6, half=1e-2 if dt == "bfloat16" else 5e-3), inplace="c")


def _transform_draw(d: Draw, lib: str) -> Base:
    dt = d.choice(F)
    nd = d.int(1, 5)
    shape = tuple(d.int(0, 3) if d.bool(0.03) else d.int(1, 5) for _ in range(nd))
    kw: dict[str, Any] = {"x": A(shape, dt, layout=valid_layout(d, shape, 0.4), seed=d.seed())}
    out_shape = shape
    if nd >= 3 and d.bool(0.4):
        kw["layout"] = d.choice(["nchw", "nhwc"])
    if d.bool(0.3):  # padding: any number of dims (two calls, cudnnScaleTensor/SetTensor and a transform)
        before = tuple(d.int(0, 2) for _ in range(nd)) if d.bool() else d.int(0, 2)
        after = tuple(d.int(0, 2) for _ in range(nd)) if d.bool() else d.int(0, 2)
        kw["pad_before"], kw["pad_after"] = before, after
        b = before if isinstance(before, tuple) else (before,) * nd
        a = after if isinstance(after, tuple) else (after,) * nd
        out_shape = tuple(s + x + y for s, x, y in zip(shape, b, a))
    draw_blend(d, kw, dt, out_shape)
    return Base(kw, ("x",), {"dtype": dt, "out_shape": out_shape})


def _transform_check(ctx: Any, res: Any) -> list[str]:
    x, dt = ctx.x("x"), ctx.dtype
    nd = x.ndim
    pb, pa = ctx.param("pad_before", 0), ctx.param("pad_after", 0)
    pb = tuple(pb) if isinstance(pb, (tuple, list)) else (int(pb),) * nd
    pa = tuple(pa) if isinstance(pa, (tuple, list)) else (int(pa),) * nd
    ref = np.pad(x, list(zip(pb, pa)))
    ref = ctx.blend(ref, "out", "alpha", "beta")
    problems = ctx.compare(res, ref, dt, "y", _tol(dt, f32=1e-6, half=5e-3))
    lay = ctx.param("layout", None)
    if lay == "nhwc" and not problems and ctx.arg("out") is None and ref.size:
        st = ctx.strides_of(res)
        if st is not None and nd >= 3 and ref.shape[1] > 1 and st[1] != 1:
            problems.append(f"layout='nhwc' gave strides {st}")
    return problems


TRANSFORM_PARAMS = {
    "layout": Param("choice", nullable=True, optional_kw=True),
    "pad_before": Param("ints", lo=0, optional_kw=True, bad=lambda c: _bad_pads(c)),
    "pad_after": Param("ints", lo=0, optional_kw=True, bad=lambda c: _bad_pads(c)),
    "alpha": SCALE,
    "beta": BETA,
}


def _bad_pads(case: Case) -> list:
    x = case.kwargs.get("x")
    nd = x.ndim if isinstance(x, A) else 4
    x_ = ("x", "padding", "out")  # padding a tensor that is not 4-d or 5-d may be told naming x; a given out
    return [
        (-1, "-1", "refuse", x_),
        ((1,) * (nd + 1), f"{nd + 1} values", "refuse", x_),
        ("1", "a str", "refuse"),
        (1.5, "a float", "refuse"),
        (None, "None", "refuse"),
        (100000, "100000 (valid unless the output overflows)", "any", x_),
        (2**31, "2**31", "refuse", x_),
        (True, "a bool", "refuse"),
        ((1,) * nd, "ones", "any", x_),
    ]


# ----------------------------------------------------------------- the graph API


GRAPH_ENTRY_POINTS = (
    "Graph",
    "Graph.tensor",
    "Graph.pointwise",
    "Graph.matmul",
    "Graph.conv_fprop",
    "Graph.reduction",
    "Graph.resample_forward",
    "Graph.resample_backward",
    "Graph.norm_forward",
    "Graph.norm_backward",
    "Graph.sdpa_forward",
)

GF = ("float32", "float16", "bfloat16")


def _graph_ctor_draw(d: Draw, lib: str) -> Base:
    kw: dict[str, Any] = {}
    if d.bool(0.5):
        kw["compute_dtype"] = d.choice(["float32", "float16", "float64"])
    if d.bool(0.5):
        kw["intermediate_dtype"] = d.choice(["float32", "float16", "bfloat16"])
    if d.bool(0.5):
        kw["alignment"] = d.choice([1, 2, 16, 256])
    if d.bool(0.3):
        kw["name"] = d.choice(["g", ""])
    return Base(kw, (), {"dtype": "float32"})


def _graph_ctor_call(ctx: Any) -> Any:
    from cudnnkit.graph import Graph

    return Graph(**ctx.call_kwargs())


def _graph_ctor_check(ctx: Any, g: Any) -> list[str]:
    a = ctx.param("alignment", 16)
    return [] if g.alignment == int(a) else [f"alignment {g.alignment}, given {a!r}"]


def _tensor_draw(d: Draw, lib: str) -> Base:
    nd = d.int(1, 8)
    dims = tuple(d.int(1, 6) for _ in range(nd))
    kw: dict[str, Any] = {"dims": dims}
    if d.bool(0.4):
        kw["strides"] = layout_strides(dims, draw_layout(d, dims, allow=("perm", "gap")))[0]
    if d.bool(0.5):
        kw["dtype"] = d.choice(["float32", "float16", "bfloat16", "int32", "int64", "int8", "bool", "float64"])
    if d.bool(0.2) and all(x == 1 for x in dims):
        kw["by_value"] = True
    elif d.bool(0.2):
        kw["virtual"] = True
    if d.bool(0.3):
        kw["name"] = "t"
    return Base(kw, ("dims",), {"dtype": "float32"})


def _tensor_call(ctx: Any) -> Any:
    from cudnnkit.graph import Graph

    return Graph().tensor(*ctx.call_args(), **ctx.call_kwargs())


def _tensor_check(ctx: Any, t: Any) -> list[str]:
    dims = tuple(int(x) for x in ctx.param("dims"))
    if t.dims != dims:
        return [f"Tensor.dims {t.dims}, given {ctx.param('dims')!r}"]
    st = ctx.param("strides", None)
    if st is not None and t.strides != tuple(int(s) for s in st):
        return [f"Tensor.strides {t.strides}, given {st!r}"]
    return []


def _bad_dims(case: Case) -> list:
    dims = case.kwargs.get("dims", (2, 3))
    return [
        (("a",), "a str dim", "refuse"),
        (5, "an int, not a sequence", "refuse"),
        ((2.5, 3), "a float dim (truncated?)", "refuse"),
        ((2.0, 3), "an integral float dim", "refuse"),
        ((0, 3), "a zero dim", "refuse"),
        ((-1, 3), "a negative dim", "refuse"),
        ((2**40, 3), "a huge dim (int64 for the backend)", "any"),
        ((1,) * 9, "9 dims", "refuse"),
        ((), "no dims", "refuse"),
        ((True, 3), "a bool dim", "refuse"),
        (None, "None", "refuse"),
        ("23", "a str", "refuse"),
        (tuple(np.int64(x) for x in dims), "NumPy ints", "any"),
        (list(dims), "a list", "any"),
    ]


def _bad_strides(case: Case) -> list:
    dims = case.kwargs.get("dims", (2, 3))
    n = len(dims) if isinstance(dims, (tuple, list)) else 2
    return [
        ((0,) * n, "zero strides", "refuse"),
        ((-1,) * n, "negative strides", "refuse"),
        ((1.5,) * n, "float strides", "refuse"),
        ((1,) * (n + 1), "one stride too many", "refuse"),
        (("a",) * n, "str strides", "refuse"),
        (7, "an int", "refuse"),
        (None, "None", "any"),
    ]


TENSOR_PARAMS = {
    "dims": Param("ints", bad=_bad_dims, names=("strides",)),
    "strides": Param("ints", nullable=True, optional_kw=True, bad=_bad_strides),
    "dtype": Param("dtype", optional_kw=True),
    "virtual": Param("bool", optional_kw=True),
    "by_value": Param(
        "bool",
        optional_kw=True,
        bad=lambda c: [
            (
                True,
                "True on a tensor of many elements",
                "any" if all(x == 1 for x in c.kwargs.get("dims", (2,))) else "refuse",
            )
        ],
    ),  # fmt: skip
}


# --- graph programs: define tensors from the valid arrays, add the op, mark outputs, build, execute


class _HostDesc:
    """A stand-in execution-plan descriptor for the CPU tier (no device can build a real one)."""

    ptr = 0

    def get(self, name: str) -> int:
        return 0


def graph_plan(ctx: Any, g: Any) -> Any:
    """``g.build(**build options)``; on the CPU, where the build stops at the device, the host-side lowering and
    a host-only plan over ``PlanSpec.of(g)`` (so bindings, stream and workspace are still checked)."""
    from cudnnkit.graph import ExecutionPlan, PlanSpec

    from .materialize import ReachedDevice

    opts = {k: ctx.arg(k) for k in ("device",) if k in ctx.case.kwargs}
    try:
        return g.build(**opts)
    except ReachedDevice:
        if ctx.gpu:
            raise
    from cudnnkit import lib

    try:
        g.lower()
    except lib.DriverNotFoundError:  # cuDNN 9.28 finalizes through a sub-library that needs the driver
        pass
    dev = opts.get("device")
    return ExecutionPlan(_HostDesc(), PlanSpec.of(g, dev if isinstance(dev, int) else 0), key=None, engine=None)


def run_graph(ctx: Any, g: Any, tensors: dict[str, Any], outputs: dict[str, Any]) -> dict[str, Any]:
    """Bind every array argument named like a graph tensor, execute as the case says, return the output arrays."""
    plan = graph_plan(ctx, g)
    bindings: dict[Any, Any] = {}
    for name, t in {**tensors, **outputs}.items():
        ctx.aliases[name] = (t.name, f"uid {t.uid}")
        if name in ctx.case.kwargs:
            key = t.uid if ctx.case.setup.get("by_uid") else t
            bindings[key] = ctx.arg(name)
    if "bind_extra" in ctx.case.kwargs:
        bindings[ctx.arg("bind_extra")] = ctx.arg("x") if "x" in ctx.case.kwargs else 0
    ex = {k: ctx.arg(k) for k in ("stream", "workspace") if k in ctx.case.kwargs}
    mode = ctx.case.setup.get("exec", "plan") if ctx.gpu else "plan"
    if mode == "graph":
        g.execute(bindings, **ex)
    elif mode == "bind":
        run = plan.bind(bindings, **{k: v for k, v in ex.items() if k == "workspace"})
        run(ex.get("stream"))
    else:
        plan.execute(bindings, **ex)
    return {n: ctx.arg(n) for n in outputs if n in ctx.case.kwargs}


def _defs(kw: dict[str, Any], names) -> dict[str, tuple]:
    out = {}
    for n in names:
        a = kw[n]
        out[n] = (a.shape, layout_strides(a.shape, a.layout)[0], a.dtype)
    return out


def graph_tensor(ctx: Any, g: Any, name: str) -> Any:
    """The graph tensor for array argument ``name``: from its valid definition, with any definition mutation
    (``<name>_dims``, ``<name>_strides``, ``<name>_dtype`` keywords) applied."""
    dims, strides, dtype = ctx.case.setup["defs"][name]
    kw = ctx.case.kwargs
    dims = kw.get(f"{name}_dims", dims)
    strides = kw.get(f"{name}_strides", strides)
    dtype = kw.get(f"{name}_dtype", dtype)
    return g.tensor(dims, strides, dtype, name=name)


def _graph_kw(ctx: Any) -> dict[str, Any]:
    return {k: ctx.arg(k) for k in ("compute_dtype", "alignment", "intermediate_dtype") if k in ctx.case.kwargs}


def _graph_common_draw(d: Draw, kw: dict, setup: dict) -> None:
    setup["exec"] = d.choice(["plan", "plan", "graph", "bind"])
    if d.bool(0.1):
        setup["by_uid"] = True
    if d.bool(0.1):
        kw["device"] = 0


GRAPH_EXEC_PARAMS = {
    "device": Param("int", lo=0, hi=0, nullable=True, optional_kw=True),
    "compute_dtype": Param("dtype", optional_kw=True),
    "alignment": Param(
        "int",
        lo=1,
        optional_kw=True,
        bad=lambda c: [
            ("16", "a str", "refuse"),
            (3, "not a power of two", "refuse"),
            (0, "0", "refuse"),
            (-16, "-16", "refuse"),
            (16.0, "a float", "refuse"),
            (None, "None", "refuse"),
            (2**70, "2**70", "refuse"),
        ],
    ),  # fmt: skip
}


def _graph_mutations(d: Draw, case: Case, gpu: bool):
    """Definition mutations (a graph tensor's dims, strides, dtype), binding mutations (unbound, an unknown uid,
    raw pointers) and workspace mutations."""
    from dataclasses import replace

    kw = dict(case.kwargs)
    bound = [n for n in case.setup["defs"] if isinstance(kw.get(n), A)]
    if not bound:
        return None
    what = d.choice(["dims", "strides", "dtype", "unbound", "extra", "pointer", "pointer", "workspace"])
    if what in ("dims", "strides", "dtype"):  # definitions: of the input tensors (outputs are the graph's)
        bound = [n for n in bound if not case.kwargs[n].out]
        if not bound:
            return None
    name = d.choice(bound)
    a = kw[name]
    names: tuple[str, ...] = (name,)
    if what == "dims":
        value, desc, expect = d.choice(_bad_dims(Case("?", {"dims": a.shape})))
        kw[f"{name}_dims"] = value
        names = (name, "dims")
    elif what == "strides":
        value, desc, expect = d.choice(_bad_strides(Case("?", {"dims": a.shape})))
        if value is None:
            return None
        kw[f"{name}_strides"] = value
        names = (name, "strides")
    elif what == "dtype":
        value, desc, expect = d.choice([("float33", "an unknown dtype", "refuse"), (3, "an int", "refuse"),
                                        (None, "None", "any"), ("complex64", "complex64", "refuse")])  # fmt: skip
        kw[f"{name}_dtype"] = value
        names = (name, "dtype")
    elif what == "unbound":
        del kw[name]
        desc, expect = "not bound", "refuse"
    elif what == "extra":
        kw["bind_extra"] = d.choice([999, Opaque("object"), "x"])
        desc, expect, names = f"an extra binding key {kw['bind_extra']!r}", "refuse", ("bindings", "binding", "uid")
    elif what == "pointer":
        strides, n, _ = layout_strides(a.shape, a.layout)
        from .materialize import itemsize

        value, desc, expect = draw_bad_pointer(d, a, n * itemsize(a.dtype))
        kw[name] = value
    else:
        value, desc, expect = d.choice([("ws", "a str", "refuse"), (A((1,), "uint8", lib="host"), "a host array",
                                        "refuse"), (0xBAD000, "a garbage pointer", "refuse_gpu"),
                                        (A((1 << 20,), "uint8"), "1 MiB", "any"), (2.5, "a float", "refuse")])  # fmt: skip
        kw["workspace"] = value
        name, names = "workspace", ("workspace",)
    return replace(case, kwargs=kw), Mutation("graph", name, f"{name}: {what} {desc}", expect, names)


def _graph_layout_rule(case: Case, name: str, lay: tuple) -> str | None:
    """A bound array must have the strides its tensor was defined with (size-1 dims aside) and the graph's
    pointer alignment."""
    if name not in case.setup.get("defs", {}):
        return None
    dims, strides, dtype = case.setup["defs"][name]
    new, _, off = layout_strides(dims, lay)
    from .materialize import itemsize

    if any(a != b for dm, a, b in zip(dims, new, strides) if dm != 1):
        return "refuse"
    if (off * itemsize(dtype)) % int(case.kwargs.get("alignment", 16) or 16):
        return "refuse"
    return "any"


def _graph_shape_rule(case: Case, name: str, old, new) -> str:
    return "refuse"


def _graph_dtype_rule(case: Case, name: str, new: str) -> str:
    return "refuse"


def _graph_lib_rule(case: Case, name: str, lib: str) -> str:
    return "any"


def _graph_nonarray_rule(case: Case, name: str, value: Any) -> str | None:
    if isinstance(value, int) and not isinstance(value, bool):
        return "refuse"  # a raw pointer of garbage
    return None


def _gspec(name: str, draw, call, check, roles: dict[str, Role], params: dict[str, Param], weight: float = 1.0):
    return OpSpec(
        name,
        draw,
        roles=roles,
        params={**GRAPH_EXEC_PARAMS, **params},
        call=call,
        check=check,
        mutations=_graph_mutations,
        mutation_weight=6.0,
        shape_rule=_graph_shape_rule,
        layout_rule=_graph_layout_rule,
        dtype_rule=_graph_dtype_rule,
        lib_rule=_graph_lib_rule,
        nonarray_rule=_graph_nonarray_rule,
        weight=weight,
        graph=True,
        keywords=False,
    )


def _grole(kind: str = "in", dtypes=GF) -> Role:
    return Role(kind, dtypes, "data", required=True)


_UNARY = {
    "RELU_FWD": lambda x: np.maximum(x, 0),
    "TANH_FWD": np.tanh,
    "SIGMOID_FWD": lambda x: 1 / (1 + np.exp(-x)),
    "EXP": np.exp,
    "ABS": np.abs,
    "NEG": np.negative,
    "SQRT": lambda x: np.sqrt(np.abs(x)),
    "IDENTITY": lambda x: x,
}
_BINARY = {"ADD": np.add, "MUL": np.multiply, "SUB": np.subtract, "MAX": np.maximum, "MIN": np.minimum}


def _g4(d: Draw) -> tuple[int, ...]:
    return (d.int(1, 3), d.choice([4, 8, 16]), d.int(1, 6), d.int(1, 6))


def _pw_draw(d: Draw, lib: str) -> Base:
    dt = d.choice(GF)
    shape = _g4(d)
    lay = ("perm", (0, 2, 3, 1)) if d.bool(0.6) else ("c",)
    mode = d.choice(list(_UNARY) + list(_BINARY) + ["RELU_BWD"])
    kw: dict[str, Any] = {"mode": mode, "x": A(shape, dt, layout=lay, seed=d.seed())}
    if mode == "SQRT":
        kw["x"] = kw["x"].with_(fill="positive")
    names = ["x"]
    if mode in _BINARY:
        bs = tuple(s if d.bool(0.5) else 1 for s in shape)
        kw["b"] = A(bs, dt, seed=d.seed())
        names.append("b")
    elif mode == "RELU_BWD":
        kw["dy"] = A(shape, dt, layout=lay, seed=d.seed())
        names.append("dy")
    kw["y"] = A(shape, dt, fill="nan", layout=lay, out=True, seed=d.seed())
    setup = {"dtype": dt, "defs": _defs(kw, names + ["y"])}
    _graph_common_draw(d, kw, setup)
    return Base(kw, (), setup)


def _pw_call(ctx: Any) -> Any:
    from cudnnkit.graph import Graph

    g = Graph(**_graph_kw(ctx))
    names = [n for n in ("x", "b", "dy") if n in ctx.case.setup["defs"]]
    t = {n: graph_tensor(ctx, g, n) for n in names}
    extra = {k: ctx.arg(k) for k in ("alpha1", "alpha2", "relu_lower_clip") if k in ctx.case.kwargs}
    y = g.pointwise(ctx.arg("mode"), t["x"], t.get("b"), dy=t.get("dy"), **extra)
    y = g.mark_output(y, ctx.case.setup["defs"]["y"][2])
    return run_graph(ctx, g, t, {"y": y})


def _pw_check(ctx: Any, outs: Any) -> list[str]:
    mode = str(ctx.param("mode")).upper()
    x, dt = ctx.x("x"), ctx.dtype
    if mode in _UNARY:
        ref = _UNARY[mode](x)
    elif mode in _BINARY:
        ref = _BINARY[mode](x, ctx.x("b"))
    else:
        ref = ctx.x("dy") * (x > 0)
    return ctx.compare(outs["y"], ref, dt, "y", _tol(dt, f32=1e-5, half=1e-2))


PW_PARAMS = {
    "mode": Param(
        "choice",
        bad=lambda c: [
            ("bogus", "an unknown mode", "refuse"),
            (3, "an int", "refuse"),
            (None, "None", "refuse"),
            (str(c.kwargs.get("mode", "ADD")).lower(), "lower case", "any"),
        ],
    ),  # fmt: skip
    "alpha1": Param(
        "float",
        optional_kw=True,
        bad=lambda c: [
            ("1", "a str", "refuse"),
            (None, "None", "refuse"),
            (float("nan"), "NaN", "refuse"),
            (complex(1, 0), "a complex", "refuse"),
        ],
    ),  # fmt: skip
    "relu_lower_clip": Param(
        "float",
        optional_kw=True,
        bad=lambda c: [
            ("0", "a str", "refuse"),
            (0.0, "0.0", "any" if c.kwargs.get("mode") in ("RELU_FWD", "RELU_BWD") else "refuse"),
        ],
    ),  # fmt: skip
}


def _mm_draw(d: Draw, lib: str) -> Base:
    dt = d.choice(GF)
    b, m, k, n = d.int(1, 3), d.choice([8, 16, 32]), d.choice([8, 16, 32]), d.choice([8, 16, 32])
    kw: dict[str, Any] = {"a": A((b, m, k), dt, seed=d.seed()), "b": A((b, k, n), dt, seed=d.seed())}
    if d.bool(0.3):
        kw["b"] = kw["b"].with_(layout=("perm", (0, 2, 1)))
    kw["c"] = A((b, m, n), dt, fill="nan", out=True, seed=d.seed())
    setup = {"dtype": dt, "defs": _defs(kw, ["a", "b", "c"])}
    _graph_common_draw(d, kw, setup)
    return Base(kw, (), setup)


def _mm_call(ctx: Any) -> Any:
    from cudnnkit.graph import Graph

    g = Graph(**_graph_kw(ctx))
    t = {n: graph_tensor(ctx, g, n) for n in ("a", "b")}
    c = g.mark_output(g.matmul(t["a"], t["b"]), ctx.case.setup["defs"]["c"][2])
    return run_graph(ctx, g, t, {"c": c})


def _mm_check(ctx: Any, outs: Any) -> list[str]:
    dt = ctx.dtype
    return ctx.compare(outs["c"], ctx.x("a") @ ctx.x("b"), dt, "c", _tol(dt, f32=3e-3, half=1e-2))


def conv_ref(x, w, stride, pad, dil):
    """Cross-correlation of ``x`` (N, C, *sp) with ``w`` (K, C, *k): per-dim stride, padding (pre = post), dilation."""
    n, c = x.shape[:2]
    k = w.shape[0]
    sp = x.shape[2:]
    ks = w.shape[2:]
    xp_ = np.pad(x, [(0, 0), (0, 0)] + [(p, p) for p in pad])
    outs = [(s + 2 * p - dl * (kk - 1) - 1) // st + 1 for s, p, dl, kk, st in zip(sp, pad, dil, ks, stride)]
    out = np.zeros((n, k, *outs))
    for idx in np.ndindex(*ks):
        sl = tuple(slice(i * dl, i * dl + st * o, st) for i, dl, st, o in zip(idx, dil, stride, outs))
        patch = xp_[(slice(None), slice(None), *sl)]
        out += np.einsum("nc...,kc->nk...", patch, w[(slice(None), slice(None), *idx)])
    return out


def _conv_draw(d: Draw, lib: str) -> Base:
    dt = d.choice(GF)
    n, c, k = d.int(1, 2), d.choice([8, 16]), d.choice([8, 16])
    h, w = d.int(3, 8), d.int(3, 8)
    r = d.choice([1, 3])
    stride, pad, dil = d.choice([1, 2]), d.choice([0, 1]), d.choice([1, 1, 2])
    if (h + 2 * pad - dil * (r - 1) - 1) < 0 or (w + 2 * pad - dil * (r - 1) - 1) < 0:
        dil, pad = 1, 1
    ho = (h + 2 * pad - dil * (r - 1) - 1) // stride + 1
    wo = (w + 2 * pad - dil * (r - 1) - 1) // stride + 1
    nhwc = ("perm", (0, 2, 3, 1))
    kw: dict[str, Any] = {
        "x": A((n, c, h, w), dt, layout=nhwc, seed=d.seed()),
        "w": A((k, c, r, r), dt, fill="normal:0.3", layout=nhwc, seed=d.seed()),
        "y": A((n, k, ho, wo), dt, fill="nan", layout=nhwc, out=True, seed=d.seed()),
    }
    if stride != 1 or d.bool(0.3):
        kw["stride"] = stride
    if pad or d.bool(0.3):
        kw["pre_padding"] = pad
    if dil != 1:
        kw["dilation"] = dil
    setup = {"dtype": dt, "defs": _defs(kw, ["x", "w", "y"])}
    _graph_common_draw(d, kw, setup)
    return Base(kw, (), setup)


def _conv_call(ctx: Any) -> Any:
    from cudnnkit.graph import Graph

    g = Graph(**_graph_kw(ctx))
    t = {n: graph_tensor(ctx, g, n) for n in ("x", "w")}
    opts = {
        k: ctx.arg(k) for k in ("stride", "pre_padding", "post_padding", "dilation", "mode") if k in ctx.case.kwargs
    }
    y = g.mark_output(g.conv_fprop(t["x"], t["w"], **opts), ctx.case.setup["defs"]["y"][2])
    return run_graph(ctx, g, t, {"y": y})


def _conv_check(ctx: Any, outs: Any) -> list[str]:
    dt = ctx.dtype
    s, p, dl = (int(ctx.param(k, dflt)) for k, dflt in (("stride", 1), ("pre_padding", 0), ("dilation", 1)))
    ref = conv_ref(ctx.x("x"), ctx.x("w"), (s, s), (p, p), (dl, dl))
    return ctx.compare(outs["y"], ref, dt, "y", _tol(dt, f32=3e-3, half=1e-2))


def _bad_conv_int(case: Case) -> list:
    return [
        (0, "0", "refuse"),
        (-1, "-1", "refuse"),
        ("1", "a str", "refuse"),
        (1.5, "a float", "refuse"),
        ((1, 1, 1), "3 values for 2 spatial dims", "refuse"),
        (None, "None", "refuse"),
        (2**40, "2**40 (changes the output's shape)", "any"),
        (True, "a bool", "refuse"),
    ]


CONV_PARAMS = {
    "stride": Param("ints", optional_kw=True, bad=_bad_conv_int),
    "pre_padding": Param(
        "ints",
        optional_kw=True,
        names=("padding",),
        bad=lambda c: [(x, w, "refuse" if x != 0 else "any") for x, w, _ in _bad_conv_int(c)],
    ),  # fmt: skip
    "dilation": Param("ints", optional_kw=True, bad=_bad_conv_int),
    "mode": Param("choice", optional_kw=True),
}


_RED = {"add": np.sum, "max": np.max, "min": np.min, "mul": np.prod, "amax": lambda a, **k: np.abs(a).max(**k),
        "avg": np.mean, "norm1": lambda a, **k: np.abs(a).sum(**k), "norm2": lambda a, **k: np.sqrt((a * a).sum(**k))}  # fmt: skip


def _red_draw(d: Draw, lib: str) -> Base:
    dt = d.choice(["float32", "float16", "bfloat16"])
    shape = _g4(d)
    out_dims = tuple(1 if d.bool(0.5) else s for s in shape)
    mode = d.choice(["add", "add", "max", "max", "min", "mul", "amax", "avg", "norm1", "norm2"])
    lay = ("perm", (0, 2, 3, 1)) if d.bool(0.5) else ("c",)
    kw: dict[str, Any] = {"x": A(shape, dt, fill="uniform:0.9:1.1" if mode == "mul" else "normal", layout=lay,
                                 seed=d.seed()), "out_dims": out_dims, "mode": mode}  # fmt: skip
    kw["y"] = A(out_dims, "float32", fill="nan", layout=lay, out=True, seed=d.seed())
    setup = {"dtype": dt, "defs": _defs(kw, ["x", "y"])}
    _graph_common_draw(d, kw, setup)
    return Base(kw, (), setup)


def _red_call(ctx: Any) -> Any:
    from cudnnkit.graph import Graph

    g = Graph(**_graph_kw(ctx))
    t = {"x": graph_tensor(ctx, g, "x")}
    y = g.mark_output(g.reduction(t["x"], ctx.arg("out_dims"), mode=ctx.arg("mode")), "float32")
    return run_graph(ctx, g, t, {"y": y})


def _red_check(ctx: Any, outs: Any) -> list[str]:
    x = ctx.x("x")
    od = tuple(ctx.param("out_dims"))
    axes = tuple(i for i, (a, b) in enumerate(zip(x.shape, od)) if b == 1 and a != 1)
    mode = str(ctx.param("mode"))
    ref = _RED[mode](x, axis=axes, keepdims=True)  # no axes: each element alone (amax, norm1, norm2: |x|)
    return ctx.compare(outs["y"], ref, "float32", "y", 1e-2 if ctx.dtype != "float32" else 1e-4)


def _bad_out_dims(case: Case) -> list:
    x = case.kwargs.get("x")
    shape = x.shape if isinstance(x, A) else (2, 4, 3, 3)
    return [
        (shape[:-1], "one dim too few", "refuse"),
        (tuple(s + 1 for s in shape), "dims larger than x's", "refuse"),
        (("a",) * len(shape), "strs", "refuse"),
        (tuple(float(s) for s in shape), "floats", "refuse"),
        (None, "None", "refuse"),
        ((0,) * len(shape), "zeros", "refuse"),
    ]


RED_PARAMS = {"out_dims": Param("ints", bad=_bad_out_dims), "mode": Param("choice")}


def _pool_draw(d: Draw, lib: str, backward: bool = False) -> Base:
    from ..gpu.test_graph_nodes_gpu import distinct  # noqa: F401  (same module as the reference)

    dt = d.choice(["float16", "bfloat16", "float32"])
    n, c, h, w = d.int(1, 2), d.choice([8, 16]), d.int(4, 9), d.int(4, 9)
    k = d.choice([2, 3])
    s = d.choice([1, 2])
    p = d.choice([0, 1]) if k > 1 else 0
    # bfloat16 average pooling is refused by the graph (cuDNN 9.19 computes it wrong on Hopper, measured); the
    # backward here draws average modes only, so it runs float16 where bfloat16 was drawn
    if backward and dt == "bfloat16":
        dt = "float16"
    avg = [] if dt == "bfloat16" else ["avg_include_padding", "avg_exclude_padding"]
    mode = d.choice(avg if backward else ["max", *avg])
    ho, wo = (h + 2 * p - k) // s + 1, (w + 2 * p - k) // s + 1
    nhwc = ("perm", (0, 2, 3, 1))
    kw: dict[str, Any] = {"mode": mode, "window": k, "stride": s, "pre_padding": p}
    if backward:
        kw["dy"] = A((n, c, ho, wo), dt, layout=nhwc, seed=d.seed())
        kw["dx"] = A((n, c, h, w), dt, fill="nan", layout=nhwc, out=True, seed=d.seed())
        names = ["dy", "dx"]
    else:
        kw["x"] = A((n, c, h, w), dt, layout=nhwc, seed=d.seed())
        kw["y"] = A((n, c, ho, wo), dt, fill="nan", layout=nhwc, out=True, seed=d.seed())
        names = ["x", "y"]
    setup = {"dtype": dt, "defs": _defs(kw, names), "x_shape": (n, c, h, w)}
    _graph_common_draw(d, kw, setup)
    return Base(kw, (), setup)


def _pool_opts(ctx: Any) -> dict[str, Any]:
    return {k: ctx.arg(k) for k in ("mode", "window", "stride", "pre_padding", "padding_mode") if k in ctx.case.kwargs}


def _pool_call(ctx: Any) -> Any:
    from cudnnkit.graph import Graph

    g = Graph(**_graph_kw(ctx))
    t = {"x": graph_tensor(ctx, g, "x")}
    y = g.mark_output(g.resample_forward(t["x"], **_pool_opts(ctx)), ctx.case.setup["defs"]["y"][2])
    return run_graph(ctx, g, t, {"y": y})


def _pool_bwd_call(ctx: Any) -> Any:
    from cudnnkit.graph import Graph

    g = Graph(**_graph_kw(ctx))
    t = {"dy": graph_tensor(ctx, g, "dy")}
    dx = g.resample_backward(t["dy"], x_dims=ctx.case.setup["x_shape"], **_pool_opts(ctx))
    dx = g.mark_output(dx, ctx.case.setup["defs"]["dx"][2])
    return run_graph(ctx, g, t, {"dx": dx})


def _pool_check(ctx: Any, outs: Any, backward: bool = False) -> list[str]:
    from ..gpu.test_graph_nodes_gpu import ref_pool, ref_pool_backward

    dt = ctx.dtype
    k, s, p, mode = (ctx.param(n) for n in ("window", "stride", "pre_padding", "mode"))
    s = k if s is None else s  # stride=None is the window, as the graph defines it
    tol = _tol(dt, f32=1e-5, half=1e-2)
    if backward:
        x = np.zeros(ctx.case.setup["x_shape"])
        ref = ref_pool_backward(x, ctx.x("dy"), int(k), int(s), int(p), str(mode))
        return ctx.compare(outs["dx"], ref, dt, "dx", tol)
    return ctx.compare(outs["y"], ref_pool(ctx.x("x"), int(k), int(s), int(p), str(mode)), dt, "y", tol)


def _bad_window(case: Case) -> list:
    return [(0, "0", "refuse"), (-2, "-2", "refuse"), ("3", "a str", "refuse"), (2.5, "a float", "refuse"),
            (None, "None", "refuse"), (100, "larger than the input", "refuse"), ((2, 2, 2), "3 values", "refuse")]  # fmt: skip


POOL_PARAMS = {
    "mode": Param("choice"),
    "window": Param("ints", bad=_bad_window),
    "stride": Param("ints", bad=lambda c: [(x, w, "any" if x is None else v) for x, w, v in _bad_conv_int(c)]),
    "pre_padding": Param(
        "ints",
        names=("padding",),
        bad=lambda c: [
            (-1, "-1", "refuse"),
            ("1", "a str", "refuse"),
            (int(c.kwargs.get("window", 3)), "as large as the window", "refuse"),
        ],
    ),  # fmt: skip
    "padding_mode": Param("choice", nullable=True, optional_kw=True),
}


def _norm_draw(d: Draw, lib: str, backward: bool = False) -> Base:
    dt = d.choice(["bfloat16", "float16"])
    n, c = d.choice([16, 32, 64]), d.choice([64, 128, 256])
    mode = d.choice(["layer", "rms"])
    nhwc = ("perm", (0, 2, 3, 1))
    kw: dict[str, Any] = {"mode": mode, "x": A((n, c, 1, 1), dt, fill="normal:1.5", layout=nhwc, seed=d.seed()),
                          "scale": A((1, c, 1, 1), "float32", layout=nhwc, seed=d.seed())}  # fmt: skip
    names = ["x", "scale"]
    if backward:
        kw["dy"] = A((n, c, 1, 1), dt, layout=nhwc, seed=d.seed())
        kw["mean"] = A((n, 1, 1, 1), "float32", fill="derived:mean", seed=d.seed())
        kw["inv_variance"] = A((n, 1, 1, 1), "float32", fill="derived:inv", seed=d.seed())
        kw["dx"] = A((n, c, 1, 1), dt, fill="nan", layout=nhwc, out=True, seed=d.seed())
        kw["dscale"] = A((1, c, 1, 1), "float32", fill="nan", layout=nhwc, out=True, seed=d.seed())
        names += ["dy", "inv_variance", "dx", "dscale"]
        if mode == "layer":
            names.append("mean")
            kw["dbias"] = A((1, c, 1, 1), "float32", fill="nan", layout=nhwc, out=True, seed=d.seed())
            names.append("dbias")
        else:
            del kw["mean"]
    else:
        if mode == "layer":
            kw["bias"] = A((1, c, 1, 1), "float32", layout=nhwc, seed=d.seed())
            names.append("bias")
        kw["y"] = A((n, c, 1, 1), dt, fill="nan", layout=nhwc, out=True, seed=d.seed())
        kw["inv_variance"] = A((n, 1, 1, 1), "float32", fill="nan", out=True, seed=d.seed())
        names += ["y", "inv_variance"]
        if mode == "layer":
            kw["mean"] = A((n, 1, 1, 1), "float32", fill="nan", out=True, seed=d.seed())
            names.append("mean")
    if d.bool(0.3):
        kw["epsilon"] = d.choice([1e-5, 1e-3])
    setup = {"dtype": dt, "defs": _defs(kw, names)}
    _graph_common_draw(d, kw, setup)
    return Base(kw, (), setup)


def _norm_derive(ctx: Any, key: str, a: A) -> np.ndarray | None:
    from ..gpu.test_graph_nodes_gpu import ln_ref

    x = ctx.x("x")
    if x is None:
        return None
    eps = fnum(ctx.param("epsilon", 1e-5), 1e-5)
    _, mean, inv = ln_ref(x, 1.0, 0.0, eps, rms=ctx.param("mode") == "rms")
    v = mean if key == "mean" else inv
    return v if v.shape == a.shape else None


def _norm_call(ctx: Any) -> Any:
    from cudnnkit.graph import Graph

    g = Graph(**_graph_kw(ctx))
    defs = ctx.case.setup["defs"]
    t = {n: graph_tensor(ctx, g, n) for n in ("x", "scale", "bias") if n in defs}
    eps = {"epsilon": ctx.arg("epsilon")} if "epsilon" in ctx.case.kwargs else {}
    r = g.norm_forward(ctx.arg("mode"), t["x"], t["scale"], t.get("bias"), **eps)
    outs = {"y": g.mark_output(r.y, defs["y"][2]), "inv_variance": g.mark_output(r.inv_variance)}
    if r.mean is not None:
        outs["mean"] = g.mark_output(r.mean)
    return run_graph(ctx, g, t, outs)


def _norm_bwd_call(ctx: Any) -> Any:
    from cudnnkit.graph import Graph

    g = Graph(**_graph_kw(ctx))
    defs = ctx.case.setup["defs"]
    t = {n: graph_tensor(ctx, g, n) for n in ("x", "dy", "scale", "mean", "inv_variance") if n in defs}
    eps = {"epsilon": ctx.arg("epsilon")} if "epsilon" in ctx.case.kwargs else {}
    r = g.norm_backward(ctx.arg("mode"), t["x"], t["dy"], t["scale"], mean=t.get("mean"),
                        inv_variance=t["inv_variance"], **eps)  # fmt: skip
    outs = {"dx": g.mark_output(r.dx, defs["dx"][2]), "dscale": g.mark_output(r.dscale)}
    if r.dbias is not None:
        outs["dbias"] = g.mark_output(r.dbias)
    return run_graph(ctx, g, t, outs)


def _norm_check(ctx: Any, outs: Any, backward: bool = False) -> list[str]:
    from ..gpu.test_graph_nodes_gpu import ln_backward_ref, ln_ref

    rms = ctx.param("mode") == "rms"
    x, s, dt = ctx.x("x"), ctx.x("scale"), ctx.dtype
    eps = fnum(ctx.param("epsilon", 1e-5), 1e-5)
    if backward:
        mean = ctx.x("mean") if not rms else np.zeros_like(ctx.x("inv_variance"))
        dx, ds, db = ln_backward_ref(x, ctx.x("dy"), s, mean, ctx.x("inv_variance"), rms=rms)
        p = ctx.compare(outs["dx"], dx, dt, "dx", 2e-2) + ctx.compare(outs["dscale"], ds, "float32", "dscale", 1e-2)
        if "dbias" in outs:
            p += ctx.compare(outs["dbias"], db, "float32", "dbias", 1e-2)
        return p
    b = ctx.x("bias") if not rms else 0.0
    y, mean, inv = ln_ref(x, s, b, eps, rms=rms)
    p = ctx.compare(outs["y"], y, dt, "y", 2e-2) + ctx.compare(
        outs["inv_variance"], inv, "float32", "inv_variance", 1e-3
    )
    if "mean" in outs:
        p += ctx.compare(outs["mean"], mean, "float32", "mean", 1e-3)
    return p


NORM_PARAMS = {
    "mode": Param(
        "choice",
        bad=lambda c: [
            ("bogus", "an unknown mode", "refuse"),
            (None, "None", "refuse"),
            ("batch", "batch (other tensors)", "any"),
            (3, "an int", "refuse"),
        ],
    ),  # fmt: skip
    "epsilon": Param("float", optional_kw=True),
}
NORM_BWD_PARAMS = {**NORM_PARAMS, "epsilon": Param("float", nullable=True, optional_kw=True)}  # optional there


def _sdpa_draw(d: Draw, lib: str) -> Base:
    dt = d.choice(["bfloat16", "float16"])
    b, h, s, dd = 1, d.choice([1, 2]), d.choice([64, 128]), 64
    shape = (b, h, s, dd)
    kw: dict[str, Any] = {n: A(shape, dt, seed=d.seed()) for n in ("q", "k", "v")}
    if d.bool(0.4):
        kw["causal"] = True
    kw["o"] = A(shape, dt, fill="nan", out=True, seed=d.seed())
    kw["stats"] = A((b, h, s, 1), "float32", fill="nan", out=True, seed=d.seed())
    setup = {"dtype": dt, "defs": _defs(kw, ["q", "k", "v", "o", "stats"])}
    _graph_common_draw(d, kw, setup)
    return Base(kw, (), setup)


def _sdpa_call(ctx: Any) -> Any:
    from cudnnkit.graph import Graph

    g = Graph(**_graph_kw(ctx))
    t = {n: graph_tensor(ctx, g, n) for n in ("q", "k", "v")}
    opts = {k: ctx.arg(k) for k in ("causal", "scale", "dropout") if k in ctx.case.kwargs}
    r = g.sdpa_forward(t["q"], t["k"], t["v"], **opts)
    return run_graph(ctx, g, t, {"o": g.mark_output(r.o), "stats": g.mark_output(r.stats)})


def _sdpa_check(ctx: Any, outs: Any) -> list[str]:
    from ..gpu.test_graph_nodes_gpu import sdpa_ref

    q, k, v = ctx.x("q"), ctx.x("k"), ctx.x("v")
    scale = fnum(ctx.param("scale", None), 1 / math.sqrt(q.shape[-1]))
    o, st, _ = sdpa_ref(q, k, v, scale, bool(ctx.param("causal", False)))
    return ctx.compare(outs["o"], o, ctx.dtype, "o", 2e-2) + ctx.compare(outs["stats"], st, "float32", "stats", 1e-3)


SDPA_PARAMS = {
    "causal": Param("bool", optional_kw=True),
    "scale": Param(
        "float",
        nullable=True,
        optional_kw=True,
        bad=lambda c: [
            ("0.1", "a str", "refuse"),
            (float("nan"), "NaN", "refuse"),
            (complex(1, 0), "a complex", "refuse"),
        ],
    ),  # fmt: skip
    "dropout": Param(
        "float",
        lo=0.0,
        hi=1.0,
        hi_open=True,
        optional_kw=True,
        bad=lambda c: [(0.5, "0.5 without seed/offset", "refuse"), (1.5, "1.5", "refuse"), ("0.1", "a str", "refuse")],
    ),  # fmt: skip
}


# ----------------------------------------------------------------- the table


# ----------------------------------------------------------------- convolution


def _convolution_draw(d: Draw, lib: str, which: str = "forward") -> Base:
    """A valid convolution call: 1 to 3 spatial dims, groups (depthwise too), stride, symmetric padding, dilation,
    NCHW or channels-last, maybe ``out=`` with a blend."""
    dt = d.choice(F)
    nsp = d.int(1, 3)
    groups = d.choice([1, 1, 2, 3])
    cg, kg = d.int(1, 3), d.int(1, 3)
    c, k = cg * groups, kg * groups
    ksz = tuple(d.int(1, 3) for _ in range(nsp))
    dil = tuple(d.int(1, 2) for _ in range(nsp))
    pad = tuple(d.int(0, 2) for _ in range(nsp))
    # asymmetric padding (the graph path only: not float64, which has no graph form)
    post = tuple(d.int(0, 2) for _ in range(nsp)) if dt != "float64" and which != "bias" and d.bool(0.15) else pad
    st = tuple(d.int(1, 2) for _ in range(nsp))
    ext = [di * (ki - 1) + 1 for di, ki in zip(dil, ksz)]
    sp = tuple(max(e - p - q, 1) + d.int(0, 4) for e, p, q in zip(ext, pad, post))
    n = d.int(0, 2) if d.bool(0.05) else d.int(1, 2)
    xs, ws = (n, c, *sp), (k, cg, *ksz)
    ys = (n, k, *((i + p + q - e) // s + 1 for i, p, q, e, s in zip(sp, pad, post, ext, st)))
    lay = nchw_or_nhwc(d, nsp + 2)
    kw: dict[str, Any] = {}
    if which == "forward":
        kw["x"] = A(xs, dt, layout=lay, seed=d.seed())
        kw["w"] = A(ws, dt, fill="normal:0.5", layout=nchw_or_nhwc(d, nsp + 2), seed=d.seed())
        res, names = ys, ("x", "w")
    elif which == "data":
        kw["dy"] = A(ys, dt, layout=lay, seed=d.seed())
        kw["w"] = A(ws, dt, fill="normal:0.5", layout=nchw_or_nhwc(d, nsp + 2), seed=d.seed())
        kw["x_shape"] = xs
        res, names = xs, ("dy", "w")
    elif which == "filter":
        kw["x"] = A(xs, dt, layout=lay, seed=d.seed())
        kw["dy"] = A(ys, dt, layout=lay, seed=d.seed())
        kw["w_shape"] = ws
        res, names = ws, ("x", "dy")
    else:
        kw["dy"] = A(ys, dt, layout=lay, seed=d.seed())
        res, names = (k,), ("dy",)
    if which != "bias":
        kw["stride"], kw["dilation"] = st, dil
        kw["padding"] = pad if post == pad else tuple(zip(pad, post))
        if groups > 1:
            kw["groups"] = groups
        if d.bool(0.2):
            kw["mode"] = "convolution"
    # the fused forward: bias, a residual z, an activation (z_alpha, grouped or float32, and asymmetric padding: the
    # graph's convolution alone, then the legacy epilogue; cudnnkit.ops.convolution's module docstring)
    if which == "forward" and d.bool(0.3):
        if d.bool(0.7):
            kw["bias"] = A((k,), dt, seed=d.seed())
        if d.bool(0.4):
            kw["z"] = A(ys, dt, layout=lay, seed=d.seed())
            # a grouped or float32 fused graph with z_alpha != 1 is refused (cuDNN 9.19 wrote NaN, measured): the
            # legacy steps run it, or with asymmetric padding the graph's convolution alone and the legacy epilogue
            if d.bool(0.5):
                kw["z_alpha"] = d.choice([0.5, -1.0, 2.0])
        # a split forward (z_alpha, grouped or float32): its fused graph is refused, the convolution runs alone
        split = (groups > 1 or dt == "float32") and kw.get("z_alpha", 1.0) != 1.0
        if d.bool(0.7):
            legacy = ["relu", "sigmoid", "tanh", "elu", "swish"]
            # the graph-only modes need the fused graph, which float64 and a split forward lack
            graph = dt in ("float16", "bfloat16", "float32") and not split
            kw["activation"] = d.choice(legacy + ["gelu", "gelu_tanh", "leaky_relu"] if graph else legacy)
            side = side_draw(kw["x"], "coef")
            if kw["activation"] in ("elu", "swish", "leaky_relu") and side.bool(0.6):  # ELU alpha, swish beta, slope
                kw["activation_coef"] = side.choice([0.1, 0.3] if kw["activation"] == "leaky_relu" else [0.5, 1.7])
            if d.bool(0.3):  # the activation's NaN rule (finite data: the same values)
                kw["propagate_nan"] = True
        # alpha scales the convolution inside the fusion: the legacy steps take it (symmetric padding, a legacy
        # activation), and so does a split forward's graph (the convolution alone)
        legacy_act = kw.get("activation") in (None, "relu", "sigmoid", "tanh", "elu", "swish")
        if legacy_act and (post == pad or split) and d.bool(0.2):
            kw["alpha"] = d.choice([0.5, 2.0, -1.0])
        return Base(kw, names, {"dtype": dt, "groups": groups, "pre": pad, "post": post})
    draw_blend(d, kw, dt, res, layout=("c",))  # the graph path blends through a temporary (cudnnAddTensor)
    return Base(kw, names, {"dtype": dt, "groups": groups, "pre": pad, "post": post})


def _convolution_check(ctx: Any, res: Any, which: str = "forward") -> list[str]:
    from ..act_reference import act_forward
    from ..conv_reference import conv_backward_bias, conv_backward_data, conv_backward_filter, conv_forward

    g = ctx.case.setup
    if which == "bias":
        ref = conv_backward_bias(ctx.x("dy"))
    else:
        pre, post = tuple(g["pre"]), tuple(g["post"])
        # asymmetric padding as explicit zero padding of x around an unpadded convolution
        widths = [(0, 0), (0, 0)] + list(zip(pre, post))
        kw = dict(stride=tuple(ctx.param("stride")), pad=(0,) * len(pre), dilation=tuple(ctx.param("dilation")),
                  groups=int(g["groups"]), mode=ctx.param("mode", "cross_correlation"))  # fmt: skip
        if which == "forward":
            ref = conv_forward(np.pad(ctx.x("x"), widths), ctx.x("w"), **kw)
            fused = ctx.x("bias") is not None or ctx.x("z") is not None or ctx.param("activation") is not None
            if fused:  # act(alpha * conv + bias + z_alpha * z): alpha inside (beta must be 0)
                ref = fnum(ctx.param("alpha", 1.0), 1.0) * ref
            if ctx.x("bias") is not None:
                ref = ref + ctx.x("bias").reshape((1, -1) + (1,) * (ref.ndim - 2))
            if ctx.x("z") is not None:
                ref = ref + fnum(ctx.param("z_alpha", 1.0), 1.0) * ctx.x("z")
            if ctx.param("activation") is not None:
                ref = act_forward(ref, ctx.param("activation"), ctx.param("activation_coef"))
        elif which == "data":
            xs = ctx.param("x_shape")
            if xs is None:  # the transposed convolution's size: in = (out - 1) * stride - pads + dilation * (k - 1) + 1
                dy, w = ctx.x("dy"), ctx.x("w")
                xs = (dy.shape[0], w.shape[1] * int(g["groups"])) + tuple(
                    (o - 1) * s - p - q + dl * (k - 1) + 1
                    for o, s, p, q, dl, k in zip(dy.shape[2:], kw["stride"], pre, post, kw["dilation"], w.shape[2:])
                )
            xs = tuple(xs)
            padded = xs[:2] + tuple(i + p + q for i, p, q in zip(xs[2:], pre, post))
            ref = conv_backward_data(ctx.x("dy"), ctx.x("w"), padded, **kw)
            ref = ref[(slice(None), slice(None)) + tuple(slice(p, p + i) for p, i in zip(pre, xs[2:]))]
        else:
            ref = conv_backward_filter(np.pad(ctx.x("x"), widths), ctx.x("dy"), tuple(ctx.param("w_shape")), **kw)
    if not (which == "forward" and fused):
        ref = ctx.blend(ref, "out", "alpha", "beta")
    dt = ctx.dtype
    return ctx.compare(res, ref, dt, {"forward": "y", "data": "dx", "filter": "dw", "bias": "db"}[which],
                       _tol(dt, 4.0, f32=2e-3, half=2e-2))  # fmt: skip


def _convolution_ctor_draw(d: Draw, lib: str) -> Base:
    kw: dict[str, Any] = {}
    if d.bool(0.6):
        kw["stride"] = d.choice([1, 2, (1, 2)])
    if d.bool(0.6):
        kw["padding"] = d.choice([0, 1, (1, 0), "same", "valid", ((0, 1), (1, 1))])
    if d.bool(0.5):
        kw["dilation"] = d.choice([1, 2, (2, 1)])
    if d.bool(0.4):
        kw["groups"] = d.int(1, 8)
    if d.bool(0.3):
        kw["mode"] = d.choice(["cross_correlation", "convolution"])
    return Base(kw, (), {"dtype": "float32"})


def _convolution_ctor_check(ctx: Any, r: Any) -> list[str]:
    from cudnnkit import ops

    if not isinstance(r, ops.Convolution):
        return [f"returned {type(r).__name__}"]
    for k, v in ctx.case.kwargs.items():
        if getattr(r, k) != v:
            return [f"Convolution.{k} is {getattr(r, k)!r}, given {v!r}"]
    hash(r)
    return []


def _convolution_shape_rule(case: Case, name: str, old, new) -> str | None:
    """A changed dim of a convolution operand may still make a valid call (a larger spatial size, another batch
    without out=); whichever it is, it must be a clean outcome."""
    return "any"


CONVOLUTION_CTOR_PARAMS = {  # a Convolution takes 1 to 3 values per parameter (the rank is the call's)
    "stride": Param("ints", optional_kw=True, fixed_length=False),
    "padding": Param("ints", optional_kw=True, fixed_length=False),
    "dilation": Param("ints", optional_kw=True, fixed_length=False),
    "groups": Param("int", lo=1, optional_kw=True),
    "mode": Param("choice", optional_kw=True),
}
CONVOLUTION_PARAMS = {
    "stride": Param("ints", optional_kw=True),
    "padding": Param("ints", optional_kw=True),
    "dilation": Param("ints", optional_kw=True),
    "groups": Param("int", lo=1, optional_kw=True),
    "mode": Param("choice", optional_kw=True),
    "alpha": SCALE,
    "beta": BETA,
}

CONV_FUSED_PARAMS = {
    "z_alpha": Param("float", optional_kw=True),
    "activation": Param("choice", nullable=True, optional_kw=True),
    "activation_coef": Param("float", nullable=True, optional_kw=True),
    "propagate_nan": Param("bool", optional_kw=True),
}


# ----------------------------------------------------------------- pooling


def _pooling_draw(d: Draw, lib: str, backward: bool = False) -> Base:
    """A valid pooling call: 1 to 3 spatial dims, every mode, padding below the window (symmetric, or per side on
    the graph path: not float64, nor a max-pooling backward, which would need the forward's index), NCHW or
    channels-last, maybe ``out=`` with a blend; the backward's ``y`` is the forward's (derived)."""
    dt = d.choice(F)
    nsp = d.int(1, 3)
    win = tuple(d.int(1, 3) for _ in range(nsp))
    st = tuple(d.int(1, 2) for _ in range(nsp))
    pad = tuple(d.int(0, w - 1) for w in win)
    mode = d.choice(["max", "max_deterministic", "avg_include_padding", "avg_exclude_padding"])
    per_side = dt != "float64" and (not backward or mode.startswith("avg")) and d.bool(0.15)
    post = tuple(d.int(0, w - 1) for w in win) if per_side else pad
    n = d.int(0, 2) if d.bool(0.05) else d.int(1, 2)
    sp = tuple(max(w - p - q, 1) + d.int(0, 4) for w, p, q in zip(win, pad, post))
    xs = (n, d.int(1, 4), *sp)
    ys = (*xs[:2], *((i + p + q - w) // s + 1 for i, p, q, w, s in zip(sp, pad, post, win, st)))
    lay = nchw_or_nhwc(d, nsp + 2)
    kw: dict[str, Any] = {}
    # distinct values (a permutation): max pooling's gradient has one winner per window, as in the reference
    if backward:
        kw["dy"] = A(ys, dt, layout=lay, seed=d.seed())
        kw["y"] = A(ys, dt, fill="derived:y", layout=lay, seed=d.seed())
    kw["x"] = A(xs, dt, fill="derived:x", layout=lay, seed=d.seed())
    kw.update(mode=mode, window=win, stride=st, padding=pad if post == pad else tuple(zip(pad, post)))
    side = side_draw(kw["x"], "nan")
    if side.bool(0.2):  # max pooling's NaN rule (distinct finite values: the same result)
        kw["propagate_nan"] = side.bool()
    ys = _pooling_side_options(kw, dt, backward, sp, st, ys)
    draw_blend(d, kw, dt, xs if backward else ys, layout=("c",))
    return Base(kw, ("dy", "y", "x") if backward else ("x",), {"dtype": dt})


def _pooling_side_options(kw: dict, dt: str, backward: bool, sp: tuple, st: tuple, ys: tuple) -> tuple:
    """Options added after the pooling seeds were in use, from a side generator (old seeds regenerate): maybe
    ``ceil_mode`` (the output rounds up as torch's: y, dy and out take its shape; where it pads after, the graph
    runs, so not for float64, which has none); for max pooling (not float64) maybe ``return_index=True`` (the
    forward returns ``(y, index)``) or, in the backward, ``index=`` the forward's argmax, which the backward needs
    where the padding after differs from the padding before. Returns y's shape."""
    side = side_draw(kw["x"], "ceil")
    mode, win = kw["mode"], kw["window"]
    pre, post = _pool_split(kw["padding"])
    cpost = _ceil_post(sp, win, st, pre, post)
    if side.bool(0.5 if cpost != post else 0.2):  # mostly where it pads after (the graph path, the index)
        ceil = side.bool(0.85)
        cpost = cpost if ceil else post
        if not (dt == "float64" and cpost != post):
            kw["ceil_mode"] = ceil
            post = cpost
            ys = (*ys[:2], *((i + a + b - w) // s + 1 for i, a, b, w, s in zip(sp, pre, post, win, st)))
            if backward:
                kw["dy"], kw["y"] = kw["dy"].with_(shape=ys), kw["y"].with_(shape=ys)
    if not mode.startswith("max") or dt == "float64":
        return ys
    if backward:
        if pre != post or side.bool(0.15):  # the index makes the backward run on the graph
            kw["index"] = A(ys, _pool_index_dtype(win), fill="derived:index", layout=kw["dy"].layout,
                            seed=side.seed())  # fmt: skip
    elif side.bool(0.2):
        kw["return_index"] = True
    return ys


def _pool_split(padding: Any) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(before, after) per spatial dim of a drawn ``padding`` (ints, or (before, after) pairs)."""
    pre = tuple(p[0] if isinstance(p, (tuple, list)) else p for p in padding)
    post = tuple(p[1] if isinstance(p, (tuple, list)) else p for p in padding)
    return pre, post


def _ceil_post(sizes: tuple, window: tuple, stride: tuple, pre: tuple, post: tuple) -> tuple[int, ...]:
    """The padding after of ``ceil_mode`` as torch defines it (written here, not read from cudnnkit): ``out =
    ceil((in + before + after - window) / stride) + 1``, less one where the last window would start past the input
    and its padding before; the padding after grows to hold the last window."""
    out = []
    for i, k, s, a, b in zip(sizes, window, stride, pre, post):
        span = i + a + b - k
        n = -(-span // s) + 1
        if n > 1 and (n - 1) * s >= i + a:
            n -= 1
        out.append(max(b, (n - 1) * s + k - i - a))
    return tuple(out)


def _pool_index_dtype(window: tuple[int, ...]) -> str:
    return "int8" if math.prod(window) <= 127 else "int32"


def _pool_pads(ctx: Any, sizes: tuple[int, ...], window: tuple, stride: tuple) -> tuple:
    """The call's padding as (before, after) pairs, ``ceil_mode``'s padding after included."""
    pre, post = _pool_split(tuple(ctx.param("padding")))
    if ctx.param("ceil_mode", False):
        post = _ceil_post(sizes, window, stride, pre, post)
    return tuple(zip(pre, post))


def _pool_index_ref(x: np.ndarray, window: tuple, stride: tuple, pads: tuple) -> np.ndarray:
    """An argmax index (this module's convention: the position of the window's first maximum, row-major within the
    window, padded cells counted): what the CPU tiers hold in place of cuDNN's, whose convention is cuDNN's own."""
    from ..pool_reference import _out as _pool_out

    out = _pool_out(x.shape[2:], window, stride, pads)
    idx = np.zeros((*x.shape[:2], *out))
    for o in itertools.product(*(range(n) for n in out)):
        best = np.full(x.shape[:2], -np.inf)
        for k, off in enumerate(itertools.product(*(range(w) for w in window))):
            pos = [oi * s - p[0] + f for oi, s, p, f in zip(o, stride, pads, off)]
            if any(q < 0 or q >= n for q, n in zip(pos, x.shape[2:])):
                continue
            v = x[(slice(None), slice(None), *pos)]
            hit = v > best
            best = np.where(hit, v, best)
            idx[(slice(None), slice(None), *o)] = np.where(hit, k, idx[(slice(None), slice(None), *o)])
    return idx


def _pooling_derive(ctx: Any, key: str, a: A) -> np.ndarray | None:
    from ..pool_reference import _out as _pool_out
    from ..pool_reference import pool_forward

    if key == "x":  # distinct values, exactly representable in every float type
        rng = np.random.default_rng(a.seed)
        return rng.permutation(max(a.size, 1))[: a.size].reshape(a.shape).astype(np.float64) % 256 / 4
    x = ctx.x("x")
    if x is None:
        return None
    window, stride = tuple(ctx.param("window")), ctx.param("stride")  # stride None: the window
    stride = window if stride is None else tuple(stride)
    pad = _pool_pads(ctx, x.shape[2:], window, stride)
    if x.shape[:2] + _pool_out(x.shape[2:], window, stride, pad) != tuple(a.shape):
        # a mutated padding or stride: y cannot be the forward's (and a huge padding's reference would fill all
        # of the host's memory: seed 24 on the GPU, padding 2**40, the worker OOM-killed)
        return None
    if key == "index":
        return _pool_index_derive(ctx, x, window, stride, pad)
    return pool_forward(x, ctx.param("mode"), window, stride, pad)


def _pool_index_derive(ctx: Any, x: np.ndarray, window: tuple, stride: tuple, pad: tuple) -> np.ndarray:
    """The backward's ``index=``: on the GPU, what the forward (``return_index=True``) returns for this x (cuDNN's
    index convention is its own: the backward's result, checked against the max-pooling reference, tests the pair);
    elsewhere :func:`_pool_index_ref`."""
    if getattr(ctx.backend, "name", "") == "gpu":
        got = ctx.setup_values.get("pool_index")
        if got is None:
            from cudnnkit import ops

            try:
                names = ("mode", "window", "stride", "padding", "ceil_mode", "propagate_nan")
                kw = {n: ctx.param(n) for n in names if n in ctx.case.kwargs}
                _, index = ops.pooling_forward(ctx.objs["x"], return_index=True, **kw)
                got = ctx.setup_values["pool_index"] = ctx.got(index)
            except Exception:  # noqa: BLE001 - a mutated x or parameter the forward refuses: the CPU's index
                got = None
        if got is not None:
            return got
    return _pool_index_ref(x, window, stride, pad)


def _pooling_check(ctx: Any, res: Any, backward: bool = False) -> list[str]:
    """y (or dx) against the reference over the input padded as the call says (``ceil_mode``'s padding after
    included: an average including padding divides by the whole window there, as cuDNN, given that padding, does;
    torch divides by the part within input and declared padding, a documented difference). With ``return_index``
    the forward returns ``(y, index)``; the index, whose convention is cuDNN's, is checked for y's shape, its dtype
    and its range here, and for its meaning by the backward that takes it (``index=``: dx must be the reference's)."""
    from ..pool_reference import pool_backward, pool_forward

    window = tuple(ctx.param("window"))
    stride = ctx.param("stride")  # None: the window (pooling_forward's default)
    stride = window if stride is None else tuple(stride)
    x = ctx.x("x")
    args = (ctx.param("mode"), window, stride, _pool_pads(ctx, x.shape[2:], window, stride))
    ref = pool_backward(x, ctx.x("dy"), *args) if backward else pool_forward(x, *args)
    ref = ctx.blend(ref, "out", "alpha", "beta")
    dt = ctx.dtype
    p: list[str] = []
    if not backward and ctx.param("return_index", False) is True:
        if not (isinstance(res, tuple) and len(res) == 2):
            return [f"return_index=True returned {type(res).__name__}, not (y, index)"]
        res, index = res
        p += _pool_index_problems(ctx, index, ref.shape, window)
    # a layout that repeats or shares elements changes the values it holds: an index, or the x and y that max
    # pooling's backward searches for the maximum, that no longer match the forward's; dx is not the reference
    kws = ctx.case.kwargs
    read = ("index", "x", "y") if str(ctx.param("mode")).startswith("max") else ("index",)
    if backward and any(isinstance(kws.get(n), A) and kws[n].layout[0] in ("expand", "overlap") for n in read):
        ref = None
    tol = _tol(dt, 4.0, f32=1e-5, half=2e-2)
    return p + ctx.compare(res, ref, dt, "dx" if backward else "y", tol, shape=x.shape if backward else None)


def _pool_index_problems(ctx: Any, index: Any, shape: tuple[int, ...], window: tuple[int, ...]) -> list[str]:
    """The forward's index: y's shape, int8 (int32 for windows of more than 127 cells), a position in the window."""
    if index is None:
        return [] if 0 in shape else ["return_index=True returned no index"]
    p = ctx.compare_shape(index, shape, "index")
    if p:
        return p
    from cudnnkit.runtime import as_view

    try:
        dtype = as_view(index, "index").dtype
    except Exception:  # noqa: BLE001 - a host array (the CPU emulation): no device dtype to read
        dtype = None
    if dtype is not None and dtype != _pool_index_dtype(window):
        return [f"index has dtype {dtype}, expected {_pool_index_dtype(window)}"]
    v = ctx.got(index)
    if v is not None and v.size and not ((v >= 0) & (v < math.prod(window)) & (v == np.round(v))).all():
        bad = v[~((v >= 0) & (v < math.prod(window)))]
        return [f"index holds {bad.ravel()[:4].tolist()}, outside the window's {math.prod(window)} cells"]
    return []


def _pooling_ctor_draw(d: Draw, lib: str) -> Base:
    kw: dict[str, Any] = {}
    if d.bool(0.6):
        kw["mode"] = d.choice(["max", "max_deterministic", "avg_include_padding", "avg_exclude_padding"])
    if d.bool(0.6):
        kw["window"] = d.choice([2, 3, (3, 2)])
    if d.bool(0.4):
        kw["stride"] = d.choice([1, 2, (2, 1)])
    if d.bool(0.4):
        kw["padding"] = d.choice([0, 1, "same", ((0, 1), (1, 1))])
    if d.bool(0.3):
        kw["ceil_mode"] = d.bool()
    if d.bool(0.3):
        kw["propagate_nan"] = d.bool()
    return Base(kw, (), {"dtype": "float32"})


def _pooling_ctor_check(ctx: Any, r: Any) -> list[str]:
    from cudnnkit import ops

    if not isinstance(r, ops.Pooling):
        return [f"returned {type(r).__name__}"]
    for k, v in ctx.case.kwargs.items():
        if getattr(r, k) != v:
            return [f"Pooling.{k} is {getattr(r, k)!r}, given {v!r}"]
    return []


POOLING_PARAMS = {
    "mode": Param("choice", optional_kw=True),
    "window": Param("ints", optional_kw=True),
    "stride": Param("ints", optional_kw=True, nullable=True),
    "padding": Param("ints", optional_kw=True),
    "ceil_mode": Param("bool", strict_verdict="refuse", optional_kw=True),
    "propagate_nan": Param("bool", strict_verdict="refuse", optional_kw=True),
    "alpha": SCALE,
    "beta": BETA,
}
#: the forward's own (mutated only where drawn: an optional keyword would change old seeds' draws)
POOLING_FWD_PARAMS = {**POOLING_PARAMS, "return_index": Param("bool", strict_verdict="refuse")}
POOLING_CTOR_PARAMS = {
    "mode": Param("choice", optional_kw=True),
    "window": Param("ints", optional_kw=True, fixed_length=False),
    "stride": Param("ints", optional_kw=True, nullable=True, fixed_length=False),
    "padding": Param("ints", optional_kw=True, fixed_length=False),
    "ceil_mode": Param("bool", strict_verdict="refuse", optional_kw=True),
    "propagate_nan": Param("bool", strict_verdict="refuse", optional_kw=True),
}


# ----------------------------------------------------------------- activation

_ACT_MODES = ["sigmoid", "relu", "tanh", "clipped_relu", "elu", "swish"]


def _activation_draw(d: Draw, lib: str, backward: bool = False) -> Base:
    dt = d.choice(F)
    shape = tuple(d.int(0, 4) if d.bool(0.03) else d.int(1, 6) for _ in range(d.int(1, 5)))
    lay = valid_layout(d, shape)
    mode = d.choice(_ACT_MODES)
    kw: dict[str, Any] = {}
    if backward:
        kw["dy"] = A(shape, dt, layout=lay, seed=d.seed())
        kw["y"] = A(shape, dt, fill="derived:y", layout=lay, seed=d.seed())
    kw["x"] = A(shape, dt, fill="normal:2", layout=lay, seed=d.seed())
    kw["mode"] = mode
    if mode == "clipped_relu":
        kw["coef"] = d.choice([1.0, 6.0])
    elif mode in ("elu", "swish") and d.bool(0.5):
        kw["coef"] = d.choice([0.5, 1.0, 1.7])
    if d.bool(0.2):
        kw["propagate_nan"] = d.bool()
    draw_blend(d, kw, dt, shape, layout=("c",))
    return Base(kw, ("dy", "y", "x") if backward else ("x",), {"dtype": dt})


def _activation_derive(ctx: Any, key: str, a: A) -> np.ndarray | None:
    from ..act_reference import act_forward

    x = ctx.x("x")
    if x is None or x.shape != a.shape:
        return None
    return act_forward(x, ctx.param("mode", "relu"), ctx.param("coef"))


def _activation_check(ctx: Any, res: Any, backward: bool = False) -> list[str]:
    from ..act_reference import act_backward, act_forward

    mode, coef = ctx.param("mode", "relu"), ctx.param("coef")
    x = ctx.x("x")
    ref = act_backward(x, ctx.x("dy"), mode, coef) if backward else act_forward(x, mode, coef)
    ref = ctx.blend(ref, "out", "alpha", "beta")
    mask = None
    if backward and mode in ("relu", "clipped_relu"):  # at the kinks cuDNN and the reference may pick sides
        kink = (x == 0) | (x == coef) if coef is not None else x == 0
        if kink.any():
            mask, ref = ~kink, np.where(kink, 0.0, ref)
    dt = ctx.dtype
    return ctx.compare(res, ref, dt, "dx" if backward else "y", _tol(dt, 4.0, f32=1e-5, half=1e-2), mask=mask)


ACTIVATION_PARAMS = {
    "mode": Param("choice", optional_kw=True),
    "coef": Param("float", nullable=True, optional_kw=True),
    "propagate_nan": Param("bool", strict_verdict="refuse", optional_kw=True),
    "alpha": SCALE,
    "beta": BETA,
}


# ----------------------------------------------------------------- op_tensor, reduce_tensor


def _op_tensor_draw(d: Draw, lib: str) -> Base:
    dt = d.choice(F)
    shape = tuple(d.int(0, 3) if d.bool(0.03) else d.int(1, 5) for _ in range(d.int(1, 5)))
    op = d.choice(["add", "mul", "min", "max", "sqrt", "not"])
    kw: dict[str, Any] = {"a": A(shape, dt, fill="uniform:0.1:2" if op == "sqrt" else "normal",
                                 layout=valid_layout(d, shape), seed=d.seed()), "op": op}  # fmt: skip
    if op not in ("sqrt", "not"):
        bs = tuple(s if d.bool(0.6) else 1 for s in shape)
        kw["b"] = A(bs, dt, layout=valid_layout(d, bs), seed=d.seed())
        if d.bool(0.3):
            kw["alpha2"] = d.choice([0.5, -1.0])
    if d.bool(0.3):
        kw["alpha1"] = d.choice([1.0, 2.0, -0.5])
    side = side_draw(kw["a"], "nan")
    if side.bool(0.15):  # min/max's NaN rule (finite data: the same values)
        kw["propagate_nan"] = side.bool()
    draw_blend(d, kw, dt, shape, alpha="alpha1", layout=("c",))
    return Base(kw, ("a", "b") if "b" in kw else ("a",), {"dtype": dt})


def _op_tensor_check(ctx: Any, res: Any) -> list[str]:
    op = ctx.param("op", "add")
    a = ctx.x("a") * fnum(ctx.param("alpha1", 1.0), 1.0)
    b = ctx.x("b") * fnum(ctx.param("alpha2", 1.0), 1.0) if ctx.x("b") is not None else None
    ref = {"add": lambda: a + b, "mul": lambda: a * b, "min": lambda: np.minimum(a, b),
           "max": lambda: np.maximum(a, b), "sqrt": lambda: np.sqrt(a), "not": lambda: 1.0 - a}[op]()  # fmt: skip
    ref = ctx.blend(ref, "out", "_alpha1_is_inside_op", "beta")  # c = op(alpha1 * a, alpha2 * b) + beta * c
    dt = ctx.dtype
    return ctx.compare(res, ref, dt, "c", _tol(dt, 4.0, f32=1e-6, half=4e-3))


def _reduce_draw(d: Draw, lib: str) -> Base:
    dt = d.choice(F)
    nd = d.int(1, 5)
    shape = tuple(d.int(1, 5) for _ in range(nd))
    op = d.choice(["add", "mul", "min", "max", "amax", "avg", "norm1", "norm2", "mul_no_zeros"])
    kw: dict[str, Any] = {"a": A(shape, dt, fill="uniform:0.5:1.5" if op.startswith("mul") else "normal",
                                 layout=valid_layout(d, shape), seed=d.seed()), "op": op}  # fmt: skip
    axes = None
    if d.bool(0.6):
        axes = tuple(sorted({d.int(0, nd - 1) for _ in range(d.int(1, nd))}))
        kw["axes"] = axes
    out_shape = tuple(1 if axes is None or i in axes else n for i, n in enumerate(shape))
    side = side_draw(kw["a"], "nan")
    if side.bool(0.15):  # the NaN rule (finite data: the same values)
        kw["propagate_nan"] = side.bool()
    draw_blend(d, kw, dt, out_shape, layout=("c",))
    return Base(kw, ("a",), {"dtype": dt})


def _reduce_check(ctx: Any, res: Any) -> list[str]:
    a = ctx.x("a")
    op, axes = ctx.param("op", "add"), ctx.param("axes")
    ax = tuple(range(a.ndim)) if axes is None else tuple(int(i) % a.ndim for i in np.atleast_1d(axes))
    f = {"add": np.sum, "mul": np.prod, "min": np.min, "max": np.max, "avg": np.mean,
         "amax": lambda v, **k: np.max(np.abs(v), **k), "norm1": lambda v, **k: np.sum(np.abs(v), **k),
         "norm2": lambda v, **k: np.sqrt(np.sum(v * v, **k)),
         "mul_no_zeros": lambda v, **k: np.prod(np.where(v == 0, 1.0, v), **k)}[op]  # fmt: skip
    ref = ctx.blend(f(a, axis=ax, keepdims=True), "out", "alpha", "beta")
    dt = ctx.dtype
    return ctx.compare(res, ref, dt, "c", _tol(dt, 8.0, f32=1e-5, half=1e-2))


OP_TENSOR_PARAMS = {
    "op": Param("choice", optional_kw=True),
    "alpha1": SCALE,
    "alpha2": SCALE,
    "beta": BETA,
    "propagate_nan": Param("bool", strict_verdict="refuse", optional_kw=True),
}
REDUCE_PARAMS = {
    "op": Param("choice", optional_kw=True),
    "indices": Param("bool", strict_verdict="refuse", optional_kw=True),
    "propagate_nan": Param("bool", strict_verdict="refuse", optional_kw=True),
    "alpha": SCALE,
    "beta": BETA,
}


# ----------------------------------------------------------------- normalization (cudnnkit.ops.normalization, .layer_norm)

_P2 = ("float32", "float64")


def _pdt(dt: str) -> str:
    return "float64" if dt == "float64" else "float32"


def _bn_op_draw(d: Draw, lib: str, backward: bool = False) -> Base:
    dt = d.choice(F)
    pdt = _pdt(dt)
    nd = d.int(2, 5)
    shape = (d.int(2, 4), d.int(1, 4), *(d.int(1, 3) for _ in range(nd - 2)))
    mode = d.choice(["spatial", "spatial", "per_activation", "spatial_persistent"])
    ps = shape[1:] if mode == "per_activation" else (shape[1],)
    lay = nchw_or_nhwc(d, nd) if d.bool(0.8) else valid_layout(d, shape)
    kw: dict[str, Any] = {}
    if d.bool(0.3) or mode != "spatial":
        kw["mode"] = mode
    if d.bool(0.3):
        kw["epsilon"] = d.choice([1e-5, 1e-3, 0.1])
    out_lay = lay if lay == ("perm", (0, *range(2, nd), 1)) and d.bool() else ("c",)  # NHWC, or C order
    if backward:
        kw["dy"] = A(shape, dt, layout=lay, seed=d.seed())
        kw["x"] = A(shape, dt, fill="normal:2", layout=lay, seed=d.seed())
        kw["scale"] = A(ps, pdt, seed=d.seed())
        kw["saved_mean"] = A(ps, pdt, fill="derived:mean", seed=d.seed())
        kw["saved_inv_std"] = A(ps, pdt, fill="derived:inv", seed=d.seed())
        if d.bool(0.4):
            kw["dx"] = A(shape, dt, fill="nan", layout=out_lay, out=True, seed=d.seed())
        for n in ("dscale", "dbias"):
            if d.bool(0.3):
                kw[n] = A(ps, pdt, fill="nan", out=True, seed=d.seed())
        _bn_fused_draw(kw, dt, shape, lay, out_lay, True)
        return Base(kw, ("dy", "x", "scale", "saved_mean", "saved_inv_std"), {"dtype": dt})
    kw["x"] = A(shape, dt, fill="normal:2", layout=lay, seed=d.seed())
    kw["scale"] = A(ps, pdt, seed=d.seed())
    kw["bias"] = A(ps, pdt, seed=d.seed())
    running = d.bool(0.5)
    if running:
        kw["running_mean"] = A(ps, pdt, seed=d.seed())
        kw["running_var"] = A(ps, pdt, fill="uniform:0.5:2", seed=d.seed())
        if d.bool(0.3):
            kw["momentum"] = d.choice([0.0, 0.1, 0.5, 1.0])
    training = not (running and d.bool(0.3))
    if not training or d.bool(0.2):
        kw["training"] = training
    if d.bool(0.4):
        kw["y"] = A(shape, dt, fill="nan", layout=out_lay, out=True, seed=d.seed())
    if training:
        for n in ("saved_mean", "saved_inv_std"):
            if d.bool(0.3):
                kw[n] = A(ps, pdt, fill="nan", out=True, seed=d.seed())
    _bn_fused_draw(kw, dt, shape, lay, out_lay, False)
    return Base(kw, ("x", "scale", "bias"), {"dtype": dt})


def _bn_fused_draw(kw: dict, dt: str, shape: tuple, lay: tuple, out_lay: tuple, backward: bool) -> None:
    """The fused ReLU, from a side generator (old seeds regenerate): the forward's ``activation="relu"``, maybe with
    a residual ``z`` (``y = relu(bn(x) + z)``) and ``propagate_nan``; the backward's ``activation="relu"`` with the
    forward's ``y`` (a ReLU's output: the gradient passes where it is positive), maybe ``z_grad=True`` (``dz``, the
    ReLU's gradient, maybe into a given ``dz``). (Not drawn: the bit-packed mask, which needs C a multiple of 8, and
    the fused forward's reserve.)"""
    side = side_draw(kw["x"], "bn fused")
    if not side.bool(0.35):
        return
    kw["activation"] = "relu"
    if backward:
        kw["y"] = A(shape, dt, fill="derived:relu_y", layout=lay, seed=side.seed())
        if side.bool(0.4):
            kw["z_grad"] = True
            if side.bool(0.4):
                kw["dz"] = A(shape, dt, fill="nan", layout=out_lay, out=True, seed=side.seed())
        return
    if side.bool(0.5):
        kw["z"] = A(shape, dt, layout=lay if side.bool(0.7) else ("c",), seed=side.seed())
    if side.bool(0.3):
        kw["propagate_nan"] = side.bool(0.6)


def _bn_op_derive(ctx: Any, key: str, a: A) -> np.ndarray | None:
    from ..norm_reference import bn_forward

    if key == "relu_y":  # a ReLU's output: zero where it was not active (only where it is positive matters)
        return np.maximum(np.random.default_rng(a.seed).standard_normal(a.shape), 0.0)
    x = ctx.x("x")
    if x is None:
        return None
    eps = fnum(ctx.param("epsilon", 1e-5), 1e-5)
    mode = ctx.param("mode", "spatial")
    ps = x.shape[1:] if mode == "per_activation" else (x.shape[1],)
    _, mean, inv, _, _ = bn_forward(x, np.ones(ps), np.zeros(ps), eps, mode)
    v = mean if key == "mean" else inv
    return v if v.shape == a.shape else None


def _outs_call(fn: str, outs: tuple[str, ...]) -> Callable[[Any], Any]:
    """The call of a normalization op whose outputs the spec draws one by one: ``out=`` a tuple of them
    (inference: ``out=`` the main output alone)."""

    def call(ctx: Any) -> Any:
        import cudnnkit.ops as ops

        args, kw = list(ctx.call_args()), dict(ctx.call_kwargs())
        given = [kw.pop(n, None) for n in outs]
        if len(given) > 3 and given[3] is None and not _true(kw.get("z_grad")):
            given = given[:3]  # batch norm backward's dz: out= has one with z_grad=True
        t = kw.get("training", True)
        inference = isinstance(t, (bool, np.bool_)) and not t
        if inference:
            if given[0] is not None:
                kw["out"] = given[0]
        elif any(g is not None for g in given):
            kw["out"] = tuple(given)
        return getattr(ops, fn)(*args, **kw)

    return call


def _true(v: Any) -> bool:
    """Whether ``v`` is True as a Python or NumPy bool (what cudnnkit's bool options take)."""
    return isinstance(v, (bool, np.bool_)) and bool(v)


def _as_tuple(res: Any) -> tuple:
    return res if isinstance(res, tuple) else (res,)


def _dx_ref(dx: np.ndarray, dy: np.ndarray, gain: Any) -> np.ndarray | None:
    """``dx``, or None (checked for NaN only) where it cancels to rounding noise: with two values per statistic
    (or one feature) the normalized input is +-1 and dx is 0 analytically, so no relative error means anything."""
    scale = float(np.linalg.norm(dy)) * float(np.max(np.abs(gain))) if np.size(gain) else 0.0
    return None if float(np.linalg.norm(dx)) < 1e-3 * scale else dx


def _sum_ref(ref: np.ndarray, dy: np.ndarray) -> np.ndarray | None:
    """A parameter gradient (a sum of ``dy`` terms over the batch), or None where it cancels to rounding noise
    (a ``dy`` constant over the normalized dims gives ``dscale`` 0 analytically)."""
    scale = float(np.linalg.norm(dy)) * math.sqrt(dy.size / max(ref.size, 1))
    return None if float(np.linalg.norm(ref)) < 1e-3 * scale else ref


def _bn_op_check(ctx: Any, res: Any, backward: bool = False) -> list[str]:
    from ..norm_reference import bn_backward, bn_forward, bn_inference

    dt = ctx.dtype
    pdt = _pdt(ctx.case.setup["dtype"])
    mode = ctx.param("mode", "spatial")
    eps = fnum(ctx.param("epsilon", 1e-5), 1e-5)
    x, s = ctx.x("x"), ctx.x("scale")
    tol = _tol(dt, 10.0, f32=1e-4, half=2e-2)
    ptol = _tol(pdt, 10.0, f32=1e-4)
    res = _as_tuple(res)
    relu = ctx.param("activation") == "relu"
    if backward:
        dy = ctx.x("dy")
        if relu:  # the fused forward's backward: the ReLU's gradient (where its output y is positive) first
            dy = np.where(ctx.x("y") > 0, dy, 0.0)
        want = 4 if relu and _true(ctx.param("z_grad", False)) else 3
        if len(res) != want:
            return [f"returned {len(res)} arrays, expected {want}"]
        dx, ds, db = bn_backward(dy, x, s, ctx.x("saved_mean"), ctx.x("saved_inv_std"), mode)
        dx = _dx_ref(dx, dy, s * ctx.x("saved_inv_std"))
        p = (ctx.compare(res[0], dx, dt, "dx", tol, shape=x.shape)
             + ctx.compare(res[1], _sum_ref(ds, dy), pdt, "dscale", ptol * 4, shape=ds.shape)
             + ctx.compare(res[2], _sum_ref(db, dy), pdt, "dbias", ptol * 4, shape=db.shape))  # fmt: skip
        return p + (ctx.compare(res[3], dy, dt, "dz", tol) if want == 4 else [])
    b = ctx.x("bias")
    t = ctx.param("training", True)

    def fused(y: np.ndarray) -> np.ndarray:
        if not relu:
            return y
        return np.maximum(y + (ctx.x("z") if ctx.x("z") is not None else 0.0), 0.0)

    if not t:
        y = bn_inference(x, s, b, ctx.x("running_mean"), ctx.x("running_var"), eps, mode)
        return ctx.compare(res[0], fused(y), dt, "y", tol)
    rm, rv = ctx.x("running_mean"), ctx.x("running_var")
    mom = fnum(ctx.param("momentum", 0.1), 0.1)
    y, mean, inv, nrm, nrv = bn_forward(x, s, b, eps, mode, rm, rv, mom)
    if len(res) != (4 if relu else 3):
        return [f"returned {len(res)} arrays, expected {4 if relu else 3}"]
    p = ctx.compare(res[0], fused(y), dt, "y", tol) + ctx.compare(res[1], mean, pdt, "saved_mean", ptol)
    p += ctx.compare(res[2], inv, pdt, "saved_inv_std", ptol)
    if relu and res[3] is not None and len(ctx.shape_of(res[3]) or (0,)) != 1:
        p.append(f"reserve has shape {ctx.shape_of(res[3])}, not 1-d")
    if rm is not None:
        p += ctx.compare(ctx.arg("running_mean"), nrm, pdt, "running_mean", ptol)
        p += ctx.compare(ctx.arg("running_var"), nrv, pdt, "running_var", ptol)
    return p


def _gn_op_draw(d: Draw, lib: str, mode: str, backward: bool = False) -> Base:
    dt = d.choice(["float16", "bfloat16", "float32"])
    if mode == "instance":
        nd = d.int(3, 5)
        shape = (d.int(1, 4), d.int(1, 4), *(d.int(2, 4) for _ in range(nd - 2)))
        ps, ss = (shape[1],), shape[:2]
        lay = nchw_or_nhwc(d, nd) if d.bool(0.8) else valid_layout(d, shape)
        out_lay = lay if lay == ("perm", (0, *range(2, nd), 1)) and d.bool() else ("c",)
    else:
        k = d.choice([1, 1, 2])
        lead = tuple(d.int(1, 4) for _ in range(d.int(1, 2)))
        norm = tuple(d.choice([2, 3, 8, 16]) for _ in range(k))
        shape, ps, ss = lead + norm, norm, lead + (1,) * k
        lay, out_lay = valid_layout(d, lead + norm, p=0.2), ("c",)
    kw: dict[str, Any] = {}
    stats = ("inv_std",) if mode == "rms" else ("mean", "inv_std")
    if backward:
        kw["dy"] = A(shape, dt, layout=lay, seed=d.seed())
        kw["x"] = A(shape, dt, fill="normal:1.5", layout=lay, seed=d.seed())
        kw["scale"] = A(ps, "float32", seed=d.seed())
        for n in stats:
            kw[n] = A(ss, "float32", fill=f"derived:{n}", seed=d.seed())
        if d.bool(0.4):
            kw["dx"] = A(shape, dt, fill="nan", layout=out_lay, out=True, seed=d.seed())
        for n in ("dscale",) if mode == "rms" else ("dscale", "dbias"):
            if d.bool(0.3):
                kw[n] = A(ps, "float32", fill="nan", out=True, seed=d.seed())
        if mode != "instance" and d.bool(0.3):
            kw["normalized_shape_ndim"] = len(ps)
        return Base(kw, ("dy", "x", "scale", *stats), {"dtype": dt})
    kw["x"] = A(shape, dt, fill="normal:1.5", layout=lay, seed=d.seed())
    kw["scale"] = A(ps, "float32", seed=d.seed())
    if mode != "rms" and d.bool(0.8):
        kw["bias"] = A(ps, "float32", seed=d.seed())
    if d.bool(0.3):
        kw["epsilon"] = d.choice([1e-5, 1e-3])
    if mode != "instance" and d.bool(0.3):
        kw["normalized_shape_ndim"] = len(ps)
    training = d.bool(0.8)
    if not training or d.bool(0.2):
        kw["training"] = training
    if d.bool(0.4):
        kw["y"] = A(shape, dt, fill="nan", layout=out_lay, out=True, seed=d.seed())
    if training:
        for n in stats:
            if d.bool(0.3):
                kw[n] = A(ss, "float32", fill="nan", out=True, seed=d.seed())
    return Base(kw, ("x", "scale", "bias") if "bias" in kw else ("x", "scale"), {"dtype": dt})


def _gn_op_derive(mode: str) -> Callable:
    def derive(ctx: Any, key: str, a: A) -> np.ndarray | None:
        from .. import norm_reference as R

        x = ctx.x("x")
        if x is None:
            return None
        if mode == "instance":
            _, mean, inv = R.in_forward(x, np.ones(x.shape[1]))
        elif mode == "rms":
            _, inv = R.rms_forward(x, np.ones(x.shape[-_k(ctx) :]))
            mean = None
        else:
            _, mean, inv = R.ln_forward(x, np.ones(x.shape[-_k(ctx) :]))
        v = mean if key == "mean" else inv
        return v if v is not None and v.shape == a.shape else None

    return derive


def _k(ctx: Any) -> int:
    """The normalized dims of a layer/RMS-norm case: scale's."""
    s = ctx.x("scale")
    return s.ndim if s is not None else 1


def _gn_op_check(mode: str, backward: bool = False) -> Callable:
    def check(ctx: Any, res: Any) -> list[str]:
        from .. import norm_reference as R

        dt = ctx.dtype
        x, s = ctx.x("x"), ctx.x("scale")
        eps = fnum(ctx.param("epsilon", 1e-5), 1e-5)
        tol = _tol(dt, 10.0, f32=1e-4, half=2e-2)
        res = _as_tuple(res)
        if backward:
            dy = ctx.x("dy")
            if mode == "instance":
                want = R.in_backward(dy, x, s, ctx.x("mean"), ctx.x("inv_std"))
            elif mode == "rms":
                want = R.rms_backward(dy, x, s, ctx.x("inv_std"))
            else:
                want = R.ln_backward(dy, x, s, ctx.x("mean"), ctx.x("inv_std"))
            p = ctx.compare(res[0], _dx_ref(want[0], dy, s * ctx.x("inv_std").max()), dt, "dx", tol, shape=x.shape)
            for got, ref, what in zip(res[1:], want[1:], ("dscale", "dbias")):
                p += ctx.compare(got, _sum_ref(ref, dy), "float32", what, 2e-2 if dt != "float32" else 1e-3,
                                 shape=ref.shape)  # fmt: skip
            return p
        b = ctx.x("bias")
        if mode == "instance":
            want = R.in_forward(x, s, b, eps)
        elif mode == "rms":
            want = R.rms_forward(x, s, eps)
        else:
            want = R.ln_forward(x, s, b, eps)
        if not ctx.param("training", True):
            return ctx.compare(res[0], want[0], dt, "y", tol)
        p = ctx.compare(res[0], want[0], dt, "y", tol)
        for got, ref, what in zip(res[1:], want[1:], ("mean", "inv_std")[2 - len(want[1:]) :]):
            p += ctx.compare(got, ref, "float32", what, 1e-3)
        return p

    return check


_BN_PARAMS = {
    "mode": Param("choice", optional_kw=True),
    "epsilon": Param("float", lo=0.0, lo_open=True, optional_kw=True),
    "activation": Param("choice", nullable=True, optional_kw=True),
}
_BN_FWD_PARAMS = {
    **_BN_PARAMS,
    "momentum": Param("float", lo=0.0, hi=1.0, optional_kw=True),
    "training": Param(
        "bool",
        strict_verdict="refuse",
        optional_kw=True,
        bad=lambda c: [
            ("yes", "a str", "refuse"),
            (2, "an int", "refuse"),
            (None, "None", "refuse"),
            (np.bool_(True), "a NumPy bool True", "any"),
        ],
    ),  # fmt: skip
}
_GN_EPS = Param("float", lo=0.0, lo_open=True, f32=True, optional_kw=True)
_GN_NDIM = Param("int", nullable=True, optional_kw=True,
                 bad=lambda c: [(0, "0", "refuse"), (-1, "-1", "refuse"), (9, "9 (more than x's dims)", "refuse"),
                                (2.0, "a float", "refuse"), ("1", "a str", "refuse"), (True, "a bool", "refuse"),
                                (None, "None (scale's ndim)", "any")])  # fmt: skip
_GN_TRAINING = _BN_FWD_PARAMS["training"]


def _pin(kind: str = "in", dtypes=_P2, required: bool = True, **kw: Any) -> Role:
    """A parameter or statistic role (its own dtype group); the written ones (``inout``) are optional."""
    return Role(kind, dtypes, group="param", required=required and kind == "in", **kw)


_BN_FWD_ROLES = {
    "x": _in(shaped=False, ranks=(2, 5)),
    "scale": _pin(),
    "bias": _pin(),
    "running_mean": _pin("inout"),
    "running_var": _pin("inout"),
    "saved_mean": _pin("inout"),
    "saved_inv_std": _pin("inout"),
    "z": _in(required=False),
    "y": _out(),
}
_BN_BWD_ROLES = {
    "dy": _in(shaped=False, ranks=(2, 5)),
    "x": _in(),
    "scale": _pin(),
    "saved_mean": _pin(),
    "saved_inv_std": _pin(),
    "dscale": _pin("inout"),
    "dbias": _pin("inout"),
    "y": _in(required=False),
    "bias": _pin(required=False),
    "reserve": Role("in", ("uint8",), None, fixed_dtype=True, required=False),
    "dz": Role("inout", F, required=False),
    "relu_mask": Role("in", ("uint8",), None, fixed_dtype=True, required=False),  # the forward's return_mask=True
    "dx": _out(),
}
_GF = ("float16", "bfloat16", "float32")
_F32 = ("float32",)


def _gn_roles(mode: str, backward: bool) -> dict[str, Role]:
    stats = ("inv_std",) if mode == "rms" else ("mean", "inv_std")
    ranks = (3, 5) if mode == "instance" else (2, 8)
    if backward:
        roles = {"dy": _in(_GF, shaped=False, ranks=ranks), "x": _in(_GF), "scale": _pin(dtypes=_F32)}
        roles.update({n: _pin(dtypes=_F32) for n in stats})
        roles.update({n: _pin("inout", dtypes=_F32) for n in (("dscale",) if mode == "rms" else ("dscale", "dbias"))})
        roles["dx"] = _out(_GF)
        return roles
    roles = {"x": _in(_GF, shaped=False, ranks=ranks), "scale": _pin(dtypes=_F32)}
    if mode != "rms":
        roles["bias"] = _pin(dtypes=_F32, required=False)
    roles.update({n: _pin("inout", dtypes=_F32) for n in stats})
    roles["y"] = _out(_GF)
    return roles


def _gn_shape_rule(case: Case, name: str, old, new) -> str | None:
    """Layer/RMS norm: x's leading dims are free, its normalized (trailing) dims are scale's. With no bias, no
    ``normalized_shape_ndim`` and no given outputs, a forward's scale of any trailing dims of x is a valid call,
    and a backward's grown by leading dims that are x's and of size 1 normalizes over those size-1 dims too (its
    statistics' shape unchanged): the same call."""
    x = case.kwargs.get("x")
    alone = not isinstance(case.kwargs.get("bias"), A) and "normalized_shape_ndim" not in case.kwargs
    if name == "scale" and alone and isinstance(x, A) and 1 <= len(new) <= len(x.shape):
        if tuple(new) == tuple(x.shape[-len(new) :]) and case.op.endswith("_forward") and "out" not in case.kwargs:
            return "any"  # the forward normalizes over scale's dims, whichever trailing dims of x they are
        extra = x.shape[len(x.shape) - len(new) : len(x.shape) - len(old)]
        if len(old) < len(new) and tuple(new) == tuple(x.shape[-len(new) :]) and all(d == 1 for d in extra):
            return "any"
    if name not in ("x", "dy") or len(new) != len(old):
        return None
    k = len(case.kwargs["scale"].shape) if isinstance(case.kwargs.get("scale"), A) else 1
    if case.op.startswith("instance"):
        return None
    return "refuse" if tuple(new[-k:]) != tuple(old[-k:]) else None


def _bw(fn: Callable, **kw: Any) -> Callable:
    return lambda *a: fn(*a, **kw)


_SOFTMAX_ROLES = {"x": _in(shaped=False, ranks=(1, 8)), "out": _out()}
_SOFTMAX_BWD_ROLES = {"dy": _in(), "y": _in(), "out": _out()}


def _st_param_rule(case: Case, name: str, value: Any) -> str | None:
    return None


# ----------------------------------------------------------------- scaled dot-product attention (the ops)


def _sdpa_op_draw(d: Draw, lib: str, backward: bool = False) -> Base:
    """A valid :func:`~cudnnkit.ops.sdpa_forward` / ``sdpa_backward`` call: q ``(B, H, S_q, D)``, k and v with
    ``H_kv`` of ``H`` or 1, ``D``/``D_v`` multiples of 8, BHSD or BSHD memory (or any input layout: the op copies a
    non-contiguous head dim), maybe ``scale``/``causal``; the forward maybe ``training=False`` and ``out=``; the
    backward's o and stats the float64 forward of the drawn q, k, v (``derived:``)."""
    dt = d.choice(["float16", "bfloat16"])
    b = d.int(0, 2) if d.bool(0.05) else d.int(1, 2)
    h = d.int(1, 3)
    hk = h if d.bool(0.7) else 1
    sq = d.int(1, 24)
    skv = sq if d.bool(0.5) else d.int(1, 24)
    dd = d.choice([8, 16, 32, 64, 64, 128])
    dv = dd if d.bool(0.7) else d.choice([8, 16, 32, 64, 128])
    shapes = {"q": (b, h, sq, dd), "k": (b, hk, skv, dd), "v": (b, hk, skv, dv)}
    bshd = d.bool(0.3)

    def lay(shape: tuple[int, ...]) -> tuple:
        return ("perm", (0, 2, 1, 3)) if bshd else valid_layout(d, shape, 0.2)

    kw: dict[str, Any] = {n: A(s, dt, layout=lay(s), seed=d.seed()) for n, s in shapes.items()}
    if d.bool(0.3):
        kw["scale"] = d.choice([0.1, 0.25, 1.0, -0.5])
    if d.bool(0.5):
        kw["causal"] = d.bool(0.7)
    os_, ss = (b, h, sq, dv), (b, h, sq, 1)
    if backward:
        kw["o"] = A(os_, dt, fill="derived:o", seed=d.seed())
        kw["do"] = A(os_, dt, layout=lay(os_), seed=d.seed())
        kw["stats"] = A(ss, "float32", fill="derived:stats", seed=d.seed())
        return Base(kw, ("q", "k", "v", "o", "do", "stats"), {"dtype": dt})
    training = d.bool(0.8)
    if not training or d.bool(0.2):
        kw["training"] = training
    if d.bool(0.3):
        kw["out"] = A(os_, dt, fill="nan", out=True, seed=d.seed())
    if training and d.bool(0.3):
        kw["stats"] = A(ss, "float32", fill="nan", out=True, seed=d.seed())
    return Base(kw, ("q", "k", "v"), {"dtype": dt})


def _sdpa_scale(ctx: Any, d: int) -> float:
    s = ctx.param("scale", None)
    return 1 / math.sqrt(d) if s is None else fnum(s)


def _sdpa_op_derive(ctx: Any, key: str, a: A) -> np.ndarray | None:
    """The backward's ``o`` and ``stats``: the float64 forward of its q, k, v (a shared head broadcast)."""
    from ..gpu.test_graph_nodes_gpu import sdpa_ref

    q, k, v = ctx.x("q"), ctx.x("k"), ctx.x("v")
    if q is None or k is None or v is None:
        return None
    reps = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, reps, axis=1), np.repeat(v, reps, axis=1)
    causal = ctx.param("is_causal", False) if "attention" in ctx.spec.name else ctx.param("causal", False)
    o, st, _ = sdpa_ref(q, k, v, _sdpa_scale(ctx, q.shape[-1]), bool(causal))
    return o if key == "o" else st


def _sdpa_valid(shapes: dict[str, tuple[int, ...]]) -> bool:
    """Whether arrays of these shapes make a valid call (the ops' rules: cudnnkit.ops.attention)."""
    q, k, v = shapes["q"], shapes["k"], shapes["v"]
    if len(q) != 4 or len(k) != 4 or len(v) != 4:
        return False
    (b, h, sq, dd), (bk, hk, skv, dk), (bv, hv, sv, dv) = q, k, v
    if bk != b or bv != b or hv != hk or h < 1 or hk not in (1, h) or sv != skv or sq < 1 or skv < 1 or dk != dd:
        return False
    if any(x % 8 or not 8 <= x <= 256 for x in (dd, dv)):
        return False
    want = {"o": (b, h, sq, dv), "do": (b, h, sq, dv), "out": (b, h, sq, dv), "stats": (b, h, sq, 1)}
    return all(tuple(shapes[n]) == w for n, w in want.items() if n in shapes)


def _sdpa_op_shape(case: Case, name: str, old, new) -> str | None:
    """A changed dim is valid where the arrays still make a call: S_q or D_v alone (no tied o/out), H with a
    shared key/value head, B of 0 stays valid only with every array's."""
    shapes = {n: tuple(a.shape) for n, a in case.kwargs.items() if isinstance(a, A)}
    shapes[name] = tuple(new)
    return "any" if _sdpa_valid(shapes) else "refuse"


def _sdpa_op_check(ctx: Any, res: Any, backward: bool = False) -> list[str]:
    """Shapes and no NaN (no float64 reference checked here: tests/gpu check the values)."""
    q, v, dt = ctx.x("q"), ctx.x("v"), ctx.dtype
    if q is None or v is None:
        return []
    if backward:
        if not isinstance(res, tuple) or len(res) != 3:
            return [f"returned {type(res).__name__}, not (dq, dk, dv)"]
        want = (q.shape, ctx.x("k").shape, v.shape)
        return [p for r, s, n in zip(res, want, ("dq", "dk", "dv")) for p in ctx.compare(r, None, dt, n, None, shape=s)]
    o_shape = q.shape[:3] + v.shape[3:]
    if ctx.param("training", True) is False:
        return ctx.compare(res, None, dt, "o", None, shape=o_shape)
    if not isinstance(res, tuple) or len(res) != 2:
        return [f"returned {type(res).__name__}, not (o, stats)"]
    return (ctx.compare(res[0], None, dt, "o", None, shape=o_shape)
            + ctx.compare(res[1], None, "float32", "stats", None, shape=q.shape[:3] + (1,)))  # fmt: skip


def _attn_op_draw(d: Draw, lib: str, backward: bool = False) -> Base:
    """A valid :func:`~cudnnkit.ops.attention_forward` / ``attention_backward`` call: :func:`_sdpa_op_draw`'s with
    torch's names (``is_causal``; ``enable_gqa=True`` for a shared key/value head; no ``training``), maybe a
    variant (:func:`_attn_variants`: bounds, alignment, softcap, bias, ALiBi, lengths, sinks). Dropout, packed and
    paged calls are checked by tests/test_attention_variants_cpu.py and tests/gpu only."""
    base = _sdpa_op_draw(d, lib, backward)
    kw = dict(base.kwargs)
    if "causal" in kw:
        kw["is_causal"] = kw.pop("causal")
    kw.pop("training", None)
    if kw["k"].shape[1] != kw["q"].shape[1]:
        kw["enable_gqa"] = True
    _attn_variants(kw, backward)
    return Base(kw, base.positional, base.setup)


def _attn_variants(kw: dict[str, Any], backward: bool) -> None:
    """Maybe a valid variant (from draws of its own, :func:`side_draw`, so an old seed's case keeps its draws): a
    softcap alone, or the masks (a left/right bound, bottom-right alignment), ALiBi with a top-left causal mask;
    an ``attn_mask`` bias (any broadcast shape, q's dtype or float32), padding lengths, sinks; the backward's
    ``dbias``/``dsink``. Only the combinations attention_forward documents as run (cuDNN 9.19's): the refused
    ones are the mutations'. With lengths and a band, ``S_q_b <= S_kv_b`` (no valid row loses every key)."""
    s = side_draw(kw["q"], "attention variants")
    if not s.bool(0.6):
        return
    (b, h, sq, _), skv, dt = kw["q"].shape, kw["k"].shape[2], kw["q"].dtype
    causal = kw.get("is_causal") is True
    padded = b >= 1 and s.bool(0.3)
    left = right = softcap = None
    bottom = False
    if not causal and not padded and s.bool(0.25):
        softcap = s.choice([0.5, 1.0, 2.0, 10.0])  # small: a cap of 50 barely bends scores of a few units
    else:
        if (padded or sq <= skv) and s.bool(0.4):
            left = s.int(1, 4) if s.bool(0.6) else s.int(1, max(sq, skv) + 1)
        if not causal and s.bool(0.3):
            right = s.int(0, 3)
        elif causal and s.bool(0.1):
            right = 0  # is_causal=True is right_bound=0: the same mask passed both ways
        banded = causal or left is not None or right is not None
        if banded and (padded or sq <= skv) and s.bool(0.4):
            bottom = True
        elif banded and s.bool(0.2):
            kw["diagonal_alignment"] = "top_left"
    if softcap is not None:
        kw["softcap"] = softcap
    if left is not None:
        kw["left_bound"] = left
    if right is not None:
        kw["right_bound"] = right
    if bottom:
        kw["diagonal_alignment"] = "bottom_right"
    right_bounded = causal or right is not None
    if causal and not bottom and s.bool(0.3):
        shape = (h,) if s.bool() else (1, h, 1, 1)
        kw["alibi_slopes"] = A(shape, "float32", fill="uniform:0.01:1.0", seed=s.seed())
    if not (bottom and right_bounded) and s.bool(0.35):
        lead = s.choice([(), (1,), (h,), (1, 1), (b, 1), (1, h), (b, h)])
        kw["attn_mask"] = A((*lead, sq, skv), s.choice([dt, dt, "float32"]), seed=s.seed())
    if sq > 1 and s.bool(0.25):
        kw["sink"] = A((h,) if s.bool() else (1, h, 1, 1), "float32", seed=s.seed())
    if padded:
        banded = causal or left is not None or right is not None
        lkv = [s.int(1, skv) for _ in range(b)]
        lq = [s.int(1, min(sq, n) if banded else sq) for n in lkv]
        shape = (b,) if s.bool() else (b, 1, 1, 1)
        kw["seq_len_q"] = A(shape, "int32", values=tuple(lq), seed=s.seed())
        kw["seq_len_kv"] = A(shape, "int32", values=tuple(lkv), seed=s.seed())
        if backward:
            kw["do"] = kw["do"].with_(fill="derived:do")  # zero past each S_q_b, as tests/gpu pass it
    if backward:
        if "attn_mask" in kw and not padded and s.bool(0.5):
            kw["dbias"] = True
        if "sink" in kw and s.bool(0.5):  # without dsink the backward leaves the sink out (the stats hold it)
            kw["dsink"] = True


def _attn_ref(ctx: Any) -> dict[str, Any] | None:
    """The float64 reference of an attention call as drawn (tests/gpu/test_attention_gpu.py's ``keep_matrix`` and
    ``reference``, from the definition): o, stats, the keep mask, and which rows of q and k/v are defined
    (``S_q_b``/``S_kv_b``; a row with no key kept is not). None without torch. The backward's gradients are
    :func:`_attn_grads`' (from the o, stats and do the call was handed)."""
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        return None
    from ..gpu.test_attention_gpu import keep_matrix, reference

    q, k, v = ctx.x("q"), ctx.x("k"), ctx.x("v")
    if q is None or k is None or v is None or q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
        return None
    b, h, sq, _ = q.shape
    skv = k.shape[2]
    lq = lkv = None
    if ctx.x("seq_len_q") is not None and ctx.x("seq_len_kv") is not None:
        lq = [int(x) for x in ctx.x("seq_len_q").reshape(-1)]
        lkv = [int(x) for x in ctx.x("seq_len_kv").reshape(-1)]
    causal = bool(ctx.param("is_causal", False))
    left, right = ctx.param("left_bound", None), ctx.param("right_bound", None)
    align = ctx.param("diagonal_alignment", "top_left")
    keep = keep_matrix(sq, skv, b=b, causal=causal, left=left, right=right, align=align, lens_q=lq, lens_kv=lkv)
    sink = ctx.x("sink")
    softcap = ctx.param("softcap", None)
    do = np.zeros(q.shape[:3] + v.shape[3:])  # the forward's only: the gradients are _attn_grads'
    o, lse, _ = reference(q, k, v, do, scale=_sdpa_scale(ctx, q.shape[-1]), keep=keep, bias=ctx.x("attn_mask"),
                          slopes=ctx.x("alibi_slopes"), softcap=None if softcap is None else fnum(softcap),
                          sink=None if sink is None else sink.reshape(1, h, 1, 1))  # fmt: skip
    rows_q = keep.any(axis=-1)[:, :, :, None]  # (b, 1, sq, 1): a row with a key kept
    rows_kv = np.ones((b, 1, skv, 1), bool)
    if lq is not None:
        for i in range(b):
            rows_q[i, :, lq[i] :] = False
            rows_kv[i, :, lkv[i] :] = False
    return {"o": o, "stats": lse, "keep": keep, "rows_q": rows_q, "rows_kv": rows_kv, "lq": lq}


def _attn_grads(ctx: Any, ref: dict[str, Any]) -> list[np.ndarray | None] | None:
    """The backward's float64 reference (dq, dk, dv, dbias, dsink) from the arrays the call was handed, as the
    backward is defined (flash attention's): ``P = exp(s - stats)`` from the given stats (s as
    :func:`_attn_ref`'s reference makes it, masked by ``keep`` and the padding: a row past ``S_q_b`` has
    ``P = 0`` and no cotangent), ``D = rowsum(do * o)`` from the given o and do, ``dS = P (do v^T - D)``; the
    sink's ``dsink_h = -sum exp(sink_h - stats) D``. Given the forward's o and stats this is the gradient of
    tests/gpu's ``reference``; a rounded o (a saturated softmax's) moves D as it moves the device's, and an o,
    stats or do whose layout repeats or shares elements (a mutation's) is what the device reads. None where o,
    stats or do is missing or of another shape, or (float16) P or dS past float16's range (stats not the
    forward's: the device's P holds inf); NaN where the given o or stats is not defined (a row with no key);
    dsink None where the rows past ``S_q_b`` hold a ``do * o`` (do expanded along S: whether cuDNN's sum
    reads those rows is not documented)."""
    q, k, v = (np.asarray(ctx.x(n), np.float64) for n in ("q", "k", "v"))
    o, do, st = ctx.x("o"), ctx.x("do"), ctx.x("stats")
    b, h, sq, _ = q.shape
    hk, skv = k.shape[1], k.shape[2]
    o_shape = q.shape[:3] + v.shape[3:]
    if o is None or do is None or st is None or hk < 1 or h % hk or v.shape[1] != hk:
        return None
    if o.shape != o_shape or do.shape != o_shape or st.shape != q.shape[:3] + (1,):
        return None
    o, do, st = (np.asarray(a, np.float64) for a in (o, do, st))
    idx = np.arange(h) // (h // hk)
    kk, vv = k[:, idx], v[:, idx]
    scale = _sdpa_scale(ctx, q.shape[-1])
    s = scale * (q @ np.swapaxes(kk, -1, -2))
    cap = ctx.param("softcap", None)
    t = None
    if cap is not None:
        cap = fnum(cap)
        t = np.tanh(s / cap)
        s = cap * t
    bias = ctx.x("attn_mask")
    if bias is not None:
        s = s + np.asarray(bias, np.float64)
    slopes = ctx.x("alibi_slopes")
    if slopes is not None:
        s = s + np.asarray(slopes, np.float64).reshape(1, h, 1, 1) * (np.arange(skv)[None, :] - np.arange(sq)[:, None])
    keep = np.array(ref["keep"])
    live = np.ones((b, 1, sq, 1), bool)  # rows before S_q_b: the padding mask drops the others whole
    if ref["lq"] is not None:
        for i, n in enumerate(ref["lq"]):
            live[i, :, n:] = False
    keep &= live
    p = np.exp(np.where(keep, s, -np.inf) - st)  # NaN in a row whose given stats is not finite (no key kept)
    dd = (do * o).sum(-1, keepdims=True)
    pad_dd = np.where(live, 0.0, dd).any()  # a do * o on a row past S_q_b (NaN included)
    dd = np.where(live, dd, 0.0)
    do = np.where(live, do, 0.0)
    ds = p * (do @ np.swapaxes(vv, -1, -2) - dd)
    if ctx.dtype == "float16" and max(np.nanmax(p, initial=0.0), np.nanmax(np.abs(ds), initial=0.0)) > 3e4:
        return None
    dbias = dsink = None
    if bias is not None:
        lead = (1,) * (4 - bias.ndim) + bias.shape
        dbias = ds.sum(axis=tuple(ax for ax in (0, 1) if lead[ax] == 1), keepdims=True).reshape(bias.shape)
    sink = ctx.x("sink")
    if sink is not None and not pad_dd:
        ps = np.exp(np.asarray(sink, np.float64).reshape(1, h, 1, 1) - st)
        dsink = -np.where(live, ps * dd, 0.0).sum(axis=(0, 2, 3))
    if t is not None:
        ds = ds * (1 - t * t)
    ds = scale * ds
    dq = ds @ kk
    dk = (np.swapaxes(ds, -1, -2) @ q).reshape(b, hk, h // hk, skv, q.shape[-1]).sum(2)
    dv = (np.swapaxes(p, -1, -2) @ do).reshape(b, hk, h // hk, skv, do.shape[-1]).sum(2)
    return [dq, dk, dv, dbias, dsink]


def _attn_op_derive(ctx: Any, key: str, a: A) -> np.ndarray | None:
    """The backward's ``o`` and ``stats`` (the float64 forward of the drawn call, rows past ``S_q_b`` zero as
    tests/gpu pass them), and with lengths ``do`` (random, zero past ``S_q_b``)."""
    if key == "do":
        v = np.random.default_rng(a.seed & 0xFFFFFFFF).standard_normal(a.shape)
        lq = ctx.x("seq_len_q")
        if lq is not None and len(a.shape) == 4 and lq.size == a.shape[0]:
            for i, n in enumerate(lq.reshape(-1)):
                v[i, :, int(n) :] = 0.0
        return v
    ref = _attn_ref(ctx)
    if ref is None:
        return None
    got = np.array(ref[key])
    if ref["lq"] is not None:
        for i, n in enumerate(ref["lq"]):
            got[i, :, n:] = 0.0
    return got


#: the unit roundoff of the dtypes attention runs in: the absolute floor of a gradient's comparison is this
#: times the gradient's natural scale (a gradient zero by the math, v expanded along S, is noise on both sides)
_ATTN_EPS = {"float16": 2.0**-11, "bfloat16": 2.0**-8}
#: the relative error allowed for stats (float32 out of float32 arithmetic: tighter than tests/gpu's TOL)
_ATTN_STATS_TOL = 1e-3


def _attn_pad_rows(ctx: Any, q: np.ndarray, k: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows of q and of k/v before ``S_q_b``/``S_kv_b`` (all without lengths), (b, 1, S, 1) each."""
    b, sq, skv = q.shape[0], q.shape[2], k.shape[2]
    rows_q, rows_kv = np.ones((b, 1, sq, 1), bool), np.ones((b, 1, skv, 1), bool)
    lq, lkv = ctx.x("seq_len_q"), ctx.x("seq_len_kv")
    if lq is not None and lkv is not None and lq.size == b and lkv.size == b:
        for i, (n, m) in enumerate(zip(lq.reshape(-1), lkv.reshape(-1))):
            rows_q[i, :, int(n) :] = False
            rows_kv[i, :, int(m) :] = False
    return rows_q, rows_kv


def _attn_compare(got: np.ndarray, want: np.ndarray, dtype: str, what: str, tol: float, mask: np.ndarray,
                  floor: float = 0.0) -> list[str]:  # fmt: skip
    """:meth:`Ctx.compare_values` on the defined elements (``mask``), the norm of the reference floored at
    ``floor`` (attention's own: the other ops compare as before)."""
    got = np.where(mask, got, 0.0)
    bad = ~np.isfinite(got)
    if bad.any():
        i = tuple(int(j) for j in np.argwhere(bad)[0])
        return [f"{what}: {int(bad.sum())} non-finite values where the reference is finite (at {i}: {got[i]})"]
    diff = got - want
    norm = max(float(np.linalg.norm(want)), floor)
    err = float(np.linalg.norm(diff)) / norm if norm > 0 else float(np.abs(diff).max(initial=0.0))
    if err > tol:
        i = np.unravel_index(int(np.argmax(np.abs(diff))), diff.shape)
        return [f"{what}: relative error {err:.3g} > {tol:g} ({dtype}; worst element {got[i]!r} vs {want[i]!r})"]
    return []


def _attn_op_check(ctx: Any, res: Any, backward: bool = False) -> list[str]:
    """Shapes, then on the defined rows only (rows past ``S_q_b``/``S_kv_b`` and a row with no key kept are not
    defined: cuDNN leaves them unwritten) no NaN and the values against the float64 references, at
    tests/gpu/test_attention_gpu.py's ``TOL`` of the dtype: o and stats (:func:`_attn_ref`); the backward's dq
    (rows of S_q_b), dk and dv (rows of S_kv_b), dbias and dsink (:func:`_attn_grads`, from the o, stats and do
    the call was handed, so an o, stats or do whose layout repeats or shares elements is checked against what
    the device reads; a gradient's norm floored at its natural scale times the dtype's roundoff)."""
    q, k, v, dt = ctx.x("q"), ctx.x("k"), ctx.x("v"), ctx.dtype
    if q is None or k is None or v is None:
        return []
    extra = [n for n in ("dbias", "dsink") if ctx.param(n, False) is True]
    if backward:
        if not isinstance(res, tuple) or len(res) != 3 + len(extra):
            return [f"returned {type(res).__name__}, not (dq, dk, dv{''.join(', ' + n for n in extra)})"]
        shapes = [q.shape, k.shape, v.shape] + [ctx.x("attn_mask" if n == "dbias" else "sink").shape for n in extra]
        names = ["dq", "dk", "dv"] + extra
    else:
        if not isinstance(res, tuple) or len(res) != 2:
            return [f"returned {type(res).__name__}, not (o, stats)"]
        shapes, names = [q.shape[:3] + v.shape[3:], q.shape[:3] + (1,)], ["o", "stats"]
    problems = [p for r, s, n in zip(res, shapes, names) for p in ctx.compare_shape(r, s, n)]
    if problems or q.size == 0:
        return problems
    ref = _attn_ref(ctx) if q.ndim == k.ndim == v.ndim == 4 else None
    refs: dict[str, Any] = {}
    if ref is not None:
        rows_q, rows_kv = ref["rows_q"], ref["rows_kv"]
        grads = _attn_grads(ctx, ref) if backward else None
        if not backward:
            refs = {"o": ref["o"], "stats": ref["stats"]}
        elif grads is not None:
            refs = dict(zip(("dq", "dk", "dv", "dbias", "dsink"), grads))
    elif q.ndim == k.ndim == 4:
        rows_q, rows_kv = _attn_pad_rows(ctx, q, k)
    else:
        rows_q = rows_kv = np.ones((), bool)
    masks = {"o": rows_q, "stats": rows_q, "dq": rows_q, "dk": rows_kv, "dv": rows_kv}
    tol: dict[str, float] = {}
    floors: dict[str, float] = {}
    if refs:
        from ..gpu.test_attention_gpu import TOL as gpu_tol

        tol = {n: gpu_tol.get(dt, gpu_tol["bfloat16"]) for n in names}
        tol["stats"] = _ATTN_STATS_TOL
        if backward:  # |dq_i| <= 2 scale |do_i| max|v_j| max|k_j| (rows of P sum to at most 1), and so on
            eps = _ATTN_EPS.get(dt, _ATTN_EPS["bfloat16"])
            big = {n: float(np.linalg.norm(np.asarray(ctx.x(n), np.float64), axis=-1).max(initial=0.0))
                   for n in ("q", "k", "v")}  # fmt: skip
            ndo = float(np.linalg.norm(np.where(rows_q, np.asarray(ctx.x("do"), np.float64), 0.0)))
            scale = abs(_sdpa_scale(ctx, q.shape[-1]))
            floors = {"dq": scale * ndo * big["v"] * big["k"], "dk": scale * ndo * big["v"] * big["q"], "dv": ndo,
                      "dbias": ndo * big["v"], "dsink": ndo * big["v"]}  # fmt: skip
            floors = {n: eps * f for n, f in floors.items()}
    out = []
    for r, s, n in zip(res, shapes, names):
        got = ctx.got(r)
        if got is None:
            continue
        got = np.asarray(got, np.float64)
        m = np.broadcast_to(masks[n], got.shape) if n in masks else np.ones(got.shape, bool)
        want = refs.get(n)
        if want is None:  # no reference (no torch, or o/stats/do not as drawn): no NaN on the defined rows
            if np.isnan(np.where(m, got, 0.0)).any():
                out.append(f"{n} holds NaN")
            continue
        want = np.asarray(want, np.float64).reshape(s)
        if not np.isfinite(want[m]).all():
            continue  # this output's reference is not defined there (a mutated call: a row with every key masked)
        odt = "float32" if n in ("stats", "dsink") else dt
        out += _attn_compare(got, np.where(m, want, 0.0), odt, n, tol[n], m, floors.get(n, 0.0))
    return out


def _attn_op_shape(case: Case, name: str, old, new) -> str | None:
    """As :func:`_sdpa_op_shape`, with torch's rule for the heads: ``H_kv`` other than ``H`` only with
    ``enable_gqa=True``, then any divisor of ``H``."""
    shapes = {n: tuple(a.shape) for n, a in case.kwargs.items() if isinstance(a, A)}
    shapes[name] = tuple(new)
    q, k, v = shapes["q"], shapes["k"], shapes["v"]
    gqa = case.kwargs.get("enable_gqa", False) is True
    if len(q) == len(k) == len(v) == 4 and q[1] >= 1 and k[1] >= 1 and k[1] == v[1] and q[1] % k[1] == 0:
        if k[1] == q[1] or gqa:  # the heads rule met: the rest as sdpa's, with H_kv taken as H or 1
            if not _attn_variant_valid(case, shapes):
                return "refuse"
            shapes["k"] = k[:1] + ((1,) if k[1] != q[1] else (q[1],)) + k[2:]
            shapes["v"] = v[:1] + ((1,) if v[1] != q[1] else (q[1],)) + v[2:]
            return "any" if _sdpa_valid(shapes) else "refuse"
    return "refuse"


def _attn_variant_valid(case: Case, shapes: dict[str, tuple[int, ...]]) -> bool:
    """Whether the variant's arrays fit these shapes of q and k, and its masks their lengths (attention_forward's
    rules: ``attn_mask`` ending in ``(S_q, S_kv)``, its leading dims 1 or B, 1 or H; lengths of B; slopes and
    sinks of H, a sink with ``S_q > 1``; without lengths a left bound, or a bottom-right right bound, with
    ``S_q <= S_kv``)."""
    (b, h, sq, _), skv = shapes["q"], shapes["k"][2]
    m = shapes.get("attn_mask")
    if m is not None:
        dims = (1,) * (4 - len(m)) + m
        if not 2 <= len(m) <= 4 or m[-2:] != (sq, skv) or dims[0] not in (1, b) or dims[1] not in (1, h):
            return False
    if any(n in shapes and shapes[n] not in ((b,), (b, 1, 1, 1)) for n in ("seq_len_q", "seq_len_kv")):
        return False
    if any(n in shapes and shapes[n] not in ((h,), (1, h, 1, 1)) for n in ("alibi_slopes", "sink")):
        return False
    if "sink" in shapes and sq == 1:
        return False
    kw = case.kwargs
    padded = "seq_len_q" in shapes
    right = kw.get("is_causal") is True or kw.get("right_bound") is not None
    bottom = kw.get("diagonal_alignment") == "bottom_right" and right
    return padded or sq <= skv or not (bottom or kw.get("left_bound") is not None)


_SDPA_H = ("float16", "bfloat16")
_SDPA_ST = Role("in", ("float32",), None, fixed_dtype=True)
_SDPA_OP_PARAMS = {
    "scale": Param("float", nullable=True, f32=True, optional_kw=True),
    "causal": Param("bool", strict_verdict="refuse", optional_kw=True),
}
#: the attention variants' optional arrays (attn_mask, the lengths, slopes and sinks drawn by _attn_variants for
#: attention_forward/backward; dropout's seed/offset, the page tables and ragged offsets not drawn:
#: tests/test_attention_variants_cpu.py and tests/gpu check them); described for the registry's operands
_SDPA_VARIANT_ROLES = {
    "attn_mask": Role("in", ("float16", "bfloat16", "float32"), None, required=False),
    **{n: Role("in", ("int32",), None, required=False, fixed_dtype=True) for n in ("seq_len_q", "seq_len_kv")},
    "alibi_slopes": Role("in", ("float32",), None, required=False, fixed_dtype=True),
    **{n: Role("in", ("int64",), None, required=False, fixed_dtype=True) for n in ("seed", "offset")},
    "sink": Role("in", ("float32",), None, required=False, fixed_dtype=True),
    **{n: Role("in", ("int32",), None, required=False, fixed_dtype=True) for n in ("page_table_k", "page_table_v")},
    # a packed (THD) call's ragged offsets, made by attention_forward/backward from cu_seqlens
    **{
        f"ragged_{n}": Role("in", ("int64",), None, required=False, fixed_dtype=True)
        for n in ("q", "k", "v", "o", "do", "dq", "dk", "dv")
    },  # fmt: skip
}
_SDPA_FWD_ROLES = {
    "q": _in(_SDPA_H),
    "k": _in(_SDPA_H),
    "v": _in(_SDPA_H),
    **_SDPA_VARIANT_ROLES,
    "out": _out(_SDPA_H),
    "stats": Role("out", ("float32",), None, required=False, fixed_dtype=True),
}
_SDPA_BWD_ROLES = {
    **{n: _in(_SDPA_H) for n in ("q", "k", "v", "o", "do")},
    "stats": _SDPA_ST,
    **_SDPA_VARIANT_ROLES,
    # new arrays (no out=): described for the registry's outputs (dattn_mask: attn_mask's gradient, dbias=True)
    **{n: _out(_SDPA_H) for n in ("dq", "dk", "dv", "dattn_mask")},
    "dsink": Role("out", ("float32",), None, required=False, fixed_dtype=True),
}


SPECS: dict[str, OpSpec] = {}


def _add(spec: OpSpec) -> None:
    SPECS[spec.name] = spec


_add(OpSpec("Convolution", _convolution_ctor_draw, {}, CONVOLUTION_CTOR_PARAMS,
            check=_convolution_ctor_check, streams=False, weight=0.3))  # fmt: skip
_add(OpSpec("convolution_forward", _convolution_draw, {"x": _in(), "w": _in(), "bias": _in(required=False, shaped=False),
            "z": _in(required=False), "out": _out()}, {**CONVOLUTION_PARAMS, **CONV_FUSED_PARAMS},
            check=_convolution_check, shape_rule=_convolution_shape_rule, weight=1.5))  # fmt: skip
_add(OpSpec("convolution_backward_data", _bw(_convolution_draw, which="data"), {"dy": _in(), "w": _in(), "out": _out()},
            {**CONVOLUTION_PARAMS, "x_shape": Param("ints", optional_kw=True, nullable=True)}, check=_bw(_convolution_check, which="data"),
            shape_rule=_convolution_shape_rule))  # fmt: skip
_add(OpSpec("convolution_backward_filter", _bw(_convolution_draw, which="filter"), {"x": _in(), "dy": _in(), "out": _out()},
            {**CONVOLUTION_PARAMS, "w_shape": Param("ints")}, check=_bw(_convolution_check, which="filter"),
            shape_rule=_convolution_shape_rule))  # fmt: skip
_add(OpSpec("convolution_backward_bias", _bw(_convolution_draw, which="bias"), {"dy": _in(), "out": _out()},
            {"alpha": SCALE, "beta": BETA}, check=_bw(_convolution_check, which="bias"), shape_rule=_convolution_shape_rule))  # fmt: skip
_add(OpSpec("Pooling", _pooling_ctor_draw, {}, POOLING_CTOR_PARAMS, check=_pooling_ctor_check, streams=False,
            weight=0.3))  # fmt: skip
_add(OpSpec("pooling_forward", _pooling_draw, {"x": _in(), "out": _out()}, POOLING_FWD_PARAMS,
            check=_pooling_check, derive=_pooling_derive, shape_rule=_convolution_shape_rule))  # fmt: skip
_add(OpSpec("pooling_backward", _bw(_pooling_draw, backward=True), {"dy": _in(), "y": _in(), "x": _in(),
            "index": _in(("int8", "int32"), group=None, required=False, fixed_dtype=True), "out": _out()},
            POOLING_PARAMS, check=_bw(_pooling_check, backward=True), derive=_pooling_derive,
            shape_rule=_convolution_shape_rule))  # fmt: skip
_add(OpSpec("activation_forward", _activation_draw, {"x": _in(shaped=False, ranks=(1, 8)), "out": _out()},
            ACTIVATION_PARAMS, check=_activation_check))  # fmt: skip
_add(OpSpec("activation_backward", _bw(_activation_draw, backward=True),
            {"dy": _in(), "y": _in(), "x": _in(), "out": _out()}, ACTIVATION_PARAMS,
            check=_bw(_activation_check, backward=True), derive=_activation_derive))  # fmt: skip
_add(OpSpec("op_tensor", _op_tensor_draw, {"a": _in(shaped=False, ranks=(1, 8)), "b": _in(required=False, shaped="broadcast"),
            "out": _out()}, OP_TENSOR_PARAMS, check=_op_tensor_check, shape_rule=_convolution_shape_rule))  # fmt: skip
_add(OpSpec("reduce_tensor", _reduce_draw, {"a": _in(shaped=False, ranks=(1, 8)), "out": _out()}, REDUCE_PARAMS,
            check=_reduce_check, shape_rule=_convolution_shape_rule))  # fmt: skip
_add(OpSpec("softmax_forward", _softmax_draw, _SOFTMAX_ROLES, SOFTMAX_PARAMS, check=_softmax_check, weight=2))
_add(OpSpec("softmax_backward", _bw(_softmax_draw, backward=True), _SOFTMAX_BWD_ROLES, SOFTMAX_PARAMS,
            check=_bw(_softmax_check, backward=True), weight=1.5))  # fmt: skip
_add(OpSpec("dropout_forward", _dropout_draw, {"x": _in(F3, shaped=False), "out": _out(F3)}, DROPOUT_PARAMS,
            check=_dropout_check, mutations=_dropout_mutations, mutation_weight=0.5))  # fmt: skip
_add(OpSpec("dropout_backward", _bw(_dropout_draw, backward=True),
            {"dy": _in(F3), "reserve": Role("in", ("uint8",), None, fixed_dtype=True), "out": _out(F3)},
            DROPOUT_PARAMS, check=_bw(_dropout_check, backward=True), setup=_dropout_setup,
            mutations=_dropout_mutations, mutation_weight=0.5, shape_rule=_dropout_bwd_shape))  # fmt: skip
_add(OpSpec("DropoutState", _state_draw, {"like": Role("in", ALL_DTYPES, None, shaped=False)},
            {"seed": Param("int", lo=0, hi=2**64 - 1, optional_kw=True)}, check=_state_check, weight=0.4))  # fmt: skip
_add(OpSpec("default_state", _bw(_state_draw, default=True), {"like": Role("in", ALL_DTYPES, None, shaped=False)}, {},
            check=_state_check, weight=0.3))  # fmt: skip
_add(OpSpec("lrn_forward", _lrn_draw, {"x": _in(F3, shaped=False, ranks=(3, 8)), "out": _out(F3)},
            {**LRN_PARAMS, "y_alpha": SCALE, "y_beta": BETA}, check=_lrn_check, derive=_lrn_derive))  # fmt: skip
_add(OpSpec("lrn_backward", _bw(_lrn_draw, backward=True), {"dy": _in(F3), "y": _in(F3), "x": _in(F3), "out": _out(F3)},
            {**LRN_PARAMS, "dx_alpha": SCALE, "dx_beta": BETA}, check=_bw(_lrn_check, backward=True),
            derive=_lrn_derive))  # fmt: skip
_add(OpSpec("divisive_normalization_forward", _divnorm_draw,
            {"x": _in(F3, shaped=False), "means": _in(F3, required=False), "out": _out(F3)},
            {**LRN_PARAMS, "y_alpha": SCALE, "y_beta": BETA}, check=_divnorm_check))  # fmt: skip
_add(OpSpec("divisive_normalization_backward", _bw(_divnorm_draw, backward=True),
            {"dy": _in(F3), "x": _in(F3), "means": _in(F3, required=False), "dx_out": _out(F3),
             "dmeans_out": _out(F3)}, {**LRN_PARAMS, "dx_alpha": SCALE, "dx_beta": BETA},
            call=out_tuple_call("divisive_normalization_backward", ("dx_out", "dmeans_out")),
            check=_bw(_divnorm_check, backward=True)))  # fmt: skip
_add(OpSpec("affine_grid_forward", _affine_draw, {"theta": _in(F3), "out": _out(F3)}, {"size": ST_SIZE},
            check=_affine_check, derive=_st_derive))  # fmt: skip
_add(OpSpec("affine_grid_backward", _bw(_affine_draw, backward=True), {"dgrid": _in(F3), "out": _out(F3)},
            {"size": ST_SIZE}, check=_bw(_affine_check, backward=True),
            coupled=(frozenset(("size", "dgrid")),)))  # fmt: skip
_add(OpSpec("grid_sample_forward", _sample_draw, {"x": _in(F3), "grid": _in(F3), "out": _out(F3)},
            {"alpha": SCALE, "beta": BETA}, check=_sample_check, derive=_st_derive, shape_rule=_sample_shape))  # fmt: skip
_add(OpSpec("grid_sample_backward", _bw(_sample_draw, backward=True),
            {"x": _in(F3), "grid": _in(F3), "dy": _in(F3), "dx_out": _out(F3), "dgrid_out": _out(F3)},
            {"alpha": SCALE, "beta": BETA, "alpha_dgrid": SCALE, "beta_dgrid": BETA},
            call=out_tuple_call("grid_sample_backward", ("dx_out", "dgrid_out")),
            check=_bw(_sample_check, backward=True), derive=_st_derive, shape_rule=_sample_shape))  # fmt: skip
_add(OpSpec("ctc_loss", _ctc_draw, CTC_ROLES,
            {"blank": Param("int", lo=0, hi=0, optional_kw=True), "normalization": Param("choice", optional_kw=True),
             "algo": Param("choice", optional_kw=True), "oob_grads": Param("choice", optional_kw=True)},
            call=out_tuple_call("ctc_loss", ("costs_out", "grads_out")), check=_ctc_check, mutations=_ctc_mutations,
            shape_rule=_ctc_shape_rule, dtype_rule=_ctc_index_dtype, weight=1.5,
            # a label (input length) out of range for x's A (T) may fit once x's shape changes (seed 1611, #16592)
            coupled=(frozenset(("labels", "x")), frozenset(("input_lengths", "x")))))  # fmt: skip
_add(OpSpec("RNN", _rnn_ctor_draw, {}, RNN_PARAMS, check=_rnn_ctor_check, param_rule=_rnn_param_rule,
            streams=False))  # fmt: skip
_add(OpSpec("LinearParams", _linear_draw, {}, {}, call=_linear_call, check=_linear_check, setup=_rnn_setup,
            weight=0.5, keywords=False))  # fmt: skip
_add(OpSpec("rnn_forward", _rnn_draw, RNN_ROLES,
            {"training": Param("bool", strict_verdict="refuse", optional_kw=True),
             "layout": Param("choice", optional_kw=True)},
            check=_rnn_check, setup=_rnn_setup, mutations=_rnn_mutations, mutation_weight=3,
            shape_rule=_rnn_shape_rule, dtype_rule=_rnn_dtype_rule, weight=2.5))  # fmt: skip
_add(OpSpec("rnn_backward", _bw(_rnn_draw, backward=True), RNN_BWD_ROLES,
            {"layout": Param("choice", optional_kw=True),
             "accumulate": Param("bool", strict_verdict="refuse", optional_kw=True),
             "keep_reserve": Param("bool", strict_verdict="refuse", optional_kw=True)},
            check=_bw(_rnn_check, backward=True), setup=_rnn_setup, mutations=_rnn_mutations, mutation_weight=3,
            shape_rule=_rnn_shape_rule, dtype_rule=_rnn_dtype_rule, weight=2, from_setup=("y", "reserve")))  # fmt: skip
_add(OpSpec("torch_param_names", _names_draw, {}, {}, check=_names_check, streams=False, weight=0.3))
_add(OpSpec("load_torch_params", _load_draw, {}, {}, check=_load_check, setup=_rnn_setup, mutations=_load_mutations,
            mutation_weight=4, weight=0.7))  # fmt: skip
_add(OpSpec("to_torch_params", _to_torch_draw, {}, {}, check=_to_torch_check, setup=_rnn_setup, weight=0.5))
_add(OpSpec("set_tensor", _set_draw, {"y": Role("inout", F, shaped=False, elementwise=True)},
            {"value": Param("float", finite=False, scaling=True)}, check=_set_check))  # fmt: skip
_add(OpSpec("scale_tensor", _bw(_set_draw, scale=True), {"y": Role("inout", F, shaped=False, elementwise=True)},
            {"alpha": SCALE}, check=_bw(_set_check, scale=True)))  # fmt: skip
_add(OpSpec("add_tensor", _add_draw, {"a": _in(shaped="broadcast"), "c": Role("inout", F, shaped=False)},
            {"alpha": SCALE, "beta": BETA}, check=_add_check, shape_rule=_add_shape))  # fmt: skip
_add(OpSpec("transform_tensor", _transform_draw, {"x": _in(shaped=False), "out": _out()}, TRANSFORM_PARAMS,
            check=_transform_check))  # fmt: skip
_add(OpSpec("Graph", _graph_ctor_draw, {}, {
    "compute_dtype": Param("dtype", optional_kw=True), "intermediate_dtype": Param("dtype", optional_kw=True),
    "alignment": GRAPH_EXEC_PARAMS["alignment"]}, call=_graph_ctor_call, check=_graph_ctor_check, streams=False,
    weight=0.4, graph=True))  # fmt: skip
_add(OpSpec("Graph.tensor", _tensor_draw, {}, TENSOR_PARAMS, call=_tensor_call, check=_tensor_check, streams=False,
            weight=0.6, graph=True))  # fmt: skip
_add(_gspec("Graph.pointwise", _pw_draw, _pw_call, _pw_check, {n: _grole() for n in ("x", "b", "dy")} |
            {"y": _grole("out")}, PW_PARAMS, 2))  # fmt: skip
_add(_gspec("Graph.matmul", _mm_draw, _mm_call, _mm_check, {"a": _grole(), "b": _grole(), "c": _grole("out")}, {}))
_add(_gspec("Graph.conv_fprop", _conv_draw, _conv_call, _conv_check,
            {"x": _grole(), "w": _grole(), "y": _grole("out")}, CONV_PARAMS, 1.5))  # fmt: skip
_add(_gspec("Graph.reduction", _red_draw, _red_call, _red_check, {"x": _grole(), "y": _grole("out", ("float32",))},
            RED_PARAMS))  # fmt: skip
_add(_gspec("Graph.resample_forward", _pool_draw, _pool_call, _pool_check, {"x": _grole(), "y": _grole("out")},
            POOL_PARAMS))  # fmt: skip
_add(_gspec("Graph.resample_backward", _bw(_pool_draw, backward=True), _pool_bwd_call,
            _bw(_pool_check, backward=True), {"dy": _grole(), "dx": _grole("out")}, POOL_PARAMS, 0.7))  # fmt: skip
_add(_gspec("Graph.norm_forward", _norm_draw, _norm_call, _norm_check,
            {"x": _grole(), "scale": _grole(dtypes=("float32",)), "bias": _grole(dtypes=("float32",)),
             "y": _grole("out"), "inv_variance": _grole("out", ("float32",)), "mean": _grole("out", ("float32",))},
            NORM_PARAMS, 0.8))  # fmt: skip
_add(_gspec("Graph.norm_backward", _bw(_norm_draw, backward=True), _norm_bwd_call, _bw(_norm_check, backward=True),
            {"x": _grole(), "dy": _grole(), "scale": _grole(dtypes=("float32",)),
             "mean": _grole(dtypes=("float32",)), "inv_variance": _grole(dtypes=("float32",)),
             "dx": _grole("out"), "dscale": _grole("out", ("float32",)), "dbias": _grole("out", ("float32",))},
            NORM_BWD_PARAMS, 0.6))  # fmt: skip
_add(_gspec("Graph.sdpa_forward", _sdpa_draw, _sdpa_call, _sdpa_check,
            {"q": _grole(), "k": _grole(), "v": _grole(), "o": _grole("out"), "stats": _grole("out", ("float32",))},
            SDPA_PARAMS, 0.5))  # fmt: skip

_add(OpSpec("batch_norm_forward", _bn_op_draw, _BN_FWD_ROLES,
            {**_BN_FWD_PARAMS, "propagate_nan": Param("bool", strict_verdict="refuse")}, check=_bn_op_check,
            call=_outs_call("batch_norm_forward", ("y", "saved_mean", "saved_inv_std"))))  # fmt: skip
_add(OpSpec("batch_norm_backward", _bw(_bn_op_draw, backward=True), _BN_BWD_ROLES,
            {**_BN_PARAMS, "z_grad": Param("bool", strict_verdict="refuse", optional_kw=True)},
            check=_bw(_bn_op_check, backward=True), derive=_bn_op_derive,
            call=_outs_call("batch_norm_backward", ("dx", "dscale", "dbias", "dz"))))  # fmt: skip
for _m, _fn in (("layer", "layer_norm"), ("rms", "rms_norm"), ("instance", "instance_norm")):
    _stats = ("inv_std",) if _m == "rms" else ("mean", "inv_std")
    _grads = ("dscale",) if _m == "rms" else ("dscale", "dbias")
    _fp = {"epsilon": _GN_EPS, "training": _GN_TRAINING} | (
        {} if _m == "instance" else {"normalized_shape_ndim": _GN_NDIM}
    )
    _bp = {} if _m == "instance" else {"normalized_shape_ndim": _GN_NDIM}
    _add(OpSpec(f"{_fn}_forward", _bw(_gn_op_draw, mode=_m), _gn_roles(_m, False), _fp, check=_gn_op_check(_m),
                call=_outs_call(f"{_fn}_forward", ("y", *_stats)), shape_rule=_gn_shape_rule, weight=0.7))  # fmt: skip
    _add(OpSpec(f"{_fn}_backward", _bw(_gn_op_draw, mode=_m, backward=True), _gn_roles(_m, True), _bp,
                check=_gn_op_check(_m, backward=True), derive=_gn_op_derive(_m),
                call=_outs_call(f"{_fn}_backward", ("dx", *_grads)), shape_rule=_gn_shape_rule, weight=0.5))  # fmt: skip
del _m, _fn, _stats, _grads, _fp, _bp

_add(OpSpec("sdpa_forward", _sdpa_op_draw, _SDPA_FWD_ROLES,
            {**_SDPA_OP_PARAMS, "training": Param("bool", strict_verdict="refuse", optional_kw=True)},
            call=_outs_call("sdpa_forward", ("out", "stats")), check=_sdpa_op_check, shape_rule=_sdpa_op_shape,
            weight=0.7))  # fmt: skip
_add(OpSpec("sdpa_backward", _bw(_sdpa_op_draw, backward=True), _SDPA_BWD_ROLES, _SDPA_OP_PARAMS,
            check=_bw(_sdpa_op_check, backward=True), derive=_sdpa_op_derive, shape_rule=_sdpa_op_shape,
            weight=0.5))  # fmt: skip
_ATTN_OP_PARAMS = {
    "scale": _SDPA_OP_PARAMS["scale"],
    "is_causal": Param("bool", strict_verdict="refuse", optional_kw=True),
    "enable_gqa": Param("bool", strict_verdict="refuse", optional_kw=True),
    # the variant's keywords (drawn by _attn_variants; not optional_kw, so a case without them mutates as before)
    "softcap": Param("float", lo=0.0, lo_open=True, nullable=True, f32=True),
    "left_bound": Param("int", lo=1, nullable=True),
    "right_bound": Param("int", lo=0, nullable=True),
    "diagonal_alignment": Param("choice", choices=("top_left", "bottom_right")),
}


def _attn_param_rule(case: Case, name: str, value: Any) -> str | None:
    """A bound of 2**31 or more may pass: a window wider than any sequence (the top-left band's bound is a float32
    scalar, where it keeps every key); an int32 one (bottom-right with lengths, right_bound) is refused by name."""
    if name in ("left_bound", "right_bound") and type(value) is int and value >= 2**31:
        return "any"
    return None


_ATTN_BWD_PARAMS = {**_ATTN_OP_PARAMS, **{n: Param("bool", strict_verdict="refuse") for n in ("dbias", "dsink")}}
_add(OpSpec("attention_forward", _attn_op_draw, _SDPA_FWD_ROLES, _ATTN_OP_PARAMS,
            call=_outs_call("attention_forward", ("out", "stats")), check=_attn_op_check, shape_rule=_attn_op_shape,
            param_rule=_attn_param_rule, weight=0.4))  # fmt: skip
_add(OpSpec("attention_backward", _bw(_attn_op_draw, backward=True), _SDPA_BWD_ROLES, _ATTN_BWD_PARAMS,
            check=_bw(_attn_op_check, backward=True), derive=_attn_op_derive, shape_rule=_attn_op_shape,
            param_rule=_attn_param_rule, weight=0.3))  # fmt: skip

for _s in SPECS.values():
    if _s.derive is None and _s.name in ("Graph.norm_backward",):
        _s.derive = _norm_derive
del _s
