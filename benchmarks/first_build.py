"""Where the first plan build in a process goes: phases, measured in fresh processes.

``python -m benchmarks.first_build [--runs N] [--frontend] [--shape tiny|fused] [--json PATH]``

The package is byte-compiled first (as an install does). Each run is a new Python process that first imports torch and creates its CUDA
context (neither counted), then builds and runs one tiny conv graph (1x8x8x8
fp16 NHWC, 3x3, k8; ``--shape fused`` adds bias + ReLU) and reports, in ms:

* ``import``: ``import cudnnkit`` (and ``cudnnkit.graph``);
* ``load``: loading libcudnn (``lib.load()``; the dlopen of ``libcudnn.so.9``);
* ``handle``: ``cudnnCreate`` + ``cudnnSetStream`` (:func:`runtime.handle.get_handle`);
* ``graph``: building the Python :class:`Graph` (no cuDNN call);
* ``lower``: tensor, operation and operation-graph descriptors finalized;
* ``heuristics``: the ``ENGINEHEUR`` descriptor finalized and its engine
  configs read (per mode, with the count);
* ``engine_info``: reading each config's engine notes;
* ``finalize``: ``cudnnBackendFinalize`` of each execution plan tried (this is
  where cuDNN loads an engine sub-library, or compiles a runtime-compiled
  kernel), with the engines tried;
* ``execute``: the first execute, synchronized (kernel module load);
* ``second``: a second execute, synchronized.

With ``--frontend`` each run also builds the same graph with NVIDIA's
cudnn-frontend (``import cudnn``) in its own fresh process, phase by phase:
``import``, ``handle``, ``graph``, ``validate``, ``build_operation_graph``,
``create_execution_plans`` (heuristics A + FALLBACK), ``check_support``,
``build_plans``, ``execute``. The table gives the median and range per phase.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from collections import defaultdict

_TOTAL_OURS = ("import", "load", "handle", "graph", "lower", "heuristics", "engine_info", "finalize", "execute")


def _child_ours(shape: str) -> dict:
    import torch

    torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    t: dict = defaultdict(float)
    extra: dict = {"engines": [], "heuristics": []}

    t0 = time.perf_counter()
    import cudnnkit  # noqa: F401
    from cudnnkit import lib
    from cudnnkit.graph import Graph
    from cudnnkit.graph.plan import engines, search

    t["import"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    lib.load()
    t["load"] = time.perf_counter() - t0

    def timed(mod, name, phase, note=None):
        fn = getattr(mod, name)

        def wrapper(*a, **k):
            s = time.perf_counter()
            try:
                out = fn(*a, **k)
            finally:
                t[phase] += time.perf_counter() - s
            if note:
                note(a, out)
            return out

        setattr(mod, name, wrapper)

    timed(search, "get_handle", "handle")
    timed(engines, "_heuristics", "heuristics", lambda a, out: extra["heuristics"].append((a[1], out[1])))
    timed(engines, "engine_info", "engine_info")
    timed(search, "_finalize_plan", "finalize")
    tried = []
    ei = engines.engine_info

    def info_note(cfg):
        info = ei(cfg)
        tried.append(info.name)
        return info

    engines.engine_info = info_note

    x = torch.randn(1, 8, 8, 8, device="cuda", dtype=torch.float16).to(memory_format=torch.channels_last)
    w = torch.randn(8, 8, 3, 3, device="cuda", dtype=torch.float16).to(memory_format=torch.channels_last)
    b = torch.randn(1, 8, 1, 1, device="cuda", dtype=torch.float16)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    g = Graph(name="first_build")
    tx, tw = g.tensor_like(x, "x"), g.tensor_like(w, "w")
    y = g.conv_fprop(tx, tw, pre_padding=1)
    binds = {tx: x, tw: w}
    if shape == "fused":
        tb = g.tensor_like(b, "b")
        y = g.pointwise("RELU_FWD", g.pointwise("ADD", y, tb))
        binds[tb] = b
    ty = g.mark_output(y, "float16")
    out = torch.empty_strided(ty.dims, ty.strides, dtype=torch.float16, device="cuda")
    binds[ty] = out
    t["graph"] = time.perf_counter() - t0
    lower = type(g).lower

    def lower_timed(self, *a, **k):
        s = time.perf_counter()
        try:
            return lower(self, *a, **k)
        finally:
            t["lower"] += time.perf_counter() - s

    type(g).lower = lower_timed
    t0 = time.perf_counter()
    plan = g.build()
    build = time.perf_counter() - t0
    t0 = time.perf_counter()
    plan.execute(binds)
    torch.cuda.synchronize()
    t["execute"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    plan.execute(binds)
    torch.cuda.synchronize()
    t["second"] = time.perf_counter() - t0
    ms = {k: v * 1e3 for k, v in t.items()}
    ms["build (g.build total)"] = build * 1e3
    ms["total"] = sum(ms[k] for k in _TOTAL_OURS)
    extra["engines"] = tried
    extra["plan"] = plan.name
    return {"ms": ms, **extra}


def _child_frontend(shape: str) -> dict:
    import torch

    torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    t: dict = {}
    t0 = time.perf_counter()
    import cudnn

    t["import"] = time.perf_counter() - t0
    x = torch.randn(1, 8, 8, 8, device="cuda", dtype=torch.float16).to(memory_format=torch.channels_last)
    w = torch.randn(8, 8, 3, 3, device="cuda", dtype=torch.float16).to(memory_format=torch.channels_last)
    b = torch.randn(1, 8, 1, 1, device="cuda", dtype=torch.float16)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    handle = cudnn.create_handle()
    cudnn.set_stream(handle=handle, stream=torch.cuda.current_stream().cuda_stream)
    t["handle"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    g = cudnn.pygraph(
        io_data_type=cudnn.data_type.HALF,
        intermediate_data_type=cudnn.data_type.FLOAT,
        compute_data_type=cudnn.data_type.FLOAT,
        handle=handle,
    )
    tx, tw = g.tensor_like(x), g.tensor_like(w)
    y = g.conv_fprop(image=tx, weight=tw, padding=[1, 1], stride=[1, 1], dilation=[1, 1])
    binds = {tx: x, tw: w}
    if shape == "fused":
        tb = g.tensor_like(b)
        y = g.relu(input=g.add(a=y, b=tb))
        binds[tb] = b
    y.set_output(True).set_data_type(cudnn.data_type.HALF)
    t["graph"] = time.perf_counter() - t0
    for phase, call in (
        ("validate", lambda: g.validate()),
        ("build_operation_graph", lambda: g.build_operation_graph()),
        ("create_execution_plans", lambda: g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])),
        ("check_support", lambda: g.check_support()),
        ("build_plans", lambda: g.build_plans()),
    ):
        t0 = time.perf_counter()
        call()
        t[phase] = time.perf_counter() - t0
    out = torch.empty(1, 8, 8, 8, device="cuda", dtype=torch.float16).to(memory_format=torch.channels_last)
    binds[y] = out
    ws = torch.empty(max(g.get_workspace_size(), 1), device="cuda", dtype=torch.uint8)
    t0 = time.perf_counter()
    g.execute(binds, ws, handle=handle)
    torch.cuda.synchronize()
    t["execute"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    g.execute(binds, ws, handle=handle)
    torch.cuda.synchronize()
    t["second"] = time.perf_counter() - t0
    ms = {k: v * 1e3 for k, v in t.items()}
    ms["total"] = sum(v for k, v in ms.items() if k != "second")
    return {"ms": ms, "cudnn_version": cudnn.backend_version()}


def _spawn(which: str, shape: str) -> dict:
    code = f"import json, benchmarks.first_build as m; print('RESULT', json.dumps(m._child_{which}({shape!r})))"
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    for line in p.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise RuntimeError(f"{which} child failed (rc {p.returncode}):\n{p.stderr[-3000:]}")


def _table(name: str, runs: list[dict]) -> str:
    phases = list(runs[0]["ms"])
    lines = [f"{name} ({len(runs)} fresh processes): ms, median [min - max]"]
    for ph in phases:
        vals = sorted(r["ms"].get(ph, 0.0) for r in runs)
        lines.append(f"  {ph:24s} {statistics.median(vals):8.1f}  [{vals[0]:.1f} - {vals[-1]:.1f}]")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--shape", choices=("tiny", "fused"), default="tiny")
    p.add_argument("--frontend", action="store_true", help="also measure cudnn-frontend (import cudnn)")
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    # byte-compile the package first, as an install does: a source tree run with PYTHONDONTWRITEBYTECODE would
    # otherwise compile every module in every fresh process (about 100 ms of "import")
    import compileall
    from pathlib import Path

    import cudnnkit

    compileall.compile_dir(str(Path(cudnnkit.__file__).parent), quiet=1)
    result: dict = {"shape": a.shape, "ours": [], "frontend": []}
    for _ in range(a.runs):
        result["ours"].append(_spawn("ours", a.shape))
        if a.frontend:
            result["frontend"].append(_spawn("frontend", a.shape))
    print(_table(f"cudnnkit, {a.shape} conv", result["ours"]))
    first = result["ours"][0]
    print(f"  plan {first['plan']}; engines tried {first['engines']}; heuristics (mode, configs) {first['heuristics']}")
    if result["frontend"]:
        print(_table(f"cudnn-frontend {result['frontend'][0]['cudnn_version']}, {a.shape} conv", result["frontend"]))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
