"""CTC loss rows: ``cudnnkit.ops.ctc.ctc_loss`` (one ``cudnnCTCLoss_v8`` call: costs and gradients) against
``torch.nn.functional.ctc_loss`` forward and backward.

Shapes: T=200 time steps, N=64 samples, alphabet A=64 and A=1000, label
lengths 40 to 60 (about 50), input lengths 150 to 200, float32 logits.

* ours: ``ctc_loss(x, labels, label_lengths, input_lengths, costs_out=, grads_out=)``
  on logits (cuDNN applies the softmax itself). Labels and lengths are host
  NumPy int32 arrays (the recommended form: validated on the host, copied to
  the device in one buffer per call), or, in the ``device labels`` rows, int32
  device tensors (validated after a device-to-host copy, which synchronizes).
* torch: ``log_softmax`` then ``F.ctc_loss(..., reduction="sum")`` and
  ``torch.autograd.grad`` of that sum with respect to the logits: the same
  work (the gradient of the summed costs is the per-sample gradients that ours
  returns). Targets are a CUDA long tensor and lengths host tuples, which is
  what torch users pass; with CUDA targets torch runs its native kernels, not
  its cuDNN path.

Both sides copy lengths between host and device inside the timed call, and
each such copy waits for the stream, so GPU times include that wait. ``bytes``
is a floor (read x, write the gradient), for the %copy-bandwidth column.
A tiny row (T=8, N=1, A=4) shows the host overhead per call.
"""

from __future__ import annotations

from .harness import Row, register

FAMILY = "ctc"
T, N = 200, 64
ALPHABETS = (64, 1000)


def _batch(rng, t: int, n: int, a: int, lo: int, hi: int, tmin: int):
    import numpy as np

    ll = rng.integers(lo, hi + 1, size=n).astype(np.int32)
    labels = rng.integers(1, a, size=int(ll.sum())).astype(np.int32)
    il = rng.integers(tmin, t + 1, size=n).astype(np.int32)
    return labels, ll, il


@register
def ctc_rows() -> list[Row]:
    import numpy as np
    import torch

    from cudnnkit.ops.ctc import ctc_loss

    rng = np.random.default_rng(0)
    rows: list[Row] = []
    shapes = [(T, N, a, 40, 60, 150) for a in ALPHABETS] + [(8, 1, 4, 2, 2, 8)]
    for t, n, a, lo, hi, tmin in shapes:
        labels, ll, il = _batch(rng, t, n, a, lo, hi, tmin)
        x = torch.randn(t, n, a, device="cuda")
        costs, grads = torch.empty(n, device="cuda"), torch.empty(t, n, a, device="cuda")
        dev = [torch.from_numpy(v).cuda() for v in (labels, ll, il)]
        targets = torch.from_numpy(labels).long().cuda()
        tl, tin = tuple(int(v) for v in ll), tuple(int(v) for v in il)
        xt = x.detach().clone().requires_grad_()

        def ours(x=x, lab=labels, ll=ll, il=il, c=costs, g=grads):
            ctc_loss(x, lab, ll, il, costs_out=c, grads_out=g)

        def ours_dev(x=x, d=dev, c=costs, g=grads):
            ctc_loss(x, d[0], d[1], d[2], costs_out=c, grads_out=g)

        def torch_fn(xt=xt, tg=targets, tin=tin, tl=tl):
            loss = torch.nn.functional.ctc_loss(torch.log_softmax(xt, 2), tg, tin, tl, blank=0, reduction="sum")
            return torch.autograd.grad(loss, xt)

        shape = f"T{t} N{n} A{a} L{lo}-{hi}"
        nbytes = 2 * t * n * a * 4
        rows.append(Row(FAMILY, "ctc fwd+bwd", shape, "float32", ours=ours, torch=torch_fn, bytes=nbytes))
        if t == T:
            rows.append(
                Row(
                    FAMILY,
                    "ctc fwd+bwd, device labels",
                    shape,
                    "float32",
                    ours=ours_dev,
                    torch=torch_fn,
                    bytes=nbytes,
                    notes="labels and lengths read back to the host for validation",
                )
            )
    return rows
