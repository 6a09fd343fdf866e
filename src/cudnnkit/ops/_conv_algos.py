"""Convolution descriptors and the legacy algorithm choice (:mod:`cudnnkit.ops.convolution`'s legacy calls).

``conv_descriptor`` makes the cached ``cudnnConvolutionDescriptor_t`` of a resolved call; ``_candidates`` lists a
call's algorithms best first -- cuDNN's heuristic order (``cudnnGetConvolution*Algorithm_v7``) or, under
``settings(autotune="exhaustive")``, its timed order (``cudnnFindConvolution*AlgorithmEx`` on scratch outputs, the
workspace capped) -- without those the settings exclude (non-deterministic ones, workspaces over
``workspace_limit``, math types ``allow_tf32`` forbids), each with the workspace the call itself asks for; and
``_run_algos`` runs the first whose workspace can be allocated, falling back to smaller ones (logged).
"""

from __future__ import annotations

import ctypes
import logging
from typing import Any, NamedTuple

from .. import lib
from ..runtime import DescriptorKind, cudnn_dtype, current_settings, get_cached
from ..runtime.cache import LRU, MISSING
from ._primitive import Call

__all__ = ["conv_descriptor", "algorithm_cache_info", "CONV", "FILTER", "FIND_WORKSPACE", "MODES"]

_log = logging.getLogger("cudnnkit")

MODES = {"cross_correlation": lib.CUDNN_CROSS_CORRELATION, "convolution": lib.CUDNN_CONVOLUTION}
#: the workspace ``autotune="exhaustive"`` gives cuDNN's Find calls without a ``workspace_limit``
FIND_WORKSPACE = 256 << 20


# ----------------------------------------------------------------- descriptors


def _set_conv(ptr: int, pad: tuple, stride: tuple, dilation: tuple, mode: str, compute: str, groups: int,
              math: int) -> None:  # fmt: skip
    from ..runtime.descriptors import int_array

    n = len(pad)
    lib.cudnnSetConvolutionNdDescriptor(
        ptr, n, int_array(pad), int_array(stride), int_array(dilation), MODES[mode], cudnn_dtype(compute)
    )
    lib.cudnnSetConvolutionGroupCount(ptr, groups)
    lib.cudnnSetConvolutionMathType(ptr, math)


def _set_filter(ptr: int, dtype: str, fmt: int, shape: tuple) -> None:
    from ..runtime.descriptors import int_array

    lib.cudnnSetFilterNdDescriptor(ptr, cudnn_dtype(dtype), fmt, len(shape), int_array(shape))


CONV = DescriptorKind("convolution", "cudnnCreateConvolutionDescriptor", "cudnnDestroyConvolutionDescriptor",
                      _set_conv)  # fmt: skip
FILTER = DescriptorKind("filter", "cudnnCreateFilterDescriptor", "cudnnDestroyFilterDescriptor", _set_filter)


def conv_descriptor(r: Any) -> Any:
    """The cached ``cudnnConvolutionDescriptor_t`` of a resolved call (``cudnnSetConvolutionNdDescriptor``,
    ``cudnnSetConvolutionGroupCount``, ``cudnnSetConvolutionMathType``). Host-side only."""
    return get_cached(CONV, (r.pad, r.stride, r.dilation, r.mode, r.compute, r.groups, r.math))


# ----------------------------------------------------------------- algorithms


class _Family(NamedTuple):
    name: str
    get: str  #: cudnnGet...Algorithm_v7
    find: str  #: cudnnFind...AlgorithmEx
    count: str  #: cudnnGet...AlgorithmMaxCount
    perf: type
    ws: str  #: cudnnGet...WorkspaceSize


_FWD = _Family("forward", "cudnnGetConvolutionForwardAlgorithm_v7", "cudnnFindConvolutionForwardAlgorithmEx",
               "cudnnGetConvolutionForwardAlgorithmMaxCount", lib.cudnnConvolutionFwdAlgoPerf_t,
               "cudnnGetConvolutionForwardWorkspaceSize")  # fmt: skip
_BWD_DATA = _Family("backward data", "cudnnGetConvolutionBackwardDataAlgorithm_v7",
                    "cudnnFindConvolutionBackwardDataAlgorithmEx", "cudnnGetConvolutionBackwardDataAlgorithmMaxCount",
                    lib.cudnnConvolutionBwdDataAlgoPerf_t, "cudnnGetConvolutionBackwardDataWorkspaceSize")  # fmt: skip
_BWD_FILTER = _Family("backward filter", "cudnnGetConvolutionBackwardFilterAlgorithm_v7",
                      "cudnnFindConvolutionBackwardFilterAlgorithmEx",
                      "cudnnGetConvolutionBackwardFilterAlgorithmMaxCount",
                      lib.cudnnConvolutionBwdFilterAlgoPerf_t,
                      "cudnnGetConvolutionBackwardFilterWorkspaceSize")  # fmt: skip

#: (family, descriptors' keys, settings) -> [(algo, workspace bytes, math type)], best first
_algos: LRU[tuple, list[tuple[int, int, int]]] = LRU("ops.convolution_algos", 1024)


def _allowed_math(r: Any) -> frozenset[int]:
    """The math types a candidate may have: cuDNN lists an algorithm once per math type it can run in, and the
    one a call runs is set on its descriptor. float32 takes tensor cores (TF32) only where ``allow_tf32`` lets
    it, and never ``..._ALLOW_CONVERSION`` (a down-conversion to half precision); the half types and float64
    take any but that."""
    fma = lib.CUDNN_FMA_MATH
    if r.dtype == "float32" and r.math == fma:
        return frozenset({fma})
    return frozenset({lib.CUDNN_DEFAULT_MATH, lib.CUDNN_TENSOR_OP_MATH, fma})


def algorithm_cache_info() -> dict[str, int]:
    """Size, bound, hits and misses of the convolution algorithm cache."""
    return _algos.info()


def _candidates(f: _Family, c: Call, descs: tuple, find_args: Any) -> list[tuple[int, int, int]]:
    """The algorithms of one call, best first, as ``(algo, workspace bytes, math type)``: cuDNN's heuristic order or, with
    ``autotune="exhaustive"``, its timed order; without the non-deterministic ones under ``deterministic=True``
    and those over ``workspace_limit``. ``find_args`` builds the Find call's data pointers (scratch outputs)."""
    st = current_settings()
    key = (f.name, tuple(d.key for d in descs), st.deterministic, st.workspace_limit, st.autotune, c.launch.device)
    got = _algos.lookup(key)
    if got is not MISSING:
        return got
    h = c.launch.handle
    cap = ctypes.c_int()
    getattr(lib, f.count)(h, ctypes.byref(cap))
    n = max(cap.value, 1)
    perf = (f.perf * n)()
    returned = ctypes.c_int()
    if st.autotune == "exhaustive":
        limit = FIND_WORKSPACE if st.workspace_limit is None else min(st.workspace_limit, FIND_WORKSPACE)
        ws, ws_ptr, limit = _find_workspace(c, limit)
        args = find_args(ws_ptr, limit)
        getattr(lib, f.find)(h, *args[:-2], n, ctypes.byref(returned), perf, *args[-2:])
        del ws
    else:
        getattr(lib, f.get)(h, *descs, n, ctypes.byref(returned), perf)
    out = []
    allowed = _allowed_math(c.resolved)
    for p in perf[: returned.value]:
        if p.status != lib.CUDNN_STATUS_SUCCESS or p.mathType not in allowed:
            continue
        if st.deterministic and p.determinism != lib.CUDNN_DETERMINISTIC:
            continue
        if st.workspace_limit is not None and p.memory > st.workspace_limit:
            continue
        # the workspace the call itself asks for with this candidate's math type: the heuristics' figure can be
        # smaller (measured: backward data, cuDNN 9.19, "workSpaceSizeInBytes < requiredWorkspace")
        need = ctypes.c_size_t()
        cd = conv_descriptor(c.resolved._replace(math=int(p.mathType)))
        try:
            getattr(lib, f.ws)(h, descs[0], descs[1], cd, descs[3], p.algo, ctypes.byref(need))
        except lib.errors.CudnnError:
            continue
        memory = max(int(p.memory), need.value)
        if st.workspace_limit is not None and memory > st.workspace_limit:
            continue
        out.append((int(p.algo), memory, int(p.mathType)))
    if not out:
        why = []
        if st.deterministic:
            why.append("deterministic=True")
        if st.workspace_limit is not None:
            why.append(f"workspace_limit={st.workspace_limit}")
        err = lib.errors.NotSupportedError(
            lib.CUDNN_STATUS_NOT_SUPPORTED,
            f.get,
            f"cuDNN has no convolution {f.name} algorithm for these arrays"
            + (f" under {', '.join(why)}" if why else "")
            + f" ({returned.value} candidates returned)",
        )
        err._no_algorithm = True  # type: ignore[attr-defined]
        raise err
    return _algos.put(key, out, count_miss=True)


def _find_workspace(c: Call, limit: int) -> tuple[Any, int, int]:
    """A workspace for the Find calls: ``limit`` bytes, halved until it can be allocated (down to none)."""
    while limit > 0:
        try:
            ws, ptr = c.launch.workspace(limit)
            return ws, ptr, limit
        except MemoryError:
            limit //= 2
    return None, 0, 0


def _run_algos(f: _Family, c: Call, algos: list[tuple[int, int, int]], launch_one: Any) -> None:
    """Run the first algorithm whose workspace can be allocated; the ones after it need no more (cuDNN lists
    faster first), so on out-of-memory the next one with a smaller workspace is tried, and logged."""
    last_error = None
    smallest = None
    for algo, ws_bytes, math in algos:
        if smallest is not None and ws_bytes >= smallest:
            continue
        try:
            ws, ws_ptr = c.launch.workspace(ws_bytes)
        except MemoryError as e:
            _log.info("convolution %s: algorithm %d's workspace (%d bytes) could not be allocated (%s); trying one "
                      "with a smaller workspace", f.name, algo, ws_bytes, e)  # fmt: skip
            smallest, last_error = ws_bytes, e
            continue
        launch_one(algo, ws_ptr, ws_bytes, math)
        del ws
        return
    raise MemoryError(f"convolution {f.name}: no algorithm's workspace could be allocated ({last_error})")
