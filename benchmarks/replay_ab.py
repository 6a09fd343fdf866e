"""``python -m benchmarks.replay_ab``: the small CNN's eager training step with replayed calls on and off, beside
torch's, interleaved in one process (GPU).

The model, data and step are ``rows_l3``'s (``convert`` of the small CNN, 64x3x32x32 channels-last, cross-entropy,
SGD with momentum), float32 and bfloat16, with and without ``convert(fuse=True)``. Each round times ``--steps``
steps of ours with :func:`cudnnkit.ops._replay.enabled` on, then off (after a few warm-up steps each, which record
the traces again), then torch's; the medians over ``--rounds`` rounds are printed with their ratios to torch's.
Interleaving matters: the pool's hosts move torch's own step by 20 % between processes and over minutes, so only a
side-by-side A/B says what replaying is worth (``benchmarks/NOTES.md``, twenty-fifth session).
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.replay_ab", description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=200, help="steps per timed block")
    a = ap.parse_args(argv)

    import torch
    import torch.nn.functional as F

    from cudnnkit.ops import _replay

    from .rows_l3 import _converted, _small_cnn, _train_step

    torch.backends.cudnn.benchmark = True
    try:
        for dtype in (torch.float32, torch.bfloat16):
            for fuse in (False, True):
                torch.manual_seed(0)
                model = _small_cnn(torch).to("cuda", dtype).to(memory_format=torch.channels_last)
                x = torch.randn(64, 3, 32, 32, device="cuda", dtype=dtype).contiguous(memory_format=torch.channels_last)
                y = torch.randint(0, 10, (64,), device="cuda")
                base = copy.deepcopy(model)
                ours, _ = _converted(base, fuse=fuse)
                steps = {
                    "ours": _train_step(ours, torch.optim.SGD(ours.parameters(), lr=0.01, momentum=0.9),
                                        F.cross_entropy, x, y),
                    "torch": _train_step(base, torch.optim.SGD(base.parameters(), lr=0.01, momentum=0.9),
                                         F.cross_entropy, x, y),
                }  # fmt: skip
                for _ in range(20):
                    steps["ours"]()
                    steps["torch"]()
                got: dict[str, list[float]] = {"on": [], "off": [], "torch": []}
                for _ in range(a.rounds):
                    for k in got:
                        step = steps["torch" if k == "torch" else "ours"]
                        if k != "torch":
                            _replay.enabled(k == "on")
                            for _ in range(5):
                                step()
                        torch.cuda.synchronize()
                        t0 = time.perf_counter()
                        for _ in range(a.steps):
                            step()
                        torch.cuda.synchronize()
                        got[k].append((time.perf_counter() - t0) / a.steps * 1e6)
                med = {k: statistics.median(v) for k, v in got.items()}
                name = f"{str(dtype).removeprefix('torch.')}{', convert(fuse=True)' if fuse else ''}"
                print(f"{name:32s} µs/step: replay on {med['on']:7.0f}  off {med['off']:7.0f}  torch {med['torch']:7.0f}"
                      f"  ratio on {med['on'] / med['torch']:.2f}  off {med['off'] / med['torch']:.2f}",
                      flush=True)  # fmt: skip
    finally:
        _replay.enabled(True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
