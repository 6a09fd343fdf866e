"""``ctc_loss`` with torch.nn.functional's name and semantics (blank 0; cuDNN's CTC is float32 only)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..ops.ctc import MAX_LABEL_LENGTH
from ._common import as_int, call1, check_dtype, library

__all__ = ["ctc_loss", "ctc_reduce", "pack_targets"]


def host_ints(v: Any, name: str) -> list[int]:
    """Integers on the host (a device tensor or array is read back: a synchronization)."""
    if hasattr(v, "tolist"):
        v = v.tolist()
    if isinstance(v, int):
        return [v]
    return [as_int(x, name) for x in v]


def pack_targets(targets: Any, lengths: list[int]) -> np.ndarray:
    """cuDNN's packed labels (int32, ``sum(lengths)`` values) from torch's targets: padded ``(N, S)`` (the first
    ``lengths[n]`` of row ``n``) or 1-d concatenated."""
    if hasattr(targets, "detach"):  # a torch tensor
        t = targets.detach().cpu().numpy()
    elif hasattr(targets, "get") and hasattr(targets, "__cuda_array_interface__"):  # a CuPy array
        t = targets.get()
    else:
        t = np.asarray(targets)
    if t.dtype.kind not in "iu":
        raise TypeError(f"ctc_loss: targets must hold integers, got dtype {t.dtype}")
    if t.ndim == 2:
        if t.shape[0] != len(lengths) or any(n > t.shape[1] for n in lengths):
            raise ValueError(f"ctc_loss: padded targets {t.shape} do not hold target_lengths {lengths}")
        out = np.concatenate([t[i, :n] for i, n in enumerate(lengths)]) if lengths else t.reshape(-1)[:0]
    elif t.ndim == 1:
        if t.shape[0] < sum(lengths):
            raise ValueError(f"ctc_loss: 1-d targets hold {t.shape[0]} labels, target_lengths sum to {sum(lengths)}")
        out = t[: sum(lengths)]
    else:
        raise ValueError(f"ctc_loss: targets must be (N, S) or 1-d, got shape {t.shape}")
    return np.ascontiguousarray(out, dtype=np.int32)


def ctc_reduce(costs: Any, target_lengths: list[int], reduction: str, zero_infinity: bool) -> Any:
    """torch's reduction of per-sample CTC costs: ``zero_infinity`` zeroes infinite costs (and their gradient);
    "none" keeps them, "sum" adds them, "mean" divides each by its target length (at least 1) and averages."""
    if reduction not in ("none", "mean", "sum"):
        raise ValueError(f"ctc_loss: reduction must be 'none', 'mean' or 'sum', got {reduction!r}")
    torch_ = library(costs) == "torch"
    if zero_infinity:
        if torch_:
            import torch

            costs = torch.where(costs == float("inf"), torch.zeros_like(costs), costs)
        else:
            costs = costs.copy()
            costs[costs == float("inf")] = 0
    if reduction == "none":
        return costs
    if reduction == "sum":
        return costs.sum()
    lengths = np.maximum(np.asarray(target_lengths, dtype=np.float64), 1.0)
    if torch_:
        import torch

        d = torch.as_tensor(lengths, dtype=costs.dtype, device=costs.device)
    else:
        import cupy

        with costs.device:
            d = cupy.asarray(lengths.astype(costs.dtype))
    return (costs / d).mean()


def ctc_loss(log_probs: Any, targets: Any, input_lengths: Any, target_lengths: Any, blank: int = 0,
             reduction: str = "mean", zero_infinity: bool = False) -> Any:  # fmt: skip
    """torch's ``ctc_loss`` (blank 0, float32): L3 ``ctc_loss``, ``cudnnCTCLoss_v8`` (softmax normalization).

    The samples cuDNN refuses get torch's values, computed here: an empty target costs ``-log p(all blanks)``
    (``-sum(log_softmax(log_probs[:input_length, n])[:, 0])``, differentiable), a target longer than its input
    ``inf`` (0 with ``zero_infinity``; no gradient either way, where torch's is NaN without ``zero_infinity``);
    cuDNN runs the others, gathered. Targets longer than 255 labels raise ``NotImplementedError`` (cuDNN's limit)."""
    if as_int(blank, "blank") != 0:
        raise NotImplementedError(f"ctc_loss: blank={blank}: cuDNN's CTC loss has its blank at class 0 only (move "
                                  "the blank class to index 0)")  # fmt: skip
    if reduction not in ("none", "mean", "sum"):
        raise ValueError(f"ctc_loss: reduction must be 'none', 'mean' or 'sum', got {reduction!r}")
    check_dtype(log_probs, ("float32",), "log_probs", "cuDNN's CTC loss")
    if log_probs.ndim not in (2, 3):
        raise ValueError(f"ctc_loss: log_probs must be (T, N, C) or (T, C), got shape {tuple(log_probs.shape)}")
    b = log_probs.ndim == 3
    il, tl = host_ints(input_lengths, "input_lengths"), host_ints(target_lengths, "target_lengths")
    if not b and getattr(targets, "ndim", 1) == 1:
        targets = targets[None] if hasattr(targets, "ndim") else [targets]
    if any(n > MAX_LABEL_LENGTH for n in tl):
        raise NotImplementedError(f"ctc_loss: target_lengths above {MAX_LABEL_LENGTH}: cuDNN's CTC limit")
    labels = pack_targets(targets, tl)
    x = log_probs if b else log_probs[:, None]
    if len(il) != len(tl) or len(tl) != x.shape[1]:
        raise ValueError(f"ctc_loss: input_lengths ({len(il)}) and target_lengths ({len(tl)}) must have one value "
                         f"per sample ({x.shape[1]})")  # fmt: skip
    if any(not 0 <= v <= x.shape[0] for v in il) or any(v < 0 for v in tl):
        raise ValueError(f"ctc_loss: input_lengths must be in [0, T={x.shape[0]}] and target_lengths >= 0, got "
                         f"{il} and {tl}")  # fmt: skip
    # the samples cuDNN takes: a non-empty target no longer than its input (an empty one it costs 0, a longer one
    # it refuses); the others get torch's values below
    run_ = [i for i, (i_n, t_n) in enumerate(zip(il, tl)) if 0 < t_n <= i_n]
    costs = None
    if run_:
        starts = np.cumsum([0] + tl[:-1])
        part = labels if len(run_) == len(tl) else np.concatenate([labels[starts[i] : starts[i] + tl[i]] for i in run_])
        arrays = dict(labels=part, label_lengths=np.asarray([tl[i] for i in run_], np.int32),
                      input_lengths=np.asarray([il[i] for i in run_], np.int32))  # fmt: skip
        if library(log_probs) == "torch":  # the torch op takes tensors: host (CPU) ones, uploaded by cuDNN's call
            import torch

            arrays = {k: torch.from_numpy(v) for k, v in arrays.items()}
        # cuDNN applies a softmax over the classes itself: of log-probabilities that is exp(log_probs) again
        costs = call1("ctc_loss", x if len(run_) == len(tl) else x[:, run_], **arrays, blank=0,
                      normalization="softmax")  # fmt: skip
    if len(run_) != len(tl):
        costs = _with_refused(x, costs, run_, il, tl)
    out = ctc_reduce(costs, tl, reduction, bool(zero_infinity))
    return out[0] if not b and reduction == "none" else out


def _with_refused(x: Any, costs: Any, run_: list[int], il: list[int], tl: list[int]) -> Any:
    """The per-sample costs ``(N,)``: cuDNN's ``costs`` at ``run_``, torch's values at the others: ``inf`` for a
    target longer than its input, ``-sum(log_softmax(x[:il, n])[:, 0])`` (all blanks) for an empty one."""
    n = len(tl)
    empty = [i for i in range(n) if tl[i] == 0]
    if library(x) == "torch":
        import torch

        out = torch.full((n,), float("inf"), dtype=x.dtype, device=x.device)
        if run_:
            out = out.index_put((torch.tensor(run_, device=x.device),), costs)
        if empty:
            vals = torch.stack([-torch.log_softmax(x[: il[i], i], -1)[:, 0].sum() for i in empty])
            out = out.index_put((torch.tensor(empty, device=x.device),), vals)
        return out
    import cupy

    from .activation import log_softmax  # cuDNN's, as the torch branch takes torch's

    with x.device:
        out = cupy.full((n,), float("inf"), dtype=x.dtype)
        if run_:
            out[run_] = costs
        for i in empty:  # no frames: cost 0 (log 1; cuDNN's tensors take no zero dim)
            out[i] = -log_softmax(x[: il[i], i], -1)[:, 0].sum() if il[i] else 0.0
        return out
