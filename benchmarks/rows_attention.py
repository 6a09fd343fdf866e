"""Attention rows of issue 17 beyond rows_sdpa's B4 S4096 ones, each side by side in one process with torch or, for
the ``vs cudnn-frontend`` rows, with NVIDIA's cudnn-frontend: cudnnkit through the graph layer (pre-bound plans:
``Graph.sdpa_forward``/``sdpa_backward``), torch through ``F.scaled_dot_product_attention``.

* ``long``: bf16 B1 H16 S16384 D128 (NVIDIA publishes 702 TFLOP/s forward, 612 backward on the H200 with
  cuDNN 9.19), forward (inference) and forward+backward, causal and not, against torch's cuDNN backend.
* ``window``: a causal sliding window of 1024 (``left_bound=1024``) at B4 H16 S4096 D128; FLOPs counted for the
  band only (each row keeps ``min(i + 1, 1024)`` keys). torch has no window: it runs *full causal* (the name says
  so), so its TFLOP/s column counts the band's FLOPs over a bigger job.
* ``ragged``: a packed (THD) causal batch, B8 lengths 4096 ... 512 summing to 16384, H16 D128, ragged offsets and
  the padding mask's lengths (FLOPs of each sample's causal triangle); torch runs the *padded* batch (B8 S4096,
  causal, no padding mask: it computes the padding too), its cuDNN backend.
* ``paged decode``: batch 64, one query token, 8192-token caches in pages of 64 read through shuffled block
  tables, H32 H_kv8 D128 (Llama-3-8B's heads); ``bytes`` is the K and V read (the floor), so %copy-bw is the
  share of the copy bandwidth the decode reaches; torch runs SDPA on the contiguous caches (its default backend,
  ``enable_gqa``).
* ``fp8``: fp8 e4m3 forward (inference, no stats; ``Graph.sdpa_fp8_forward`` with per-tensor descale/scale
  factors as float32 ``(1, 1, 1, 1)`` device arrays, the amax outputs written too) at B4 H16 S4096 D128, causal
  and not, and at B1 H16 S16384 D128 non-causal; FLOPs counted as the bf16 rows count them. NVIDIA publishes
  1,055 TFLOP/s fp8 forward on the H200 with cuDNN 9.19. And fp8 e4m3 forward+backward at B4 H16 S4096 D128,
  causal and not: the training forward (stats written), then ``Graph.sdpa_fp8_backward`` with ``do`` in e4m3 too
  (so ``dP`` and the gradients), the scales of ``dP`` and the gradients set once, before timing, from the
  backward's amax outputs; FLOPs 3.5x the forward's, as the bf16 fwd+bwd rows. torch has no fp8 SDPA: it runs its
  cuDNN backend in *bf16* forward (or forward+backward) on the same shape (the name says so,
  ``vs torch-cudnn bf16``). ``--filter attention/fp8`` selects these.
* ``nn.sdpa bias+GQA``: the functional ``cudnnkit.nn.scaled_dot_product_attention`` with an additive per-head
  bias and grouped heads (the L3 op ``attention``, host time included) against torch's ``F.scaled_dot_product_attention``
  with the same mask and ``enable_gqa``, bf16 B2 H16 H_kv4 S2048 D128, forward and forward+backward (dbias too).
* ``vs cudnn-frontend``: cudnnkit's SDPA against cudnn-frontend 1.32's (``import cudnn``) on the same shapes and
  the same arrays: ``fwd`` (inference) and ``fwd+bwd`` (training forward writing the stats, then the backward) at
  bf16 B4 H16 S4096 D128, causal and not (``causal fwd ...``), and ``long fwd`` / ``long causal fwd`` at B1 H16
  S16384 D128. ``ours`` is ``bf16_case``'s pre-bound plans (the ones the torch rows time); the reference column,
  which the harness and the table call ``torch``, is cudnn-frontend, *not* torch (the row notes say so, with
  ``cudnn.__version__``, ``cudnn.backend_version()`` and the engine that served): one ``cudnn.pygraph`` per graph,
  built once (bf16 io, float32 intermediates and compute, scale ``1/sqrt(D)`` as ours, causal as the diagonal
  band ``diagonal_alignment=TOP_LEFT, diagonal_band_right_bound=0``, ``generate_stats`` for training; heuristics A,
  then FALLBACK), run by ``graph.execute(variant_pack, workspace, handle=handle)`` with torch tensors as its
  buffers (ours' ``q``, ``k``, ``v``, ``do`` read, ``o``, ``stats``, ``dq``, ``dk``, ``dv`` written), a uint8
  workspace of ``graph.get_workspace_size()`` and one handle on torch's current stream. Before timing each row
  runs both sides once on the same inputs and compares what they write (``|theirs - ours| <= 2e-2 + 2**-7 *
  |ours|``, bf16's rounding on larger values); a disagreement is the row's error. cudnn-frontend is not a
  dependency: without it (``import cudnn`` fails) the factory prints one line and gives no rows. Install the wheel
  the repository carries and put it on the path, then select the rows::

      pip install --no-deps --target /tmp/fe .whl/*.whl
      PYTHONPATH=src:/tmp/fe python -m benchmarks --filter "vs cudnn-frontend"

A plan that fails fails only its rows (``or_error``). Nothing here needs a GPU until a factory is called.
"""

from __future__ import annotations

import math
import sys
from types import SimpleNamespace

from .harness import Row, or_error, register
from .rows_sdpa import bf16_case

FAMILY = "attention"


def _fwd_flops(b, h, s, d, *, causal, left_bound=None) -> float:
    """The forward's FLOPs (two matmuls over the kept query/key pairs)."""
    if left_bound is not None:  # the band: row i keeps min(i + 1, left_bound) keys
        pairs = sum(min(i + 1, left_bound) for i in range(s))
    else:
        pairs = s * (s + 1) // 2 if causal else s * s
    return 4.0 * b * h * d * pairs


def _words(*parts: str) -> str:
    """The non-empty ``parts``, joined by spaces."""
    return " ".join(p for p in parts if p)


def _dense_rows(b, h, s, d, *, causal, tag, left_bound=None, vs="vs torch-cudnn", reference=None, train=True,
                notes=""):  # fmt: skip
    """Forward (inference) and, with ``train``, forward+backward rows of one dense BHSD shape: ours through
    ``bf16_case``'s pre-bound plans, the reference column through torch's cuDNN backend or, given ``reference``,
    through ``reference(c, causal=, training=)`` (the call for ``bf16_case`` ``c``; a ``note`` attribute on it goes
    into the row's notes). ``vs`` ends the rows' names: what the reference column runs (say, when it differs)."""
    c = bf16_case(b, h, s, d, name=_words("attention", tag, vs), causal=causal, left_bound=left_bound)
    if reference is None:
        from torch.nn.attention import SDPBackend

        def reference(c, *, causal, training):
            run = c.torch_train if training else c.torch_fwd
            return lambda: run(SDPBackend.CUDNN_ATTENTION)

    fwd_flops = _fwd_flops(b, h, s, d, causal=causal, left_bound=left_bound)

    def row(what, ours, training, flops):
        ref = reference(c, causal=causal, training=training)
        note = "; ".join(filter(None, (notes, getattr(ref, "note", ""))))
        return Row(FAMILY, _words(tag, what, vs), f"B{b} H{h} S{s} D{d}", "bfloat16", ours=ours,
                   torch=ref, flops=flops, notes=note)  # fmt: skip

    rows = [row("fwd", c.infer, False, fwd_flops)]
    if train:
        rows.append(row("fwd+bwd", c.ours_train, True, 3.5 * fwd_flops))
    return rows


@register
def long_rows() -> list[Row]:
    """B1 H16 S16384 D128, causal and not."""
    return [
        *_dense_rows(1, 16, 16384, 128, causal=False, tag="long"),
        *_dense_rows(1, 16, 16384, 128, causal=True, tag="long causal"),
    ]


@register
def window_rows() -> list[Row]:
    """A causal sliding window of 1024 at S4096; torch runs full causal."""
    return _dense_rows(4, 16, 4096, 128, causal=True, left_bound=1024, tag="window1024 causal",
                       vs="vs torch-cudnn full causal (no window)")  # fmt: skip


#: the check's tolerance, elementwise: ``|theirs - ours| <= ATOL + RTOL * |ours|`` (bf16 keeps 8 significant bits, so
#: two correct results one rounding apart differ by up to 2**-8 of the value, 2**-7 between the two roundings; values
#: above 2 are common in the causal dV, where the first keys collect many queries' probabilities)
ATOL, RTOL = 2e-2, 2.0**-7

#: cudnn-frontend's data types of the arrays its graphs describe, by ``str(torch dtype)``
_FE_DTYPES = {"torch.bfloat16": "BFLOAT16", "torch.float32": "FLOAT"}


def _frontend_graph(fe, arrays: dict, *, causal: bool, scale: float, training: bool, backward: bool = False, **graph):
    """One validated cudnn-frontend SDPA graph (``fe`` is the ``cudnn`` module) over ``arrays`` (name -> an array
    with ``shape``, ``stride()`` and a torch ``dtype``, BHSD): the forward ``q, k, v -> o`` (and ``stats``, float32
    ``(b, h, s, 1)``, with ``training``), or with ``backward`` the backward ``q, k, v, o, do, stats -> dq, dk, dv``.
    bf16 in and out, float32 intermediates and compute, ``attn_scale=scale``; causal as the diagonal band
    (``diagonal_alignment=TOP_LEFT``, ``diagonal_band_right_bound=0``: column <= row, torch's ``is_causal``).
    ``graph`` goes to ``cudnn.pygraph`` (``handle=``). Returns ``(graph, tensors)``: the graph's tensors by name, the
    variant pack's keys. Needs no device until it is built."""
    g = fe.pygraph(io_data_type=fe.data_type.BFLOAT16, intermediate_data_type=fe.data_type.FLOAT,
                   compute_data_type=fe.data_type.FLOAT, **graph)  # fmt: skip

    def dtype(name):
        return getattr(fe.data_type, _FE_DTYPES[str(arrays[name].dtype)])

    def layout(name):
        return {"dim": list(arrays[name].shape), "stride": list(arrays[name].stride())}

    band = {"diagonal_alignment": fe.diagonal_alignment.TOP_LEFT, "diagonal_band_right_bound": 0} if causal else {}
    ins = ("q", "k", "v", "o", "do", "stats") if backward else ("q", "k", "v")
    ts = {n: g.tensor(name=n, data_type=dtype(n), **layout(n)) for n in ins}
    if backward:  # positional: q, k, v, o, dO, stats
        outs = dict(zip(("dq", "dk", "dv"), g.sdpa_backward(*ts.values(), attn_scale=scale, **band)))
    else:
        o, stats = g.sdpa(*ts.values(), attn_scale=scale, generate_stats=training, **band)
        outs = {"o": o, "stats": stats} if training else {"o": o}
    for n, t in outs.items():
        t.set_output(True).set_data_type(dtype(n)).set_dim(layout(n)["dim"]).set_stride(layout(n)["stride"])
    g.validate()
    return g, {**ts, **outs}


def _frontend_plan(fe, handle, arrays: dict, **kw):
    """:func:`_frontend_graph`'s graph built once (heuristics A, then FALLBACK; the first plan that builds), and its
    call: ``graph.execute`` of the ``arrays`` with a workspace of its size, on ``handle``. The call's ``note`` says
    which engine serves it (a cudnn-frontend python engine by name, or the cuDNN backend's)."""
    import torch

    g, ts = _frontend_graph(fe, arrays, handle=handle, **kw)
    g.build([fe.heur_mode.A, fe.heur_mode.FALLBACK])
    pack = {t: arrays[n] for n, t in ts.items()}
    workspace = torch.empty(max(g.get_workspace_size(), 1), device="cuda", dtype=torch.uint8)

    def call():
        g.execute(pack, workspace, handle=handle)

    engine = g.selected_engine  # None: the cuDNN backend serves the plan
    call.note = "cuDNN backend engine" if engine is None else f"frontend python engine {engine.name}"
    return call


def _agree(ours, theirs, outputs: dict) -> None:
    """Run ``ours``, keep copies of ``outputs`` (name -> array both calls write), run ``theirs`` and raise a
    RuntimeError naming each output where they differ by more than ``ATOL + RTOL * |ours|`` (or are NaN). When ``ours``
    raises there is nothing to compare with: its own error is reported on its side of the row."""
    try:
        ours()
    except Exception:
        return
    expected = {n: x.clone() for n, x in outputs.items()}
    theirs()
    bad = []
    for n, x in outputs.items():
        ref = expected[n].float()
        diff = (x.float() - ref).abs()
        if not bool((diff <= ATOL + RTOL * ref.abs()).all()):  # NaN compares false
            bad.append(f"{n} max |diff| {diff.max().item():.3g}")
    if bad:
        raise RuntimeError(f"cudnn-frontend and cudnnkit disagree on the same inputs: {', '.join(bad)} (tolerance "
                           f"{ATOL:g} + 2**-7 * |cudnnkit|)")  # fmt: skip


def _frontend_reference(fe, handle):
    """``reference`` for :func:`_dense_rows`: cudnn-frontend on ``bf16_case``'s arrays (its inputs; its outputs are
    written where ours are), the forward graph (with stats when training) and, when training, the backward graph, each
    built once, at cudnnkit's scale ``1/sqrt(D)``; checked once against ours before timing (:func:`_agree`). A graph
    that fails to build or a disagreement fails the row's reference column with its error (:func:`or_error`)."""

    def reference(c, *, causal, training):
        return or_error(_frontend_side, fe, handle, c, causal=causal, training=training)

    return reference


def _frontend_side(fe, handle, c, *, causal, training):
    """cudnn-frontend's call for one row of ``bf16_case`` ``c`` (see :func:`_frontend_reference`)."""
    arrays = {n: getattr(c, n) for n in ("q", "k", "v", "do", "o", "stats", "dq", "dk", "dv")}
    kw = {"causal": causal, "scale": 1.0 / math.sqrt(c.q.shape[-1])}
    calls = [_frontend_plan(fe, handle, arrays, training=training, **kw)]
    if training:
        calls.append(_frontend_plan(fe, handle, arrays, training=True, backward=True, **kw))

    def theirs():
        for call in calls:
            call()

    outputs = ("o", "stats", "dq", "dk", "dv") if training else ("o",)
    _agree(c.ours_train if training else c.infer, theirs, {n: arrays[n] for n in outputs})
    theirs.note = "; ".join(dict.fromkeys(call.note for call in calls))
    return theirs


@register
def frontend_rows() -> list[Row]:
    """Side by side with cudnn-frontend (``import cudnn``): B4 H16 S4096 D128 forward and forward+backward, causal
    and not, and B1 H16 S16384 D128 forward, causal and not. No rows (one line on stderr) without cudnn-frontend."""
    try:
        import cudnn as fe

        if not hasattr(fe, "pygraph"):
            raise ImportError(f"the module named cudnn at {getattr(fe, '__file__', '?')} is not cudnn-frontend")
    except Exception as exc:  # not installed, or its extension or libcudnn failed to load
        msg = (str(exc).strip().splitlines() or [""])[0]
        print(f"note: cudnn-frontend is not importable ({type(exc).__name__}: {msg}); no 'vs cudnn-frontend' rows "
              "(pip install --no-deps --target /tmp/fe .whl/*.whl; PYTHONPATH=/tmp/fe)", file=sys.stderr)  # fmt: skip
        return []
    import torch

    handle = fe.create_handle()
    fe.set_stream(handle=handle, stream=torch.cuda.current_stream().cuda_stream)
    kw = {"vs": "vs cudnn-frontend", "reference": _frontend_reference(fe, handle),
          "notes": f"reference column (torch=): cudnn-frontend {fe.__version__}, cuDNN backend {fe.backend_version()}, "
          "not torch"}  # fmt: skip
    return [
        *_dense_rows(4, 16, 4096, 128, causal=False, tag="", **kw),
        *_dense_rows(4, 16, 4096, 128, causal=True, tag="causal", **kw),
        *_dense_rows(1, 16, 16384, 128, causal=False, tag="long", train=False, **kw),
        *_dense_rows(1, 16, 16384, 128, causal=True, tag="long causal", train=False, **kw),
    ]


#: e4m3's largest finite value
E4M3_MAX = 448.0


def _quantize(x):
    """``(x8, descale)``: ``x`` in e4m3 with one scale for the tensor, its largest magnitude at half e4m3's range."""
    import torch

    scale = E4M3_MAX / 2 / float(x.abs().max())
    return (x.float() * scale).to(torch.float8_e4m3fn), 1.0 / scale


def _factors(values: dict) -> dict:
    """The fp8 nodes' scale/descale factors as float32 ``(1, 1, 1, 1)`` device arrays, by name (a pre-bound plan
    reads them at each call)."""
    import torch

    return {n: torch.full((1, 1, 1, 1), float(x), device="cuda", dtype=torch.float32) for n, x in values.items()}


def _fp8_case(b, h, s, d, *, causal, tag) -> SimpleNamespace:
    """One fp8 e4m3 BHSD shape: ``q``, ``k``, ``v``, ``do`` in bf16 (seed 0: ``bf16_case``'s values), quantized per
    tensor (``q8`` ... ``do8``, ``descale_do``), the forward's ``factors`` by name (a backward adds its own), the
    forward's outputs (``o8``, ``stats``) and ``forward(with_stats)``: a pre-bound ``sdpa_fp8_forward`` plan
    writing o, amax_s, amax_o and, for training, the log-sum-exp stats."""
    import torch

    from cudnnkit.graph import Graph
    from cudnnkit.graph.nodes.sdpa_fp8 import FORWARD_FACTORS

    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, do = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(4))
    (q8, dq), (k8, dk), (v8, dv), (do8, ddo) = (_quantize(x) for x in (q, k, v, do))
    # |o| <= max |v| (o is a convex combination of v's rows): scale_o maps that onto half the range
    factors = _factors({"descale_q": dq, "descale_k": dk, "descale_v": dv, "descale_s": 1 / E4M3_MAX,
                        "scale_s": E4M3_MAX, "scale_o": 1 / dv})  # fmt: skip
    o8 = torch.empty_like(q8)
    stats = torch.empty(b, h, s, 1, device="cuda", dtype=torch.float32)
    amax_s, amax_o = (torch.empty(1, 1, 1, 1, device="cuda", dtype=torch.float32) for _ in range(2))

    def forward(with_stats):
        g = Graph(name=f"attention fp8 fwd {tag}")
        tq, tk, tv = g.tensor_like(q8), g.tensor_like(k8), g.tensor_like(v8)
        tf = {n: g.tensor_like(factors[n]) for n in FORWARD_FACTORS}
        r = g.sdpa_fp8_forward(tq, tk, tv, *(tf[n] for n in FORWARD_FACTORS), causal=causal, stats=with_stats)
        bind = {tq: q8, tk: k8, tv: v8, g.mark_output(r.o): o8, g.mark_output(r.amax_s): amax_s,
                g.mark_output(r.amax_o): amax_o}  # fmt: skip
        if with_stats:
            bind[g.mark_output(r.stats)] = stats
        bind.update({tf[n]: factors[n] for n in FORWARD_FACTORS})
        return g.build().bind(bind)

    return SimpleNamespace(q=q, k=k, v=v, q8=q8, k8=k8, v8=v8, do8=do8, descale_do=ddo, factors=factors, o8=o8,
                           stats=stats, forward=forward)  # fmt: skip


def _fp8_rows(b, h, s, d, *, causal, tag) -> list[Row]:
    """fp8 e4m3 forward (inference: no stats) of one BHSD shape through a pre-bound ``sdpa_fp8_forward`` plan,
    against torch's cuDNN backend in bf16 on the same shape (torch has no fp8 SDPA)."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    c = _fp8_case(b, h, s, d, causal=causal, tag=tag)

    def torch_fwd():
        with torch.no_grad(), sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(c.q, c.k, c.v, is_causal=causal)

    return [
        Row(FAMILY, f"fp8 {tag} fwd vs torch-cudnn bf16", f"B{b} H{h} S{s} D{d}", "float8_e4m3fn",
            ours=or_error(c.forward, False), torch=torch_fwd, flops=_fwd_flops(b, h, s, d, causal=causal),
            notes="torch has no fp8 SDPA: its side runs bf16; NVIDIA publishes 1,055 TFLOP/s fp8 forward (H200, "
            "cuDNN 9.19)"),
    ]  # fmt: skip


def _fp8_train_rows(b, h, s, d, *, causal, tag) -> list[Row]:
    """fp8 e4m3 forward+backward of one BHSD shape: the training forward (stats written) through a pre-bound
    ``sdpa_fp8_forward`` plan, then a pre-bound ``sdpa_fp8_backward`` plan (do e4m3, so dP and the gradients too),
    against torch's cuDNN backend in bf16 forward+backward on the same shape (``bf16_case``'s ``torch_train``)."""
    import torch
    from torch.nn.attention import SDPBackend

    from cudnnkit.graph import Graph
    from cudnnkit.graph.nodes.sdpa_fp8 import BACKWARD_FACTORS

    c = _fp8_case(b, h, s, d, causal=causal, tag=tag)
    # o as the forward quantized it; dP's and the gradients' scales from the backward's amax outputs (below)
    c.factors.update(_factors({"descale_do": c.descale_do, "descale_dp": 1.0, "scale_dq": 1.0, "scale_dk": 1.0,
                               "scale_dv": 1.0, "scale_dp": 1.0}), descale_o=1 / c.factors["scale_o"])  # fmt: skip
    grads = [torch.empty_like(x) for x in (c.q8, c.k8, c.v8)]  # do's dtype, e4m3
    amax = {n: torch.empty(1, 1, 1, 1, device="cuda", dtype=torch.float32) for n in ("dq", "dk", "dv", "dp")}

    def backward():
        g = Graph(name=f"attention fp8 bwd {tag}")
        arrays = (c.q8, c.k8, c.v8, c.o8, c.do8, c.stats)
        ts = [g.tensor_like(x) for x in arrays]
        tf = {n: g.tensor_like(c.factors[n]) for n in BACKWARD_FACTORS}
        r = g.sdpa_fp8_backward(*ts, *(tf[n] for n in BACKWARD_FACTORS), causal=causal)
        outs = {g.mark_output(t): x for t, x in zip(r, (*grads, *amax.values()))}  # dq dk dv, amax_dq dk dv dp
        return g.build().bind({**dict(zip(ts, arrays)), **{tf[n]: c.factors[n] for n in BACKWARD_FACTORS}, **outs})

    train, bwd = or_error(c.forward, True), or_error(backward)
    try:  # o8 and stats, then delayed scaling: dP's scale from its amax, then the gradients' (they read dP8)
        train()
        for _ in range(2):
            bwd()
            for n, a in amax.items():
                c.factors[f"scale_{n}"].copy_(E4M3_MAX / 2 / a.clamp_min(1e-30))
            c.factors["descale_dp"].copy_(1 / c.factors["scale_dp"])
    except Exception:  # recorded on the row that uses it
        pass

    def ours_train():
        train()
        bwd()

    tc = bf16_case(b, h, s, d, name=f"attention fp8 {tag} torch side", causal=causal)
    return [
        Row(FAMILY, f"fp8 {tag} fwd+bwd vs torch-cudnn bf16", f"B{b} H{h} S{s} D{d}", "float8_e4m3fn",
            ours=ours_train, torch=lambda: tc.torch_train(SDPBackend.CUDNN_ATTENTION),
            flops=3.5 * _fwd_flops(b, h, s, d, causal=causal),
            notes="torch has no fp8 SDPA: its side runs bf16 forward+backward; ours: q, k, v, o, do, dP and the "
            "gradients e4m3 (per-tensor scales; dP's and the gradients' set once from the backward's amax)"),
    ]  # fmt: skip


@register
def fp8_rows() -> list[Row]:
    """fp8 e4m3 forward at B4 H16 S4096 D128, causal and not."""
    return [*_fp8_rows(4, 16, 4096, 128, causal=False, tag="e4m3"),
            *_fp8_rows(4, 16, 4096, 128, causal=True, tag="e4m3 causal")]  # fmt: skip


@register
def fp8_train_rows() -> list[Row]:
    """fp8 e4m3 forward+backward at B4 H16 S4096 D128, causal and not."""
    return [*_fp8_train_rows(4, 16, 4096, 128, causal=False, tag="e4m3"),
            *_fp8_train_rows(4, 16, 4096, 128, causal=True, tag="e4m3 causal")]  # fmt: skip


@register
def fp8_long_rows() -> list[Row]:
    """fp8 e4m3 forward at B1 H16 S16384 D128, non-causal."""
    return _fp8_rows(1, 16, 16384, 128, causal=False, tag="e4m3 long")


#: the ragged batch's lengths (B8, summing to 16384, the longest 4096)
RAGGED_LENGTHS = (4096, 512, 3000, 1024, 2048, 777, 3500, 1427)


@register
def ragged_rows() -> list[Row]:
    """A packed causal batch (ragged offsets, padding mask) against torch's padded batch."""
    import numpy as np
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from cudnnkit.graph import Graph

    h, d, lens = 16, 128, RAGGED_LENGTHS
    b, s, t = len(lens), max(lens), sum(lens)
    cu = np.concatenate([[0], np.cumsum(lens)])
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, do = (torch.randn(t, h, d, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(4))
    o, dq, dk, dv = (torch.empty_like(q) for _ in range(4))
    stats = torch.empty(b, h, s, 1, device="cuda", dtype=torch.float32)
    offsets = torch.tensor(cu * h * d, device="cuda", dtype=torch.int64).view(b + 1, 1, 1, 1)  # elements
    lengths = torch.tensor(lens, device="cuda", dtype=torch.int32).view(b, 1, 1, 1)
    dims, strides = (b, h, s, d), (s * h * d, d, h * d, 1)  # the packed (T, H, D) arrays as (B, H, S_max, D)

    def packed(g, name):
        off = g.tensor((b + 1, 1, 1, 1), None, "int64", name=f"{name}_offsets")
        return g.set_ragged_offset(g.tensor(dims, strides, "bfloat16", name=name), off), off

    def forward_plan(with_stats):
        g = Graph(name="attention ragged fwd")
        (tq, oq), (tk, ok), (tv, ov) = (packed(g, n) for n in ("q", "k", "v"))
        lq, lkv = g.tensor_like(lengths), g.tensor_like(lengths)
        oo = g.tensor((b + 1, 1, 1, 1), None, "int64", name="o_offsets")
        r = g.sdpa_forward(tq, tk, tv, causal=True, seq_len_q=lq, seq_len_kv=lkv, stats=with_stats, o_strides=strides,
                           o_ragged_offset=oo)  # fmt: skip
        bind = {tq: q, tk: k, tv: v, oq: offsets, ok: offsets, ov: offsets, oo: offsets, lq: lengths, lkv: lengths,
                g.mark_output(r.o): o}  # fmt: skip
        if with_stats:
            bind[g.mark_output(r.stats)] = stats
        return g.build().bind(bind)

    def backward_plan():
        g = Graph(name="attention ragged bwd")
        ts = {n: packed(g, n) for n in ("q", "k", "v", "o", "do")}
        tst, lq, lkv = g.tensor_like(stats), g.tensor_like(lengths), g.tensor_like(lengths)
        offs = {n: g.tensor((b + 1, 1, 1, 1), None, "int64", name=f"{n}_offsets") for n in ("dq", "dk", "dv")}
        r = g.sdpa_backward(*(ts[n][0] for n in ("q", "k", "v", "o", "do")), tst, causal=True, seq_len_q=lq,
                            seq_len_kv=lkv, dq_ragged_offset=offs["dq"], dk_ragged_offset=offs["dk"],
                            dv_ragged_offset=offs["dv"])  # fmt: skip
        arrays = {"q": q, "k": k, "v": v, "o": o, "do": do}
        bind = {tst: stats, lq: lengths, lkv: lengths, g.mark_output(r.dq): dq, g.mark_output(r.dk): dk,
                g.mark_output(r.dv): dv}  # fmt: skip
        for n, (tt, off) in ts.items():
            bind[tt], bind[off] = arrays[n], offsets
        for off in offs.values():
            bind[off] = offsets
        return g.build().bind(bind)

    infer, train, bwd = or_error(forward_plan, False), or_error(forward_plan, True), or_error(backward_plan)
    try:
        train()
    except Exception:
        pass

    def ours_train():
        train()
        bwd()

    # torch: the padded batch (B, H, S_max, D), causal, no padding mask
    qp, kp, vp, dop = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(4))
    qg, kg, vg = (x.detach().clone().requires_grad_(True) for x in (qp, kp, vp))

    def torch_fwd():
        with torch.no_grad(), sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(qp, kp, vp, is_causal=True)

    def torch_train():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            out = F.scaled_dot_product_attention(qg, kg, vg, is_causal=True)
            return torch.autograd.grad(out, (qg, kg, vg), dop)

    fwd_flops = 4.0 * h * d * sum(n * (n + 1) // 2 for n in lens)  # each sample's causal triangle
    shape = f"B{b} T{t} S_max{s} H{h} D{d}"
    vs = f"vs torch-cudnn padded B{b} S{s}"
    return [
        Row(FAMILY, f"ragged causal fwd {vs}", shape, "bfloat16", ours=infer, torch=torch_fwd, flops=fwd_flops),
        Row(
            FAMILY,
            f"ragged causal fwd+bwd {vs}",
            shape,
            "bfloat16",
            ours=ours_train,
            torch=torch_train,
            flops=3.5 * fwd_flops,
        ),  # fmt: skip
    ]


@register
def paged_decode_rows() -> list[Row]:
    """Decode through shuffled page tables against torch SDPA on the contiguous caches."""
    import torch
    import torch.nn.functional as F

    from cudnnkit.graph import Graph

    b, h, hk, s, d, page = 64, 32, 8, 8192, 128, 64
    blocks = s // page
    gen = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(b, h, 1, d, device="cuda", dtype=torch.bfloat16, generator=gen)
    # the contiguous caches torch reads, and the same values in pages: sample i's block j at table[i, j]
    kc, vc = (torch.randn(b, hk, s, d, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(2))
    perm = torch.randperm(b * blocks, device="cuda", generator=gen)
    table = perm.view(b, blocks).to(torch.int32)

    def paged(c):
        pages = torch.empty(b * blocks, hk, page, d, device="cuda", dtype=torch.bfloat16)
        pages[perm] = c.view(b, hk, blocks, page, d).permute(0, 2, 1, 3, 4).reshape(b * blocks, hk, page, d)
        return pages

    kp, vp = paged(kc), paged(vc)
    o = torch.empty(b, h, 1, d, device="cuda", dtype=torch.bfloat16)
    lq = torch.ones(b, 1, 1, 1, device="cuda", dtype=torch.int32)
    lkv = torch.full((b, 1, 1, 1), s, device="cuda", dtype=torch.int32)
    pt = table.view(b, 1, blocks, 1)

    def plan():
        g = Graph(name="attention paged decode")
        tq, tk, tv = g.tensor_like(q), g.tensor_like(kp), g.tensor_like(vp)
        tpk, tpv, tlq, tlkv = g.tensor_like(pt), g.tensor_like(pt), g.tensor_like(lq), g.tensor_like(lkv)
        r = g.sdpa_forward(tq, tk, tv, page_table_k=tpk, page_table_v=tpv, seq_len_q=tlq, seq_len_kv=tlkv,
                           stats=False)  # fmt: skip
        bind = {tq: q, tk: kp, tv: vp, tpk: pt, tpv: pt, tlq: lq, tlkv: lkv, g.mark_output(r.o): o}
        return g.build().bind(bind)

    def torch_decode():
        with torch.no_grad():
            return F.scaled_dot_product_attention(q, kc, vc, enable_gqa=True)

    kv_bytes = 2 * b * hk * s * d * 2  # K and V, bfloat16: what a decode must read
    return [
        Row(
            FAMILY,
            "paged decode (shuffled pages of 64) vs torch-sdpa contiguous kv",
            f"B{b} H{h} H_kv{hk} S_kv{s} D{d}",
            "bfloat16",
            ours=or_error(plan),
            torch=torch_decode,
            bytes=kv_bytes,
            notes=f"bytes: the K and V read, {kv_bytes / 1e9:.2f} GB; 1.3x the floor is the issue's goal",
        ),  # fmt: skip
    ]


@register
def functional_rows() -> list[Row]:
    """``cudnnkit.nn.scaled_dot_product_attention`` through the L3 op ``attention`` (an additive per-head bias
    ``(1, H, S, S)``, grouped heads H16 H_kv4) against torch's ``F.scaled_dot_product_attention`` with the same
    mask and ``enable_gqa`` (its default backend choice), bf16 B2 S2048 D128, forward (inference) and forward +
    backward (q, k, v and the bias take gradients, cuDNN's dbias); each call through the functional API and the
    custom op's eager path, so its host time counts."""
    import torch
    import torch.nn.functional as F

    from cudnnkit import nn

    b, h, hk, s, d = 2, 16, 4, 2048, 128
    gen = torch.Generator(device="cuda").manual_seed(0)

    def r(*shape):
        return torch.randn(*shape, device="cuda", dtype=torch.bfloat16, generator=gen)

    q, k, v, do = r(b, h, s, d), r(b, hk, s, d), r(b, hk, s, d), r(b, h, s, d)
    bias = r(1, h, s, s)
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v, bias)]

    def fwd(fn):
        def call():
            with torch.no_grad():
                return fn(q, k, v, attn_mask=bias, enable_gqa=True)

        return call

    def train(fn):
        def call():
            o = fn(*leaves[:3], attn_mask=leaves[3], enable_gqa=True)
            return torch.autograd.grad(o, leaves, do)

        return call

    flops = 4.0 * b * h * s * s * d
    shape = f"B{b} H{h} H_kv{hk} S{s} D{d}"
    return [
        Row(
            FAMILY,
            "nn.sdpa bias+GQA fwd",
            shape,
            "bfloat16",
            ours=fwd(nn.scaled_dot_product_attention),
            torch=fwd(F.scaled_dot_product_attention),
            flops=flops,
        ),  # fmt: skip
        Row(
            FAMILY,
            "nn.sdpa bias+GQA fwd+bwd",
            shape,
            "bfloat16",
            ours=train(nn.scaled_dot_product_attention),
            torch=train(F.scaled_dot_product_attention),
            flops=3.5 * flops,
            notes="gradients of q, k, v and the bias (cuDNN's dbias)",
        ),  # fmt: skip
    ]


@register
def dropout_rows() -> list[Row]:
    """``cudnnkit.nn.scaled_dot_product_attention(dropout_p=0.1)`` (the L3 op ``attention``: cuDNN's in-kernel
    dropout, its seed drawn from torch's generator) against torch's ``F.scaled_dot_product_attention`` with the same
    ``dropout_p`` on its cuDNN backend (``sdpa_kernel(SDPBackend.CUDNN_ATTENTION)``), bf16 B4 H16 S4096 D128,
    forward + backward, causal and not; through the functional API and the custom op's eager path."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from cudnnkit import nn

    b, h, s, d, p = 4, 16, 4096, 128, 0.1
    gen = torch.Generator(device="cuda").manual_seed(0)
    leaves = [torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16, generator=gen).requires_grad_()
              for _ in range(3)]  # fmt: skip
    do = torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16, generator=gen)

    def ours(causal):
        def call():
            o = nn.scaled_dot_product_attention(*leaves, dropout_p=p, is_causal=causal)
            return torch.autograd.grad(o, leaves, do)

        return call

    def theirs(causal):
        def call():
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                o = F.scaled_dot_product_attention(*leaves, dropout_p=p, is_causal=causal)
            return torch.autograd.grad(o, leaves, do)

        return call

    return [
        Row(FAMILY, _words("dropout 0.1", "causal" if causal else "", "fwd+bwd vs torch-cudnn"),
            f"B{b} H{h} S{s} D{d}", "bfloat16", ours=ours(causal), torch=theirs(causal),
            flops=3.5 * _fwd_flops(b, h, s, d, causal=causal))
        for causal in (False, True)
    ]  # fmt: skip
