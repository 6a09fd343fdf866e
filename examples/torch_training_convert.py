"""A torch training loop on cuDNN through ``cudnnkit.torch.convert``: a small CNN written with torch.nn modules is
converted in place (its Conv2d, BatchNorm2d, ReLU and MaxPool2d become cudnnkit's twins, weights kept), then trained
with torch's own optimizer and loss on a synthetic task until the loss has fallen.

Run on a machine with a CUDA GPU and PyTorch: ``python examples/torch_training_convert.py``.
"""

from __future__ import annotations

import torch

import cudnnkit.torch as ct


def main() -> None:
    torch.manual_seed(0)
    dev = "cuda"
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 3, padding=1),
        torch.nn.BatchNorm2d(16),
        torch.nn.ReLU(),
        torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(16, 32, 3, padding=1),
        torch.nn.BatchNorm2d(32),
        torch.nn.ReLU(),
        torch.nn.MaxPool2d(2),
        torch.nn.Flatten(),
        torch.nn.Linear(32 * 4 * 4, 4),
    ).to(dev)
    report = ct.convert(model)
    swapped = [name for name, _, _ in report.replaced]
    kept = [(name, why) for name, _, why in report.left]
    assert len(swapped) == 8, report.replaced  # two each of Conv2d, BatchNorm2d, ReLU, MaxPool2d
    print(f"converted {len(swapped)} modules; kept {kept}")

    # synthetic task: the class is the quadrant of the image holding a bright square
    def batch(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.randn(n, 3, 16, 16, device=dev) * 0.3
        y = torch.randint(0, 4, (n,), device=dev)
        for i in range(n):
            r, c = divmod(int(y[i]), 2)
            x[i, :, r * 8 + 2 : r * 8 + 6, c * 8 + 2 : c * 8 + 6] += 2.0
        return x, y

    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    losses = []
    for _ in range(60):
        x, y = batch(64)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss))
    model.eval()
    with torch.no_grad():
        x, y = batch(256)
        acc = float((model(x).argmax(dim=1) == y).float().mean())
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    assert last < 0.5 * first, losses
    assert acc > 0.9, acc
    print(f"loss {first:.3f} -> {last:.3f}; eval accuracy {acc:.3f}")


if __name__ == "__main__":
    main()
