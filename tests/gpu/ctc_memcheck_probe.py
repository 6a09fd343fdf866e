"""Which parameter of cudnnkit's CTC call makes memcheck report "Invalid __shared__ write" (issue 10)?

The issue: ``compute-sanitizer --tool memcheck`` on ``ops.ctc_loss`` with T=20, N=3, A=6 and label lengths 3/2/1
reports "Invalid __shared__ write of size 4" in ``compute_alphas_and_betas_v8``; ``torch.nn.functional.ctc_loss``
on the same inputs (int32 targets on the CPU, every input length T) is clean. This program makes one CTC call per
run, chosen by ``--variant``: cudnnkit's own ``ops.ctc_loss``, a raw-ctypes copy of exactly what it passes to
cuDNN, and that copy with one parameter changed to what torch passes, one variant each. Run every variant under
memcheck, each in its own process, with one command::

    python3 tests/gpu/ctc_memcheck_probe.py --under-memcheck [--out DIR] [--jobs 10]

(it finds compute-sanitizer like scripts/sanitize, runs each variant for both algorithms, and prints one line per
run: the error count, the first report, the costs' error against a float64 NumPy reference, the workspace size).
One variant by hand: ``python3 tests/gpu/ctc_memcheck_probe.py --variant max255 --algo deterministic``;
``--list`` names them.

What torch does (aten/src/ATen/native/cudnn/LossCTC.cpp, aten/src/ATen/cudnn/Descriptors.h):

* ``F.ctc_loss`` on ordinary tensors converts the lengths to host ``IntArrayRef`` and, when cuDNN may be used
  (blank 0, float32 3-d log_probs on the GPU, 1-d contiguous int32 targets **on the CPU**, every input length
  ``T``, every target length ``< 256`` and ``<=`` its input length), calls ``_cudnn_ctc_loss``: the *legacy*
  ``cudnnCTCLoss`` with host labels and lengths, a descriptor from ``cudnnSetCTCLossDescriptorEx(FLOAT,
  SOFTMAX, PROPAGATE_NAN)`` (no maxLabelLength: it reads back as 0), the workspace from the legacy
  ``cudnnGetCTCLossWorkspaceSize`` (which sees the host labels), ``deterministic=True`` always, log-softmax
  output as the input, and a gradient buffer that is not zeroed first. That is variant ``torch_ref``
  (``legacy_ex`` is the same call made here through ctypes).
* Only ``torch._cudnn_ctc_loss`` with *tensor* lengths (``_cudnn_ctc_loss_tensor``) calls ``cudnnCTCLoss_v8``,
  the entry point cudnnkit uses, with ``cudnnSetCTCLossDescriptor_v9(FLOAT, SOFTMAX,
  CUDNN_CTC_SKIP_OOB_GRADIENTS, maxLabelLength=255)`` (torch maps its PROPAGATE_NAN to SKIP_OOB), each of
  labels, label lengths and input lengths in its own int32 device tensor, and ``cudnnGetCTCLossWorkspaceSize_v8``.
  That is variant ``torch_v8_ref`` (``torch_v8`` is the same call through ctypes).

cudnnkit (src/cudnnkit/ops/ctc.py) calls ``cudnnCTCLoss_v8`` with ``cudnnSetCTCLossDescriptor_v9(FLOAT, SOFTMAX,
CUDNN_CTC_ZERO_OOB_GRADIENTS, maxLabelLength = the batch's longest label)``, the three index arrays packed in one
int32 device buffer ``[label_lengths, input_lengths, labels]`` (so labels start at byte ``8 N``, 24 here), the
``_v8`` workspace, logits as the input, and the gradient zeroed by ``cudnnSetTensor`` first. The torch run that
was clean therefore never ran ``compute_alphas_and_betas_v8`` at all: the variants separate the entry point from
each parameter.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


@dataclass(frozen=True)
class Raw:
    """One raw cuDNN CTC call. The defaults are exactly what ``ops.ctc_loss`` passes today."""

    api: str = "v8"  # "v8": cudnnCTCLoss_v8 (device labels); "legacy": cudnnCTCLoss (host labels)
    desc: str = "v9"  # "v9": cudnnSetCTCLossDescriptor_v9; "v8": ..._v8 (NaN-propagation mode); "ex": ...Ex
    max_label_length: int | str = "batch"  # "batch": max(label_lengths); "T": the input length; or a number
    grad_mode: str = "zero"  # v9: ZERO_OOB / SKIP_OOB gradients; v8 and Ex: NOT_PROPAGATE / PROPAGATE NaN
    buffers: str = "one"  # "one": [label_lengths, input_lengths, labels] in one int32 buffer; "separate"
    pre_zero: bool = True  # grads zeroed with cudnnSetTensor before the call (cudnnkit does)
    workspace: str = "query"  # "query": the entry point's own size query; "legacy": the legacy query's size;
    #                             "double": 2 x the query + 1 MiB
    inputs: str = "logits"  # "logits" (cudnnkit's test inputs), "log_probs" (what torch passes), "probs"
    norm: str = "softmax"  # CUDNN_LOSS_NORMALIZATION_SOFTMAX (both torch and cudnnkit) or "none" (takes probs)
    labels: str = "concatenated"  # the v8 labels buffer: "concatenated" (documented, torch's) or "padded"
    #                               (N x maxLabelLength, zero-filled): the costs then say which cuDNN reads
    grads: bool = True  # False: gradients=NULL (costs only)


OURS = Raw()
TORCH_V8 = Raw(max_label_length=255, grad_mode="skip", buffers="separate", pre_zero=False, inputs="log_probs")
TORCH_LEGACY = Raw(api="legacy", desc="ex", grad_mode="skip", pre_zero=False, inputs="log_probs")

#: name -> (what runs, what it tells); the likeliest culprits first (cudnnkit's call and its exact copy lead).
VARIANTS: dict[str, tuple[Any, str]] = {
    "ours_op": ("op", "cudnnkit's ops.ctc_loss, as the issue ran it"),
    "raw_ours": (OURS, "ctypes copy of ops.ctc_loss's call: must fail like ours_op, or the copy is not exact"),
    "max255": (replace(OURS, max_label_length=255), "maxLabelLength 255 (torch's v8 value) instead of 3"),
    "maxT": (replace(OURS, max_label_length="T"), "maxLabelLength T=20"),
    "skip_oob": (replace(OURS, grad_mode="skip"), "CUDNN_CTC_SKIP_OOB_GRADIENTS (torch's v8 mode)"),
    "separate": (replace(OURS, buffers="separate"), "labels and lengths each in its own allocation"),
    "legacy_ours": (replace(OURS, api="legacy", workspace="query"), "legacy cudnnCTCLoss, host labels, our desc"),
    "legacy_ours_max255": (replace(OURS, api="legacy", max_label_length=255), "legacy call, maxLabelLength 255"),
    "desc_v8": (replace(OURS, desc="v8"), "cudnnSetCTCLossDescriptor_v8 (NOT_PROPAGATE_NAN) instead of _v9"),
    "ws_legacy": (replace(OURS, workspace="legacy"), "v8 call, workspace sized by the legacy query"),
    "ws_double": (replace(OURS, workspace="double"), "v8 call, workspace 2 x query + 1 MiB"),
    "no_pre_zero": (replace(OURS, pre_zero=False), "no cudnnSetTensor zeroing of grads before the call"),
    "log_probs": (replace(OURS, inputs="log_probs"), "log-softmax input instead of logits"),
    "costs_only": (replace(OURS, grads=False), "gradients NULL: costs only"),
    "norm_none": (replace(OURS, norm="none", inputs="probs"), "CUDNN_LOSS_NORMALIZATION_NONE on softmax probs"),
    "padded_labels": (replace(OURS, labels="padded"), "labels as N x maxLabelLength, zero-padded"),
    "torch_v8": (TORCH_V8, "ctypes copy of torch's _cudnn_ctc_loss_tensor call (v8 API)"),
    "legacy_ex": (TORCH_LEGACY, "ctypes copy of torch's F.ctc_loss call (legacy API, Ex descriptor)"),
    "torch_ref": ("torch_ref", "torch.nn.functional.ctc_loss, int32 CPU targets, input lengths T (legacy API)"),
    "torch_v8_ref": ("torch_v8_ref", "torch._cudnn_ctc_loss with int32 CUDA tensor lengths (v8 API)"),
}


# ----------------------------------------------------------------- inputs and reference


def make_inputs(args: argparse.Namespace) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(args.seed)
    ll = np.array([int(v) for v in args.label_lengths.split(",")])
    N = ll.shape[0]
    il = np.array([int(v) for v in args.input_lengths.split(",")]) if args.input_lengths else np.full(N, args.T)
    labels = rng.integers(1, args.A, int(ll.sum()))
    x = rng.standard_normal((args.T, N, args.A)).astype(np.float32)
    z = x.astype(np.float64) - x.max(axis=-1, keepdims=True)
    lp = z - np.log(np.exp(z).sum(axis=-1, keepdims=True))
    d = {"x": x, "log_probs": lp.astype(np.float32), "probs": np.exp(lp).astype(np.float32)}
    return {**d, "labels": labels, "label_lengths": ll, "input_lengths": il}


def reference_costs(d: dict[str, np.ndarray]) -> np.ndarray:
    """-log p(label | x) per sample, float64, by the CTC forward recursion in log space."""
    x = d["x"].astype(np.float64)
    z = x - x.max(axis=-1, keepdims=True)
    lp = z - np.log(np.exp(z).sum(axis=-1, keepdims=True))
    out, start = [], 0
    for n, (L, Tn) in enumerate(zip(d["label_lengths"], d["input_lengths"])):
        lab = d["labels"][start : start + L]
        start += L
        ext = np.zeros(2 * L + 1, np.int64)
        ext[1::2] = lab
        S = len(ext)
        skip = np.zeros(S, bool)
        skip[2:] = (ext[2:] != 0) & (ext[2:] != ext[:-2])
        a = np.full(S, -np.inf)
        a[0] = lp[0, n, 0]
        a[1] = lp[0, n, ext[1]]
        for t in range(1, Tn):
            prev1 = np.concatenate(([-np.inf], a[:-1]))
            prev2 = np.where(skip, np.concatenate(([-np.inf, -np.inf], a[:-2])), -np.inf)
            a = np.logaddexp(np.logaddexp(a, prev1), prev2) + lp[t, n, ext]
        out.append(-np.logaddexp(a[-1], a[-2]))
    return np.array(out)


# ----------------------------------------------------------------- the calls


def _ptr(xp: Any, arr: Any) -> int:
    return xp.view(arr, "buffer").ptr


def run_op(xp: Any, d: dict, algo: str) -> tuple[np.ndarray, int | None]:
    from cudnnkit import ops

    costs, _ = ops.ctc_loss(xp.from_numpy(d["x"], 0), d["labels"], d["label_lengths"], d["input_lengths"], algo=algo)
    return np.asarray(xp.to_numpy(costs), np.float64), None


def _descriptor(v: Raw, norm: int, max_len: int) -> ctypes.c_void_p:
    from cudnnkit import lib

    desc = ctypes.c_void_p()
    lib.cudnnCreateCTCLossDescriptor(ctypes.byref(desc))
    if v.desc == "v9":
        mode = lib.CUDNN_CTC_SKIP_OOB_GRADIENTS if v.grad_mode == "skip" else lib.CUDNN_CTC_ZERO_OOB_GRADIENTS
        lib.cudnnSetCTCLossDescriptor_v9(desc, lib.CUDNN_DATA_FLOAT, norm, mode, max_len)
    else:
        nan = lib.CUDNN_PROPAGATE_NAN if v.grad_mode == "skip" else lib.CUDNN_NOT_PROPAGATE_NAN
        if v.desc == "v8":
            lib.cudnnSetCTCLossDescriptor_v8(desc, lib.CUDNN_DATA_FLOAT, norm, nan, max_len)
        else:
            lib.cudnnSetCTCLossDescriptorEx(desc, lib.CUDNN_DATA_FLOAT, norm, nan)
    return desc


def run_raw(xp: Any, v: Raw, d: dict, algo: str) -> tuple[np.ndarray, int]:
    """The cuDNN calls of ``ops.ctc_loss`` made by hand, with the parameters of ``v``."""
    from cudnnkit import lib
    from cudnnkit.runtime import contiguous_strides, get_handle, scaling_ref, tensor_descriptor

    int_p = ctypes.POINTER(ctypes.c_int)
    T, N, A = d["x"].shape
    ll, il, labels = (d[k].astype(np.int32) for k in ("label_lengths", "input_lengths", "labels"))
    algo_v = (
        lib.CUDNN_CTC_LOSS_ALGO_DETERMINISTIC if algo == "deterministic" else lib.CUDNN_CTC_LOSS_ALGO_NON_DETERMINISTIC
    )
    max_len = {"batch": max(1, int(ll.max())), "T": T}.get(v.max_label_length, v.max_label_length)
    norm = lib.CUDNN_LOSS_NORMALIZATION_NONE if v.norm == "none" else lib.CUDNN_LOSS_NORMALIZATION_SOFTMAX
    desc = _descriptor(v, norm, int(max_len))
    tdesc = tensor_descriptor("float32", (T, N, A), contiguous_strides((T, N, A)), min_dims=3)
    stream = xp.current_stream(0)
    handle = get_handle(0, stream, xp)

    probs = xp.from_numpy(d["x" if v.inputs == "logits" else v.inputs], 0)
    dev_labels = labels  # what the v8 call reads; the legacy calls take the host labels, concatenated
    if v.labels == "padded":
        rows = np.zeros((N, int(max_len)), np.int32)
        for n, (start, length) in enumerate(zip(np.cumsum(ll) - ll, ll)):
            rows[n, :length] = labels[start : start + length]
        dev_labels = rows.ravel()
    costs = xp.empty((N,), "float32", 0)
    grads = xp.empty((T, N, A), "float32", 0)
    keep = []
    if v.buffers == "one":
        buf = xp.from_numpy(np.concatenate([ll, il, dev_labels]).astype(np.int32), 0)
        keep.append(buf)
        base = _ptr(xp, buf)
        p_ll, p_il, p_lab = base, base + 4 * N, base + 8 * N
    else:
        bufs = [xp.from_numpy(a, 0) for a in (ll, il, dev_labels)]
        keep += bufs
        p_ll, p_il, p_lab = (_ptr(xp, b) for b in bufs)
    h_lab, h_ll, h_il = ((ctypes.c_int * len(a))(*a.tolist()) for a in (labels, ll, il))

    size = ctypes.c_size_t()
    gdesc = tdesc if v.grads else None
    if v.api == "legacy" or v.workspace == "legacy":
        lib.cudnnGetCTCLossWorkspaceSize(handle, tdesc, gdesc, h_lab, h_ll, h_il, algo_v, desc, ctypes.byref(size))
    else:
        lib.cudnnGetCTCLossWorkspaceSize_v8(handle, algo_v, desc, tdesc, gdesc, ctypes.byref(size))
    nbytes = size.value * 2 + (1 << 20) if v.workspace == "double" else size.value
    ws = xp.empty((max(nbytes, 1),), "uint8", 0)
    ws_ptr = _ptr(xp, ws) if nbytes else None

    gptr = _ptr(xp, grads) if v.grads else None
    if v.grads and v.pre_zero:
        # cudnnSetTensor takes 4-d and up: the same memory described as (T, N, A, 1), as ops.ctc_loss does
        whole = tensor_descriptor("float32", (T, N, A), contiguous_strides((T, N, A)))
        lib.cudnnSetTensor(handle, whole, gptr, scaling_ref("float32", 0.0))
    if v.api == "legacy":
        lib.cudnnCTCLoss(
            handle,
            tdesc,
            _ptr(xp, probs),
            h_lab,
            h_ll,
            h_il,
            _ptr(xp, costs),
            gdesc,
            gptr,
            algo_v,
            desc,
            ws_ptr,
            nbytes,
        )
    else:
        lib.cudnnCTCLoss_v8(
            handle,
            algo_v,
            desc,
            tdesc,
            _ptr(xp, probs),
            ctypes.cast(p_lab, int_p),
            ctypes.cast(p_ll, int_p),
            ctypes.cast(p_il, int_p),
            _ptr(xp, costs),
            gdesc,
            gptr,
            nbytes,
            ws_ptr,
        )
    xp.synchronize(0)
    out = np.asarray(xp.to_numpy(costs), np.float64)
    lib.cudnnDestroyCTCLossDescriptor(desc)
    del keep, ws
    return out, nbytes


def run_torch(which: str, d: dict, algo: str) -> tuple[np.ndarray, None]:
    import torch

    lp = torch.from_numpy(d["log_probs"]).cuda()
    targets = torch.from_numpy(d["labels"].astype(np.int32))  # int32, on the CPU: the cuDNN condition
    if which == "torch_ref":
        with torch.backends.cudnn.flags(enabled=True):
            costs = torch.nn.functional.ctc_loss(
                lp,
                targets,
                torch.from_numpy(d["input_lengths"]),
                torch.from_numpy(d["label_lengths"]),
                blank=0,
                reduction="none",
            )
        try:
            il_list, ll_list = d["input_lengths"].tolist(), d["label_lengths"].tolist()
            used = bool(torch._use_cudnn_ctc_loss(lp, targets, il_list, ll_list, 0))
            print(f"note: torch {'uses cuDNN (cudnnCTCLoss)' if used else 'does NOT use cuDNN'} for these inputs")
        except Exception as e:  # a private torch function: its absence must not hide the run's result
            print(f"note: torch._use_cudnn_ctc_loss unavailable ({type(e).__name__})")
    else:
        il = torch.from_numpy(d["input_lengths"].astype(np.int32)).cuda()
        tl = torch.from_numpy(d["label_lengths"].astype(np.int32)).cuda()
        costs, _ = torch._cudnn_ctc_loss(lp, targets.cuda(), il, tl, 0, algo == "deterministic", False)
    torch.cuda.synchronize()
    return costs.double().cpu().numpy(), None


def run_variant(name: str, library: str, d: dict, algo: str) -> None:
    from cudnnkit.runtime import adapters

    what, text = VARIANTS[name]
    xp = adapters.get("torch" if isinstance(what, str) and what.startswith("torch") else library)
    print(f"variant {name} ({algo}, {xp.name}): {text}", flush=True)
    try:
        if what == "op":
            costs, ws = run_op(xp, d, algo)
        elif isinstance(what, str):
            costs, ws = run_torch(what, d, algo)
        else:
            print(f"    {what}", flush=True)
            costs, ws = run_raw(xp, what, d, algo)
    except Exception as e:
        print(f"RESULT {name} {algo}: raised {type(e).__name__}: {e}", flush=True)
        raise
    ref = reference_costs(d)
    err = float(np.max(np.abs(costs - ref) / np.maximum(1.0, np.abs(ref))))
    ws_text = "" if ws is None else f" workspace={ws} B"
    print(f"RESULT {name} {algo}: costs={np.array2string(costs, precision=5)} max_rel_err={err:.2e}{ws_text}")


# ----------------------------------------------------------------- all variants under memcheck


def under_memcheck(args: argparse.Namespace) -> int:
    sys.path.insert(0, str(HERE))
    from sanitize_cases import error_summary, find_compute_sanitizer

    sanitizer, looked = find_compute_sanitizer()
    if sanitizer is None:
        print("compute-sanitizer not found; looked in: " + "; ".join(looked), file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = str(ROOT / "src") + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["PYTORCH_NO_CUDA_MEMORY_CACHING"] = "1"  # every buffer its own allocation: overflows show
    algos = [args.algo] if args.algo else ["deterministic", "non_deterministic"]
    names = args.variant or list(VARIANTS)
    passthrough = ["--T", str(args.T), "--A", str(args.A), "--label-lengths", args.label_lengths]
    passthrough += ["--seed", str(args.seed), "--library", args.library]
    if args.input_lengths:
        passthrough += ["--input-lengths", args.input_lengths]
    jobs = []
    for name in names:
        for algo in algos:
            log = out / f"{name}-{algo}.log"
            cmd = [sanitizer, "--tool", "memcheck", "--error-exitcode", "1", "--print-limit", "5"]
            cmd += [sys.executable, str(Path(__file__).resolve()), "--variant", name, "--algo", algo, *passthrough]
            jobs.append((name, algo, cmd, log))

    def one(job):
        name, algo, cmd, log = job
        t0 = time.monotonic()
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout, env=env, cwd=ROOT)
            text, rc = p.stdout + p.stderr, p.returncode
        except subprocess.TimeoutExpired as e:
            text, rc = e.stdout or "", None
            if isinstance(text, bytes):
                text = text.decode(errors="replace")
        log.write_text("$ " + " ".join(cmd) + "\n\n" + text)
        return name, algo, rc, text, time.monotonic() - t0

    print(f"{len(jobs)} runs under memcheck, {args.jobs} at a time; logs in {out}/", flush=True)
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        results = list(pool.map(one, jobs))
    bad = 0
    width = max(len(n) for n in names)
    for name, algo, rc, text, secs in results:
        s = error_summary(text)
        result = next((ln.split(":", 1)[1].strip() for ln in text.splitlines() if ln.startswith("RESULT ")), "")
        errors = "timeout" if rc is None else ("no summary" if s["errors"] is None else str(s["errors"]))
        bad += errors != "0" or not result or " raised " in f" {result}"
        first = s["first"][0] if s["first"] else ("" if result else f"exit {rc}, no RESULT line: see the log")
        line = f"{name:<{width}} {algo:<17} errors={errors:<4} {secs:4.0f}s  {result}"
        print(line + (f"\n{'':<{width}} first: {first[:160]}" if first else ""))
    print(f"ctc_memcheck_probe: {len(results) - bad} of {len(results)} runs clean")
    return 0 if bad == 0 else 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--variant", action="append", choices=list(VARIANTS), help="one run (repeat for several)")
    p.add_argument("--algo", choices=("deterministic", "non_deterministic"))
    p.add_argument("--library", choices=("cupy", "torch"), default="torch", help="allocates the raw variants' buffers")
    p.add_argument("--T", type=int, default=20)
    p.add_argument("--A", type=int, default=6)
    p.add_argument("--label-lengths", default="3,2,1")
    p.add_argument("--input-lengths", help="comma list (default: every one T)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--list", action="store_true")
    p.add_argument("--under-memcheck", action="store_true", help="every variant (and both algos) under memcheck")
    p.add_argument("--out", default="ctc-probe-logs")
    p.add_argument("--jobs", type=int, default=10, help="runs at once under --under-memcheck")
    p.add_argument("--timeout", type=float, default=300.0)
    args = p.parse_args(argv)
    if args.list:
        for name, (_, text) in VARIANTS.items():
            print(f"{name:<20} {text}")
        return 0
    if args.under_memcheck:
        return under_memcheck(args)
    try:
        import cudnnkit  # noqa: F401
    except ImportError:
        sys.path.insert(0, str(ROOT / "src"))
    if not args.variant:
        p.error("give --variant NAME (or --under-memcheck, or --list)")
    d = make_inputs(args)
    for name in args.variant:
        for algo in [args.algo] if args.algo else ["deterministic", "non_deterministic"]:
            run_variant(name, args.library, d, algo)
    return 0


if __name__ == "__main__":
    sys.exit(main())
