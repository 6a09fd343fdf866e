"""Strategies over everything a careless or hostile user passes, and the case generator.

Every strategy is written once, against a tiny drawing interface (:class:`Draw`: ``int``, ``choice``, ``bool``,
``float``, ``seed``), and exists in two forms over the same definition:

* a Hypothesis strategy (:func:`shapes`, :func:`dtypes`, :func:`layouts`, :func:`non_arrays`, :func:`bad_values`,
  :func:`bad_streams`, :func:`bad_pointers`, :func:`unknown_keywords`, :func:`case_strategy`), drawn through
  :class:`HypothesisDraw`: the CPU tier runs them under ``@given``;
* a seeded generator (:func:`generate`, through :class:`RandomDraw`): the GPU tier and ``scripts/fuzz`` need
  thousands of cases, deterministic for a seed and cheap to draw, in a worker process.

A case is a valid call drawn from the op's description (``specs.SPECS[op].draw``) with ONE aspect mutated
(:func:`mutate`): an array's dtype, shape, layout (gapped, transposed, expanded, overlapping, reversed,
misaligned), read-only flag, library or kind (a host array, a list, an int, ``None``), the lies of its
``__cuda_array_interface__`` (a NULL pointer, a missing key, a negative dim) or device; a parameter's value
(wrong type, NaN, inf, 1e300, out of range, bool, complex, a NumPy scalar); an unknown keyword; a missing
argument; a foreign stream or raw pointer; or an op-specific aspect the description adds. A fraction of the cases
are valid (checked against the reference on the GPU) and a fraction mutate two or three aspects at once.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import numpy as np
from hypothesis import strategies as st

from .model import DROP, A, Case, Mutation, Opaque, Rnn, Weights, layout_strides

__all__ = [
    "Draw",
    "RandomDraw",
    "HypothesisDraw",
    "FLOATS",
    "ALL_DTYPES",
    "draw_shape",
    "draw_layout",
    "mutate",
    "make_case",
    "generate",
    "case_strategy",
    "shapes",
    "dtypes",
    "layouts",
    "non_arrays",
    "bad_values",
    "bad_streams",
    "bad_pointers",
    "unknown_keywords",
]

FLOATS = ("float16", "bfloat16", "float32", "float64")
ALL_DTYPES = ("float32", "float64", "float16", "bfloat16", "int8", "uint8", "int32", "int64", "bool", "float8_e4m3fn")


# ----------------------------------------------------------------- the drawing interface


class Draw:
    """What strategy definitions draw from."""

    def int(self, lo: int, hi: int) -> int:
        raise NotImplementedError

    def choice(self, seq: Sequence[Any]) -> Any:
        raise NotImplementedError

    def float(self, lo: float, hi: float) -> float:
        raise NotImplementedError

    def bool(self, p: float = 0.5) -> bool:
        return self.int(0, 999) < int(p * 1000)

    def seed(self) -> int:
        return self.int(0, 2**31 - 1)

    def perm(self, n: int) -> tuple[int, ...]:
        items = list(range(n))
        out = []
        while items:
            out.append(items.pop(self.int(0, len(items) - 1)))
        return tuple(out)

    def weighted(self, options: Sequence[tuple[float, Any]]) -> Any:
        total = sum(w for w, _ in options)
        x = self.float(0.0, total)
        for w, v in options:
            if x < w:
                return v
            x -= w
        return options[-1][1]


class RandomDraw(Draw):
    """A seeded ``random.Random``: deterministic and fast (the GPU tier's generator)."""

    def __init__(self, seed: int):
        self.r = random.Random(seed)

    def int(self, lo: int, hi: int) -> int:
        return self.r.randint(lo, hi)

    def choice(self, seq: Sequence[Any]) -> Any:
        return seq[self.r.randrange(len(seq))]

    def float(self, lo: float, hi: float) -> float:
        return self.r.uniform(lo, hi)


class HypothesisDraw(Draw):
    """Draws through Hypothesis (``data.draw`` or an ``st.composite`` draw)."""

    def __init__(self, draw: Callable[[Any], Any]):
        self.draw = draw

    def int(self, lo: int, hi: int) -> int:
        return self.draw(st.integers(lo, hi))

    def choice(self, seq: Sequence[Any]) -> Any:
        return seq[self.draw(st.integers(0, len(seq) - 1))]

    def float(self, lo: float, hi: float) -> float:
        return self.draw(st.floats(lo, hi, allow_nan=False, allow_infinity=False))


def _hyp(fn: Callable[..., Any]) -> Callable[..., st.SearchStrategy]:
    """The Hypothesis strategy of a strategy definition ``fn(d, *args)``."""

    def make(*args: Any, **kwargs: Any) -> st.SearchStrategy:
        return st.composite(lambda draw: fn(HypothesisDraw(draw), *args, **kwargs))()

    make.__name__ = fn.__name__
    make.__doc__ = fn.__doc__
    return make


# ----------------------------------------------------------------- shapes, dtypes, layouts


def draw_dim(d: Draw, lo: int = 1, hi: int = 6, zero: float = 0.0) -> int:
    """A dim: mostly small, often 1, sometimes (with probability ``zero``) 0."""
    if zero and d.bool(zero):
        return 0
    if d.bool(0.2):
        return max(lo, 1)
    return d.int(max(lo, 1), hi)


def draw_shape(d: Draw, min_rank: int = 1, max_rank: int = 4, lo: int = 1, hi: int = 6, zero: float = 0.0):
    """A shape of ``min_rank`` to ``max_rank`` dims in ``lo..hi`` (0 with probability ``zero``)."""
    return tuple(draw_dim(d, lo, hi, zero) for _ in range(d.int(min_rank, max_rank)))


def draw_layout(d: Draw, shape: tuple[int, ...], *, neg: bool = False, allow: tuple[str, ...] | None = None) -> tuple:
    """A memory layout for ``shape`` other than C order (None-free: falls back to C order when none applies)."""
    nd = len(shape)
    options: list[tuple] = []
    if nd >= 2:
        p = d.perm(nd)
        if p != tuple(range(nd)):
            options.append(("perm", p))
    if nd >= 1:
        options.append(("gap", d.int(0, nd - 1), d.int(2, 3)))
        big = [i for i, s in enumerate(shape) if s > 1]
        if big:
            options.append(("expand", d.choice(big)))
            if neg:
                options.append(("neg", d.choice(big)))
        inner = [i for i in range(nd - 1) if shape[i] > 1 and math.prod(shape[i + 1 :]) > 1]
        if inner:
            options.append(("overlap", d.choice(inner)))
        options.append(("offset", d.int(1, 3)))
    if allow is not None:
        options = [o for o in options if o[0] in allow]
    if not options:
        return ("c",)
    return d.choice(options)


def draw_nonarray(d: Draw) -> tuple[Any, str]:
    """(value, kind) of something that is not a device array."""
    return d.choice(
        [
            (A((2, 3), "float32", lib="host"), "a NumPy host array"),
            (A((2, 3), "float32", lib="list"), "a nested list"),
            (A((2, 3), "float32", lib="torch_cpu"), "a torch CPU tensor"),
            (7, "an int"),
            (2.5, "a float"),
            ("x", "a str"),
            (None, "None"),
            (Opaque("object"), "a plain object()"),
            (Opaque("cpu_dlpack"), "a host DLPack object"),
            ((1, 2, 3), "a tuple"),
        ]
    )


#: values of the wrong type, not finite, huge or odd, for a parameter of each kind: (value, description, verdict)
#: where verdict is "refuse", "any" or a callable (domain, case) -> "refuse" | "any"
def _bad_float(d: Draw, p: Any, case: Case) -> tuple[Any, str, str]:
    scaling64 = p.scaling and case.setup.get("dtype") == "float64"
    options = [
        ("1.0", "a str", "refuse"),
        (None, "None", "any" if p.nullable else "refuse"),
        (float("nan"), "NaN", "refuse" if p.finite else "any"),
        (float("inf"), "inf", "refuse" if p.finite else "any"),
        (-float("inf"), "-inf", "refuse" if p.finite else "any"),
        (complex(1, 1), "a complex", "refuse"),
        ([1.0], "a list", "refuse"),
        (np.float32(0.5) if p.lo is None or p.lo <= 0.5 else np.float64(p.lo), "a NumPy scalar", "any"),
        (np.float64("nan"), "a NumPy NaN", "refuse" if p.finite else "any"),
        (True, "a bool", "any"),
    ]
    huge = 1e300 if d.bool() else -1e300
    in_range = (p.lo is None or huge >= p.lo) and (p.hi is None or huge <= p.hi)
    if p.scaling:
        options.append((huge, f"{huge:g}", "any" if scaling64 else "refuse"))
    else:
        options.append((huge, f"{huge:g}", "any" if in_range and not p.f32 else "refuse"))
    if p.lo is not None:
        v = p.lo - max(abs(p.lo) * 0.5, 0.25) if not p.lo_open else p.lo
        options.append((v, f"{v} (below {p.lo})", "refuse"))
    if p.hi is not None:
        v = p.hi if p.hi_open else p.hi + max(abs(p.hi) * 0.5, 0.25)
        options.append((v, f"{v} (above {p.hi})", "refuse"))
    return d.choice(options)


def _bad_int(d: Draw, p: Any, case: Case) -> tuple[Any, str, str]:
    lo, hi = p.lo, p.hi
    options = [
        ("3", "a str", "refuse"),
        (2.5, "a float", "refuse"),
        (float(lo if lo is not None else 1), "an integral float", "refuse" if p.strict else "any"),
        (None, "None", "any" if p.nullable else "refuse"),
        (True, "a bool", "refuse" if p.strict else "any"),
        (np.int64(lo if lo is not None else 1), "a NumPy int", "any"),
        (float("nan"), "NaN", "refuse"),
        (2**63, "2**63", "refuse" if hi is None or hi < 2**63 else "any"),
        (-(2**63) - 1, "-2**63-1", "refuse"),
    ]
    if lo is not None:
        options.append((lo - 1, f"{lo - 1} (below {lo})", "refuse"))
    if hi is not None:
        options.append((hi + 1, f"{hi + 1} (above {hi})", "refuse"))
    if hi is None or hi >= 2**31:
        options.append((2**31, "2**31", "refuse" if p.int32 else "any"))
    return d.choice(options)


def _bad_choice(d: Draw, p: Any, case: Case) -> tuple[Any, str, str]:
    cur = case.kwargs.get(p.name)
    options = [
        ("bogus", "an unknown name", "refuse"),
        (None, "None", "any" if p.nullable else "refuse"),
        (3, "an int", "refuse"),
        (b"x", "bytes", "refuse"),
        (["x"], "a list", "refuse"),
    ]
    if isinstance(cur, str) and cur.upper() != cur:
        options.append((cur.upper(), "upper case", "any"))
    others = [c for c in p.choices if c != cur]
    if others:
        options.append((d.choice(others), "another valid choice", "any"))
    return d.choice(options)


def _bad_bool(d: Draw, p: Any, case: Case) -> tuple[Any, str, str]:
    return d.choice(
        [
            ("yes", "a str", p.strict_verdict),
            (2, "an int", p.strict_verdict),
            (None, "None", "any" if p.nullable else p.strict_verdict),
            (np.bool_(True), "a NumPy bool", "any"),
        ]
    )


class _AnObject:
    """A plain object with a stable repr (a case's repro text must be the same in every run)."""

    def __repr__(self) -> str:
        return "<an object>"


_AN_OBJECT = _AnObject()


def _bad_ints(d: Draw, p: Any, case: Case) -> tuple[Any, str, str]:
    """A tuple-of-ints parameter (a size, paddings, dims)."""
    cur = case.kwargs.get(p.name)
    n = len(cur) if isinstance(cur, (tuple, list)) else (p.length or 2)
    options = [
        ("abc", "a str", "refuse"),
        (None, "None", "any" if p.nullable else "refuse"),
        (tuple([1] * (n + 1)), f"{n + 1} values", "refuse" if p.fixed_length else "any"),
        (tuple([2.5] * n), "floats", "refuse"),
        (tuple(["a"] * n), "strs", "refuse"),
        (tuple([-1] * n), "negative values", "refuse" if (p.lo or 0) >= 0 else "any"),
        (tuple([2**40] * n), "huge values", "refuse"),
        ((True,) * n, "bools", "refuse"),
        (_AN_OBJECT, "an object", "refuse"),
    ]
    if n > 1:
        options.append((tuple([1] * (n - 1)), f"{n - 1} values", "refuse" if p.fixed_length else "any"))
    return d.choice(options)


def _bad_dtype_name(d: Draw, p: Any, case: Case) -> tuple[Any, str, str]:
    return d.choice(
        [
            ("float33", "an unknown dtype name", "refuse"),
            (3, "an int", "refuse"),
            (None, "None", "any" if p.nullable else "refuse"),
            (np.float32, "a NumPy scalar type", "any"),
            ("FLOAT", "upper case", "any"),
            (["float32"], "a list", "refuse"),
        ]
    )


_BAD = {
    "float": _bad_float,
    "int": _bad_int,
    "choice": _bad_choice,
    "bool": _bad_bool,
    "ints": _bad_ints,
    "dtype": _bad_dtype_name,
}


def draw_bad_value(d: Draw, p: Any, case: Case) -> tuple:
    """(value, description, verdict[, other names a refusal may use]) of a bad value for parameter ``p`` (a
    ``specs.Param``)."""
    if p.bad is not None:
        return d.choice(p.bad(case))
    return _BAD[p.kind](d, p, case)


#: garbage, out-of-range and wrong-type streams: (value, description, verdict)
def draw_bad_stream(d: Draw, gpu: bool) -> tuple[Any, str, str]:
    options = [
        (0xBAD000, "0xBAD000", "refuse"),
        (12345, "12345", "refuse"),
        (2**63, "2**63", "refuse"),
        (2**64, "2**64", "refuse"),
        (-1, "-1", "refuse"),
        (1, "1 (cudaStreamLegacy)", "any"),
        (2, "2 (cudaStreamPerThread)", "any"),
        (0, "0 (the default stream)", "any"),
        ("0", "a str", "refuse"),
        (1.5, "a float", "refuse"),
        (True, "a bool", "refuse"),
        (Opaque("object"), "a plain object()", "refuse"),
        (Opaque("stream_other"), "a stream of the other library", "any"),
        (Opaque("stream_new"), "a new stream of the library", "any"),
    ]
    if not gpu:
        # a readable host address that is no stream: the driver may misread it (unguarded), so the CPU only
        options.append((Opaque("host_ptr"), "a host address", "refuse"))
    return d.choice(options)


def draw_bad_pointer(d: Draw, target: Any, nbytes: int, misalign_refused: bool = True) -> tuple[Any, str, str]:
    """A raw pointer where the device pointer of array ``target`` (an :class:`A`, ``nbytes`` long) belongs."""
    return d.choice(
        [
            (0xBAD000, "garbage 0xBAD000", "refuse"),
            (Opaque("host_ptr"), "a host pointer", "refuse"),
            (Opaque("small_ptr", max(nbytes // 2, 1)), f"a device buffer of {max(nbytes // 2, 1)} bytes", "refuse"),
            (0, "NULL", "refuse"),
            (-256, "a negative int", "refuse"),
            (2**64, "2**64", "refuse"),
            (Opaque("ptr_of", target), "its own raw pointer", "any"),
            (Opaque("ptr_of", target, 2), "its own pointer + 2 bytes", "refuse" if misalign_refused else "any"),
        ]
    )


_KEYWORDS = ("axes", "outt", "inplace", "alpha_", "streams", "device_id", "dtype_", "eps")


def draw_unknown_keyword(d: Draw, known: Sequence[str]) -> str:
    return d.choice([k for k in _KEYWORDS if k not in known])


# ----------------------------------------------------------------- mutations of one aspect


def _present_arrays(spec: Any, case: Case) -> list[str]:
    return [n for n in spec.roles if isinstance(case.kwargs.get(n), A)]


def _untouched(case: Case, names: Sequence[str]) -> list[str]:
    used = {m.target for m in case.mutations}
    return [n for n in names if n not in used]


def _verdict(v: str | Callable[[Case], str], case: Case) -> str:
    return v(case) if callable(v) else v


def _late(spec: Any, name: str, expect: str) -> str:
    """A role whose checks come after the op's first device query can only be refused on the GPU tier."""
    role = spec.roles.get(name)
    if role is not None and role.late and expect == "refuse":
        return "refuse_gpu"
    return expect


def _mut_dtype(d: Draw, spec: Any, case: Case, name: str, gpu: bool) -> tuple[Case, Mutation] | None:
    role, a = spec.roles[name], case.kwargs[name]
    host = a.lib in ("host", "list", "torch_cpu")  # a host array holds float8 as uint8, bfloat16 as float32
    pool = [t for t in ALL_DTYPES if t != a.dtype and not ((gpu or host) and t.startswith("float8"))]
    if host:
        pool = [t for t in pool if t != "bfloat16"]
    new = d.choice(pool)
    if new not in role.dtypes:
        expect = "refuse"
    else:
        peers = [n for n in _present_arrays(spec, case) if n != name and spec.roles[n].group == role.group]
        expect = "refuse" if (role.group and peers) or role.kind in ("out", "inout") and peers else "any"
        if role.fixed_dtype:
            expect = "refuse"
    expect = _late(spec, name, expect)
    if spec.dtype_rule is not None:
        expect = spec.dtype_rule(case, name, new) or expect
    kw = dict(case.kwargs)
    kw[name] = a.with_(dtype=new)
    return replace(case, kwargs=kw), Mutation("dtype", name, f"{name} dtype {a.dtype} -> {new}", expect)


def _mut_shape(d: Draw, spec: Any, case: Case, name: str, gpu: bool) -> tuple[Case, Mutation] | None:
    role, a = spec.roles[name], case.kwargs[name]
    shape = list(a.shape)
    # a fake array of 2**31 elements (the CPU tier only; never an index read back to the host, nor a role whose op
    # allocates host memory per element before it can refuse)
    huge = not gpu and role.kind != "index" and role.huge
    how = d.choice(["dim", "dim", "rank", "negative", "huge"] if huge else ["dim", "dim", "rank", "negative"])
    kw = dict(case.kwargs)
    if how == "negative":
        if not shape:
            return None
        i = d.int(0, len(shape) - 1)
        lie = list(shape)
        lie[i] = -d.int(1, 3)
        kw[name] = a.with_(lib="cai", cai=(("shape", tuple(lie)),))
        expect = "any" if role.host_ok else "refuse"
        return replace(case, kwargs=kw), Mutation("shape", name, f"{name} CAI shape {tuple(lie)}", expect)
    if how == "huge":
        if not shape:
            return None
        i = d.int(0, len(shape) - 1)
        shape[i] = d.choice([2**31, 2**31 + 1, 2**32 + 3, 2**62])
    elif how == "rank" or not shape:
        if shape and d.bool():
            del shape[d.int(0, len(shape) - 1)]
        else:
            shape.insert(d.int(0, len(shape)), d.choice([1, 2, 3]))
    else:
        i = d.int(0, len(shape) - 1)
        old = shape[i]
        shape[i] = d.choice([v for v in (old + 1, old - 1, 0, 1, 2 * old + 1) if v >= 0 and v != old] or [old + 1])
    shape = tuple(shape)
    if shape == a.shape:
        return None
    nd = len(shape)
    if role.ranks is not None and not role.ranks[0] <= nd <= role.ranks[1]:
        expect = "refuse"
    elif role.shaped is True:
        expect = "refuse"
    elif role.shaped == "broadcast":
        expect = "any" if nd == len(a.shape) and all(n in (o, 1) for n, o in zip(shape, a.shape)) else "refuse"
    else:
        expect = "any"
    if spec.shape_rule is not None:
        expect = spec.shape_rule(case, name, a.shape, shape) or expect
    if how == "huge" and expect == "any" and not role.host_ok:
        expect = "any"
    expect = _late(spec, name, expect)
    fill = a.fill if not a.fill.startswith("derived") else "normal"
    values = None if a.values is None else None
    layout = a.layout if a.layout == ("c",) else ("c",)
    kw[name] = a.with_(shape=shape, fill=fill, values=values, layout=layout)
    return replace(case, kwargs=kw), Mutation("shape", name, f"{name} shape {a.shape} -> {shape}", expect)


def _mut_layout(d: Draw, spec: Any, case: Case, name: str, gpu: bool) -> tuple[Case, Mutation] | None:
    role, a = spec.roles[name], case.kwargs[name]
    neg = not gpu or case.lib == "cupy"
    lay = draw_layout(d, a.shape, neg=neg)
    if lay == ("c",) or lay == a.layout:
        return None
    kind = lay[0]
    if role.kind == "out":
        expect = "refuse" if kind in ("expand", "overlap", "neg") else "any"
    elif role.kind == "inout":
        expect = "refuse" if kind in ("overlap", "neg") or (kind == "expand" and not role.elementwise) else "any"
    else:
        expect = "any"
    if a.size == 0:
        expect = "any"  # an empty array has no layout to speak of
    if spec.layout_rule is not None:
        expect = spec.layout_rule(case, name, lay) or expect
    expect = _late(spec, name, expect)
    kw = dict(case.kwargs)
    kw[name] = a.with_(layout=lay)
    return replace(case, kwargs=kw), Mutation("layout", name, f"{name} layout {'/'.join(map(str, lay))}", expect)


def _mut_readonly(d: Draw, spec: Any, case: Case, name: str, gpu: bool) -> tuple[Case, Mutation] | None:
    role, a = spec.roles[name], case.kwargs[name]
    expect = "refuse" if role.kind in ("out", "inout") else "any"
    kw = dict(case.kwargs)
    kw[name] = a.with_(readonly=True)
    return replace(case, kwargs=kw), Mutation("readonly", name, f"{name} read-only (CAI)", _late(spec, name, expect))


def _mut_lib(d: Draw, spec: Any, case: Case, name: str, gpu: bool) -> tuple[Case, Mutation] | None:
    role, a = spec.roles[name], case.kwargs[name]
    kw = dict(case.kwargs)
    if d.bool(0.4):
        lib = d.choice(["other", "cai"])
        kw[name] = a.with_(lib=lib)
        expect = "any"
        if spec.lib_rule is not None:
            expect = spec.lib_rule(case, name, lib) or expect
        return replace(case, kwargs=kw), Mutation("lib", name, f"{name} from library {lib}", expect)
    value, what = draw_nonarray(d)
    if isinstance(value, A):
        value = value.with_(shape=a.shape, dtype=a.dtype, fill=a.fill, values=a.values)
    if value is None:
        expect = "refuse" if role.required else "any"
    elif role.host_ok and (isinstance(value, A) or isinstance(value, tuple)):
        expect = "any"
    else:
        expect = "refuse"
    if spec.nonarray_rule is not None:
        expect = spec.nonarray_rule(case, name, value) or expect
    kw[name] = value
    return replace(case, kwargs=kw), Mutation("nonarray", name, f"{name} is {what}", expect)


def _mut_cai(d: Draw, spec: Any, case: Case, name: str, gpu: bool) -> tuple[Case, Mutation] | None:
    role, a = spec.roles[name], case.kwargs[name]
    nd = len(a.shape)
    options = [
        (("data", (0, False)), "a NULL data pointer", "refuse" if a.size else "any"),
        (("shape", DROP), "no 'shape'", "refuse"),
        (("typestr", DROP), "no 'typestr'", "refuse"),
        (("data", DROP), "no 'data'", "refuse"),
        (("version", DROP), "no 'version'", "refuse"),
        (("typestr", "<c8"), "typestr '<c8'", "refuse"),
        (("typestr", 5), "typestr 5", "refuse"),
        (("data", None), "data None", "refuse"),
        (("version", "3"), "version '3'", "refuse"),
        (("shape", "abc"), "shape 'abc'", "refuse"),
        (("mask", (1,)), "a mask", "refuse"),
        (("stream", 0xBAD000), "a garbage producer stream", "any"),
    ]
    if nd:
        options.append((("strides", (3,) * nd), "byte strides not a multiple of the item size", "refuse"))
    if role.host_ok:
        options = [(o, w, "any") for o, w, _ in options]
    over, what, expect = d.choice(options)
    kw = dict(case.kwargs)
    kw[name] = a.with_(lib="cai", cai=(over,))
    return replace(case, kwargs=kw), Mutation("cai", name, f"{name} CAI: {what}", expect)


def _mut_device(d: Draw, spec: Any, case: Case, name: str, gpu: bool) -> tuple[Case, Mutation] | None:
    a = case.kwargs[name]
    if gpu or a.lib in ("host", "list", "torch_cpu"):
        return None
    # mixed devices are refused; host arrays (CTC's labels as a list or NumPy array) are on no device
    peers = [
        n
        for n in _present_arrays(spec, case)
        if n != name and not (isinstance(case.kwargs[n], A) and case.kwargs[n].lib in ("host", "list", "torch_cpu"))
    ]
    expect = "refuse" if peers else "any"
    kw = dict(case.kwargs)
    kw[name] = a.with_(device=1)
    return replace(case, kwargs=kw), Mutation("device", name, f"{name} on cuda:1", expect)


def _mut_missing(d: Draw, spec: Any, case: Case, name: str, gpu: bool) -> tuple[Case, Mutation] | None:
    kw = dict(case.kwargs)
    del kw[name]
    role = spec.roles.get(name)
    expect = "refuse" if role is None or role.required else "any"  # an optional one left out is its default
    return replace(case, kwargs=kw), Mutation("missing", name, f"{name} not passed", expect)


_ARRAY_MUTATIONS = [
    (4, _mut_dtype),
    (4, _mut_shape),
    (5, _mut_layout),
    (1, _mut_readonly),
    (4, _mut_lib),
    (3, _mut_cai),
    (1, _mut_device),
]


def _array_mutation(d: Draw, spec: Any, case: Case, gpu: bool) -> tuple[Case, Mutation] | None:
    names = _untouched(case, _present_arrays(spec, case))
    if not names:
        return None
    name = d.choice(names)
    role = spec.roles[name]
    options = [(w, f) for w, f in _ARRAY_MUTATIONS if not (f is _mut_readonly and role.kind == "in" and d.bool(0.7))]
    fn = d.weighted(options)
    got = fn(d, spec, case, name, gpu)
    if got is not None and role.late and got[1].expect == "refuse":
        got = (got[0], replace(got[1], expect="refuse_gpu"))
    return got


def _param_mutation(d: Draw, spec: Any, case: Case, gpu: bool) -> tuple[Case, Mutation] | None:
    names = _untouched(case, [n for n, p in spec.params.items() if n in case.kwargs or p.optional_kw])
    if not names:
        return None
    name = d.choice(names)
    p = spec.params[name]
    value, what, verdict, *more = draw_bad_value(d, p, case)
    expect = _verdict(verdict, case)
    if spec.param_rule is not None:
        expect = spec.param_rule(case, name, value) or expect
    if p.late and expect == "refuse":
        expect = "refuse_gpu"
    kw = dict(case.kwargs)
    kw[name] = value
    names = (name, *p.names, *(more[0] if more else ()))
    return replace(case, kwargs=kw), Mutation("value", name, f"{name}={what} ({value!r})"[:160], expect, names)


def _keyword_mutation(d: Draw, spec: Any, case: Case, gpu: bool) -> tuple[Case, Mutation] | None:
    if not spec.keywords:
        return None
    kw = dict(case.kwargs)
    key = draw_unknown_keyword(d, list(kw) + list(spec.params) + list(spec.roles))
    kw[key] = 1.0
    return replace(case, kwargs=kw), Mutation("keyword", key, f"unknown keyword {key}=1.0", "refuse")


def _stream_mutation(d: Draw, spec: Any, case: Case, gpu: bool) -> tuple[Case, Mutation] | None:
    if not spec.streams or _untouched(case, ["stream"]) == []:
        return None
    value, what, expect = draw_bad_stream(d, gpu)
    kw = dict(case.kwargs)
    kw["stream"] = value
    return replace(case, kwargs=kw), Mutation("stream", "stream", f"stream={what}", expect)


def _missing_mutation(d: Draw, spec: Any, case: Case, gpu: bool) -> tuple[Case, Mutation] | None:
    names = _untouched(case, [n for n in case.positional if n in case.kwargs])
    if not names:
        return None
    return _mut_missing(d, spec, case, d.choice(names), gpu)


_MUTATIONS = [
    (10, _array_mutation),
    (6, _param_mutation),
    (1, _keyword_mutation),
    (2, _stream_mutation),
    (0.5, _missing_mutation),
]


def mutate(d: Draw, spec: Any, case: Case, gpu: bool) -> Case | None:
    """``case`` with one aspect changed (None when the drawn mutation does not apply)."""
    options = list(_MUTATIONS)
    if spec.mutations is not None:
        options.append((spec.mutation_weight, lambda d, s, c, g: spec.mutations(d, c, g)))
    fn = d.weighted(options)
    try:
        got = fn(d, spec, case, gpu)
    except (TypeError, ValueError, KeyError, IndexError, AttributeError):
        # a mutation that reads an argument an earlier mutation of this case already broke: draw another
        return None
    if got is None:
        return None
    new, m = got
    return replace(new, mutations=new.mutations + (m,))


def make_case(d: Draw, spec: Any, lib: str, gpu: bool, other: str | None = None, *, valid: float = 0.25) -> Case:
    """A case of ``spec``: valid with probability ``valid``, else one mutation (10%: two or three)."""
    base = spec.draw(d, lib)
    case = Case(spec.name, base.kwargs, base.positional, lib, other, (), base.setup, seed=d.seed())
    if d.bool(valid):
        return case
    n = 1 if d.bool(0.9) else d.int(2, 3)
    for _ in range(20):
        if n == 0:
            break
        got = mutate(d, spec, case, gpu)
        if got is None or got.mutations[-1].target in {m.target for m in case.mutations}:
            continue
        kind = got.mutations[-1].kind
        if kind in ("dtype", "shape") and any(m.kind == kind for m in case.mutations):
            continue  # two dtype (or shape) changes may agree again, making a valid call
        kinds = {kind, *(m.kind for m in case.mutations)}
        if (
            kind == "device"
            and "device" in {m.kind for m in case.mutations}
            or ("value" in kinds and kinds & {"dtype", "shape"})
            or (kinds & {"dtype", "shape"} and any(_removes_array(got, m) for m in got.mutations))
            or any(_changes_values(got, m) for m in got.mutations)
        ):
            # changes that may agree again: two arrays moved to one device; a value whose verdict is the arrays'
            # (1e300 is out of range for bfloat16, not for float64; three pad_after values fit a 3-d x, not a 2-d
            # one); an expanded or overlapping layout of an array of given values, which changes the values
            # (label lengths [4, 3] expanded read [4, 4], which one label too many may fit); an array left out
            # (None) and another's dtype or shape, which disagreed with the one left out only (a float32 x against
            # a bfloat16 out, seed 1170). Kept, as calls that may pass: a crash or an unclear error still counts
            got = replace(got, mutations=tuple(replace(m, expect="any") for m in got.mutations))
        if any(frozenset((m.target, got.mutations[-1].target)) in spec.coupled for m in case.mutations):
            continue  # a value and an array that must agree (a size and the gradient of its shape)
        case = got
        n -= 1
    return case


def _removes_array(case: Case, m: Mutation) -> bool:
    """Whether mutation ``m`` leaves an array out (None where the case passed one)."""
    return m.kind == "nonarray" and case.kwargs.get(m.target, 0) is None


def _changes_values(case: Case, m: Mutation) -> bool:
    """Whether layout mutation ``m`` changes the logical values of an array of given values (lengths, labels,
    indices): an expanded layout repeats one element, an overlapping one shares memory between elements."""
    a = case.kwargs.get(m.target)
    return m.kind == "layout" and isinstance(a, A) and a.values is not None and a.layout[0] in ("expand", "overlap")


def generate(count: int, seed: int, libs: Sequence[str], gpu: bool, ops: Sequence[str] | None = None) -> list[Case]:
    """``count`` cases, deterministic for ``seed``: ops in turn (weighted by their description), libraries
    alternating."""
    from .specs import SPECS

    names = sorted(ops or SPECS)
    weights = [SPECS[n].weight for n in names]
    r = random.Random(seed)
    out = []
    for i in range(count):
        name = r.choices(names, weights)[0]
        lib = libs[i % len(libs)]
        other = next((x for x in libs if x != lib), None)
        case_seed = r.getrandbits(63)
        case = make_case(RandomDraw(case_seed), SPECS[name], lib, gpu, other)
        case.index, case.seed = i, case_seed
        out.append(case)
    return out


def regenerate(op: str, case_seed: int, lib: str, gpu: bool, other: str | None = None) -> Case:
    """The case ``generate`` made from ``case_seed`` (for a repro)."""
    from .specs import SPECS

    case = make_case(RandomDraw(case_seed), SPECS[op], lib, gpu, other)
    case.seed = case_seed
    return case


# ----------------------------------------------------------------- the Hypothesis forms


def case_strategy(op: str, lib: str = "fake", gpu: bool = False, other: str | None = "fakeB") -> st.SearchStrategy:
    """Cases of op ``op`` (valid or mutated) as a Hypothesis strategy."""
    from .specs import SPECS

    return st.composite(lambda draw: make_case(HypothesisDraw(draw), SPECS[op], lib, gpu, other))()


shapes = _hyp(draw_shape)
layouts = _hyp(draw_layout)


def dtypes() -> st.SearchStrategy:
    """Every dtype cudnnkit names, valid or not for a given op, plus NumPy scalar types, odd strings and None."""
    return st.one_of(
        st.sampled_from(ALL_DTYPES),
        st.sampled_from([np.float32, np.float16, np.int32, "float33", "FLOAT", "", None, 3]),
    )


non_arrays = _hyp(lambda d: draw_nonarray(d)[0])
bad_streams = _hyp(lambda d, gpu=False: draw_bad_stream(d, gpu)[0])
_A16 = A((16,), "float32")
bad_pointers = _hyp(lambda d, target=_A16, nbytes=64: draw_bad_pointer(d, target, nbytes)[0])
unknown_keywords = _hyp(lambda d, known=(): draw_unknown_keyword(d, known))


def bad_values(param: Any) -> st.SearchStrategy:
    """Bad values for a ``specs.Param``, as Hypothesis draws them."""
    empty = Case("?", {}, ())
    return st.composite(lambda draw: draw_bad_value(HypothesisDraw(draw), param, empty)[0])()


# re-exported so specs can build described values without importing model
__all__ += ["A", "Opaque", "Rnn", "Weights", "layout_strides"]
