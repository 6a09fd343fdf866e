"""Data-parallel training with ``torch.nn.parallel.DistributedDataParallel`` over cudnnkit modules (issue 16), and
the single-process run it is compared with. tests/gpu/test_two_gpus_training.py runs it; by hand, from the
repository root (``src`` for cudnnkit, the root for ``benchmarks``)::

    # the reference: one process on cuda:0, the whole global batch (--slices 2: as two ranks see it, see below)
    PYTHONPATH=src:. python tests/gpu/two_gpus/ddp_train.py --model cnn --slices 2 --out ref.json
    # DDP over two GPUs: one process per GPU (rank r on cuda:r), NCCL
    PYTHONPATH=src:. python -m torch.distributed.run --standalone --nproc_per_node=2 \\
        tests/gpu/two_gpus/ddp_train.py --model cnn --out ddp.json
    # a dry run of this script's logic on one GPU: both ranks on cuda:0, gloo (proves nothing about two GPUs)
    PYTHONPATH=src:. python -m torch.distributed.run --standalone --nproc_per_node=2 \\
        tests/gpu/two_gpus/ddp_train.py --model cnn --out ddp.json --same-device --backend gloo

Models, built from seed 0 on every rank (identical weights everywhere), moved to the device and converted with
``cudnnkit.torch.convert``:

* ``cnn``: benchmarks/rows_l3.py's small CNN (conv3x3 3->32, batch norm, ReLU, max pool, conv3x3 32->64, batch
  norm, ReLU, adaptive average pool, linear 10; convert swaps 7 modules: the convolutions, batch norms, ReLUs and
  the max pool), channels-last float32, on a global batch of 64 3x32x32 images; cross-entropy. A learnable task:
  each image is unit noise plus a fixed colour of its class (one of 10).
* ``lstm``: a 2-layer LSTM (input 32, hidden 64; ``cudnnkit.torch.nn.LSTM`` after convert) and a linear head to 8
  outputs, over 16 steps of a global batch of 32 sequences (seq-major ``(T, N, I)``); MSE against
  ``tanh((x_t + x_{t-1}) @ A)`` for a fixed ``A``.

Data: step ``s``'s global batch is drawn on the CPU from a generator seeded with ``1000 + s``, the same on every rank;
rank ``r`` of ``W`` takes slice ``r`` of ``W`` equal slices along the batch dimension. The global batch (64 images,
32 sequences) must be divisible by ``W`` (checked: 1, 2, 4, 8... ranks). SGD with a fixed learning rate (0.05 for the
CNN, 2.0 for the LSTM) and momentum 0.9; 20 steps by default (the CNN's loss falls from about 2.4 to 0.3, the LSTM's
from 0.51 to 0.27, in a CPU run of the same script with torch's modules).

**What DDP computes.** Each rank's loss is the mean over its slice and DDP averages the gradients over the ranks: with
equal slices the update follows the gradient of the mean of the slice means, which is the mean over the global batch
(cross-entropy and MSE are means over the samples). The loss logged per step is that mean, all-reduced (the sum over
the ranks divided by ``W``).

**Batch norm** (the CNN; no ``SyncBatchNorm``): each rank normalizes its slice by the slice's own statistics, not the
global batch's, so one process running the whole batch at once would train a different model. The reference
therefore emulates the ranks: ``--slices K`` runs the global batch as K slices through the model one after another
(each normalized by its own statistics, as a rank's is) and backpropagates the mean of their losses: the same loss
and the same gradient as DDP over K ranks, the sum over the slices taken in one process instead of by the all-reduce.
The running statistics differ (DDP keeps rank 0's, broadcast before each forward; the reference updates them K times
a step) but never enter a training-mode loss. The LSTM has no batch-coupled layer: its reference runs the whole batch
at once (``--slices 1``, the default), the plain single-GPU run of the same global batch.

Numerics: float32 with TF32 off (torch's flags and ``cudnnkit.settings(allow_tf32=False)``) and deterministic cuDNN
engines (``cudnnkit.settings(deterministic=True)``). The emulating reference does the DDP run's arithmetic: the same
kernels on the same slice shapes, and the mean of the losses scales each slice's gradient by 1/K before they are
summed, which for K = 2 (a power of two: exact in floating point) gives the bits of DDP's average of the ranks'
gradients; a CPU run of this script (``--cpu``) with one thread in every process gives the same bits in both. So the
two differ only where a kernel sums in another order, as the whole-batch LSTM reference does (cuDNN's kernels reduce
over a batch of 32 where each rank's reduce over 16). The tolerances of tests/gpu/test_two_gpus_training.py allow
for that drift, which grows over the steps.

Without torchrun's environment (``WORLD_SIZE`` unset) the script is the reference: one process on cuda:0, the whole
global batch. ``--same-device`` puts every rank on cuda:0 (NCCL refuses two ranks on one GPU: use ``--backend
gloo``); without it rank ``r`` runs on ``cuda:LOCAL_RANK``, which needs as many GPUs as ranks. ``--cpu`` runs torch's
own modules on the CPU with gloo, without cudnnkit: a check of the slicing, the DDP wrapping and the emulation on a
machine with no GPU. Rank 0 writes ``--out``, a JSON object: the per-step losses, the world size, the slices, the
backend, each rank's device (index, name, UUID) and the modules convert swapped. NCCL's environment is left as the
machine sets it: nothing here sets ``NCCL_NVLS_ENABLE`` (NVLink multicast stays off where the machine turns it off);
the JSON records the value the process started with.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import functools
import gc
import json
import os
import sys
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[3]
MODEL_SEED = 0
DATA_SEED = 1000
LR = {"cnn": 0.05, "lstm": 2.0}
MOMENTUM = 0.9
CNN_BATCH, CNN_CLASSES, CNN_SIZE = 64, 10, 32
LSTM_T, LSTM_BATCH, LSTM_IN, LSTM_HIDDEN, LSTM_OUT = 16, 32, 32, 64, 8
#: the batch dimension of each model's inputs and targets
BATCH_DIM = {"cnn": 0, "lstm": 1}


class LSTMRegressor(torch.nn.Module):
    """A 2-layer LSTM (seq-major) and a linear head on each step's output."""

    def __init__(self) -> None:
        super().__init__()
        self.lstm = torch.nn.LSTM(LSTM_IN, LSTM_HIDDEN, num_layers=2)
        self.head = torch.nn.Linear(LSTM_HIDDEN, LSTM_OUT)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.lstm(x)[0])


def build_model(name: str, device: torch.device, use_cudnnkit: bool) -> tuple[torch.nn.Module, list[str]]:
    """Model ``name`` from seed :data:`MODEL_SEED` on ``device`` (the CNN channels-last), converted with
    ``cudnnkit.torch.convert`` when ``use_cudnnkit``; and the modules convert swapped (``"name: Twin"``)."""
    torch.manual_seed(MODEL_SEED)
    if name == "cnn":
        from benchmarks.rows_l3 import _small_cnn

        model = _small_cnn(torch).to(device).to(memory_format=torch.channels_last)
    else:
        model = LSTMRegressor().to(device)
    if not use_cudnnkit:
        return model, []
    import cudnnkit.torch as ckt

    report = ckt.convert(model)
    return report.model, [f"{n}: {twin.__name__}" for n, _, twin in report.replaced]


@functools.cache
def _fixed(name: str) -> torch.Tensor:
    """The task's fixed part: each class's colour, ``(classes, 3, 1, 1)`` (CNN); the matrix ``A`` (LSTM)."""
    g = torch.Generator().manual_seed(DATA_SEED - 1)
    if name == "cnn":
        return torch.randn(CNN_CLASSES, 3, 1, 1, generator=g)
    return torch.randn(LSTM_IN, LSTM_OUT, generator=g) / LSTM_IN**0.5


def global_batch(name: str, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Step ``step``'s whole global batch ``(inputs, targets)``, on the CPU, the same in every process."""
    g = torch.Generator().manual_seed(DATA_SEED + step)
    if name == "cnn":
        y = torch.randint(0, CNN_CLASSES, (CNN_BATCH,), generator=g)
        return torch.randn(CNN_BATCH, 3, CNN_SIZE, CNN_SIZE, generator=g) + _fixed(name)[y], y
    x = torch.randn(LSTM_T, LSTM_BATCH, LSTM_IN, generator=g)
    prev = torch.cat([torch.zeros_like(x[:1]), x[:-1]])
    return x, torch.tanh((x + prev) @ _fixed(name))


def split(name: str, batch: tuple[torch.Tensor, torch.Tensor], k: int,
          device: torch.device) -> list[tuple[torch.Tensor, torch.Tensor]]:  # fmt: skip
    """``batch`` as ``k`` equal slices along the batch dimension, each on ``device`` (the CNN's images
    channels-last); ``ValueError`` when the batch does not divide by ``k``."""
    x, y = batch
    dim = BATCH_DIM[name]
    if x.shape[dim] % k:
        raise ValueError(f"the global batch of {x.shape[dim]} does not divide into {k} equal slices")
    fmt = torch.channels_last if name == "cnn" else torch.contiguous_format
    return [(xs.to(device).contiguous(memory_format=fmt), ys.to(device).contiguous())
            for xs, ys in zip(x.chunk(k, dim), y.chunk(k, dim))]  # fmt: skip


def loss_fn(name: str, out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    f = torch.nn.functional
    return f.cross_entropy(out, target) if name == "cnn" else f.mse_loss(out, target)


def _describe(device: torch.device) -> dict[str, Any]:
    if device.type != "cuda":
        return {"device": str(device)}
    props = torch.cuda.get_device_properties(device)
    return {"device": str(device), "name": props.name, "uuid": str(getattr(props, "uuid", ""))}


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", choices=("cnn", "lstm"), required=True)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--out", required=True, help="the JSON file rank 0 writes")
    p.add_argument("--backend", choices=("nccl", "gloo"), default=None,
                   help="process group backend under torchrun (default: nccl; gloo with --cpu)")  # fmt: skip
    p.add_argument("--same-device", action="store_true", help="every rank on cuda:0 (a one-GPU dry run; gloo)")
    p.add_argument("--slices", type=int, default=None,
                   help="reference only: run the global batch as this many slices (per-slice batch norm, as that "
                        "many ranks compute it); default 1")  # fmt: skip
    p.add_argument("--cpu", action="store_true", help="torch's own modules on the CPU (gloo), no cudnnkit")
    return p.parse_args(argv)


def run(args: argparse.Namespace) -> dict[str, Any] | None:
    """Train as ``args`` say; rank 0's result (None on the other ranks)."""
    import torch.distributed as dist

    distributed = "WORLD_SIZE" in os.environ  # set by torchrun
    nvls = os.environ.get("NCCL_NVLS_ENABLE")  # as this process got it (read, never set)
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    backend = args.backend or ("gloo" if args.cpu else "nccl")
    if distributed and args.slices is not None:
        raise SystemExit("--slices is for the single-process reference; under torchrun each rank runs its own slice")
    if args.cpu:
        device = torch.device("cpu")
    else:
        if not torch.cuda.is_available():
            raise SystemExit("no CUDA device visible to torch (--cpu runs torch's modules on the CPU)")
        index = int(os.environ.get("LOCAL_RANK", "0")) if distributed and not args.same_device else 0
        if index >= torch.cuda.device_count():
            raise SystemExit(f"rank {rank} runs on cuda:{index} but torch sees {torch.cuda.device_count()} CUDA "
                             "device(s): --same-device puts every rank on cuda:0 (with --backend gloo)")  # fmt: skip
        if distributed and world > 1 and args.same_device and backend == "nccl":
            raise SystemExit("--same-device with NCCL: NCCL refuses two ranks on one GPU; use --backend gloo")
        torch.cuda.set_device(index)
        device = torch.device("cuda", index)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.deterministic = True

    if args.cpu:
        numerics: Any = contextlib.nullcontext()
    else:
        import cudnnkit

        # this thread's settings; each op's backward runs under its forward's (carried on autograd's thread)
        numerics = cudnnkit.settings(allow_tf32=False, deterministic=True)
    if distributed:
        dist.init_process_group(backend, timeout=datetime.timedelta(seconds=300))
    net: torch.nn.Module | None = None
    try:
        model, replaced = build_model(args.model, device, use_cudnnkit=not args.cpu)
        if distributed:
            net = torch.nn.parallel.DistributedDataParallel(model, device_ids=None if args.cpu else [device.index])
            k, mine = world, [rank]
        else:
            net = model
            k = args.slices or 1
            mine = list(range(k))
        opt = torch.optim.SGD(net.parameters(), lr=LR[args.model], momentum=MOMENTUM)
        losses = []
        with numerics:
            for step in range(args.steps):
                parts = split(args.model, global_batch(args.model, step), k, device)
                opt.zero_grad(set_to_none=True)
                per = [loss_fn(args.model, net(parts[i][0]), parts[i][1]) for i in mine]
                loss = per[0] if len(per) == 1 else torch.stack(per).mean()
                loss.backward()
                opt.step()
                value = loss.detach().clone()
                if distributed:
                    dist.all_reduce(value)  # the sum over the ranks (gloo has no AVG)
                    value /= world
                losses.append(value.item())
        devices = [_describe(device)]
        if distributed:
            devices = [None] * world
            dist.all_gather_object(devices, _describe(device))
    finally:
        if distributed:
            # the DDP module (its reducer) goes first: destroying the group under a live reducer aborted a gloo
            # process at exit now and then ("terminate called without an active exception", torch 2.13, CPU)
            del net
            gc.collect()
            dist.destroy_process_group()
    if rank != 0:
        return None
    return {
        "model": args.model,
        "mode": "ddp" if distributed else "reference",
        "world_size": world if distributed else 1,
        "slices": k,
        "backend": backend if distributed else None,
        "same_device": bool(args.same_device),
        "devices": devices,
        "replaced": replaced,
        "steps": args.steps,
        "lr": LR[args.model],
        "momentum": MOMENTUM,
        "global_batch": CNN_BATCH if args.model == "cnn" else LSTM_BATCH,
        "losses": losses,
        "torch": torch.__version__,
        "nccl_nvls_enable": nvls,
    }


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    result = run(args)
    if result is not None:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=1) + "\n")
        print(f"{result['mode']} {args.model}: world size {result['world_size']}, {result['slices']} slice(s), "
              f"loss {result['losses'][0]:.4f} -> {result['losses'][-1]:.4f}")  # fmt: skip
    return 0


if __name__ == "__main__":
    if str(ROOT) not in sys.path:
        sys.path.append(str(ROOT))  # benchmarks/ (the CNN's definition) when run as a script without PYTHONPATH
    sys.exit(main())
