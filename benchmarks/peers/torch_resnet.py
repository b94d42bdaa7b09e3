"""Peer reference: one training step of a ResNet-20-style network in PyTorch, timed.

The twin of ``benchmarks/model_step.py --model resnet`` (mpcore): input (N, S, S, 1) images
(S = --size, 32 by default: MNIST padded), a 3x3 conv stem, 3 stages of ``--blocks`` residual
blocks (conv3x3-BN-relu-conv3x3-BN + shortcut, relu; the first block of stages 2 and 3 strides
by 2 and projects its shortcut with a 1x1 conv + BN), global average pooling, Dense 10; widths
``--width`` x (16, 32, 64). Convs carry no bias (BN follows). SGD with momentum 0.9 (or Adam),
softmax cross-entropy in float32, random data.

What mpcore computes, computed the same way: the tensors are channels last (NHWC memory,
``torch.channels_last``); "same" padding follows TensorFlow/Keras, which puts the odd pad of a
strided conv at the bottom/right (PyTorch's ``padding=1`` would pad both sides and shift every
window), so strided convs pad explicitly; BatchNormalization has Keras' epsilon 1e-3 and
momentum 0.99 (PyTorch's momentum 0.01); kernels are Glorot-uniform as Keras'.

    python benchmarks/peers/torch_resnet.py --policy mixed_bfloat16 --batch 128 --threads 1

Policies: float32 -> fp32; mixed_float16 -> autocast(float16) + GradScaler; mixed_bfloat16 ->
autocast(bfloat16). Prints one JSON line. Needs torch (its own venv; never mpcore's).
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F  # noqa: N812 - PyTorch's own spelling
from amp_step import POLICIES, time_steps
from torch import nn


def same_pads(size: int, window: int, stride: int) -> tuple[int, int]:
    """TensorFlow's "same" padding along one axis: (before, after), the odd one after."""
    out = -(-size // stride)
    total = max((out - 1) * stride + window - size, 0)
    return total // 2, total - total // 2


class Conv(nn.Module):
    """Conv2D(filters, k, strides, padding="same", use_bias=False) as Keras computes it."""

    def __init__(self, cin: int, cout: int, k: int, stride: int) -> None:
        super().__init__()
        self.k, self.stride = k, stride
        self.conv = nn.Conv2d(cin, cout, k, stride=stride, padding=0, bias=False)
        nn.init.xavier_uniform_(self.conv.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        top, bottom = same_pads(x.shape[2], self.k, self.stride)
        left, right = same_pads(x.shape[3], self.k, self.stride)
        if top or bottom or left or right:
            x = F.pad(x, (left, right, top, bottom))
        return self.conv(x)


def bn(channels: int) -> nn.BatchNorm2d:
    return nn.BatchNorm2d(channels, eps=1e-3, momentum=0.01)


class Block(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1, self.bn1 = Conv(cin, cout, 3, stride), bn(cout)
        self.conv2, self.bn2 = Conv(cout, cout, 3, 1), bn(cout)
        self.project = (nn.Sequential(Conv(cin, cout, 1, stride), bn(cout))
                        if stride != 1 or cin != cout else None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.bn1(self.conv1(x)))
        h = self.bn2(self.conv2(h))
        shortcut = self.project(x) if self.project is not None else x
        return F.relu(h + shortcut)


class ResNet(nn.Module):
    def __init__(self, width: int = 1, blocks: int = 3, classes: int = 10) -> None:
        super().__init__()
        widths = [16 * width, 32 * width, 64 * width]
        self.stem, self.stem_bn = Conv(1, widths[0], 3, 1), bn(widths[0])
        layers: list[nn.Module] = []
        cin = widths[0]
        for stage, cout in enumerate(widths):
            for b in range(blocks):
                layers.append(Block(cin, cout, 2 if stage > 0 and b == 0 else 1))
                cin = cout
        self.blocks = nn.Sequential(*layers)
        self.head = nn.Linear(cin, classes)
        nn.init.xavier_uniform_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.stem_bn(self.stem(x)))
        h = self.blocks(h)
        return self.head(h.mean(dim=(2, 3)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--policy", default="float32", choices=POLICIES)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--size", type=int, default=32, help="image side (32: MNIST padded)")
    ap.add_argument("--width", type=int, default=1, help="channel multiplier of 16/32/64")
    ap.add_argument("--blocks", type=int, default=3,
                    help="residual blocks per stage (3: ResNet-20)")
    ap.add_argument("--optimizer", choices=("sgd", "adam"), default="sgd")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)

    torch.manual_seed(0)
    dev = torch.device(a.device)
    model = ResNet(a.width, a.blocks).to(dev).to(memory_format=torch.channels_last)
    opt = (torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9) if a.optimizer == "sgd"
           else torch.optim.Adam(model.parameters(), lr=1e-3, eps=1e-7))
    # NHWC data viewed as NCHW with channels-last strides: the same memory as mpcore's input
    x = torch.rand(a.batch, a.size, a.size, 1, device=dev).permute(0, 3, 1, 2)
    y = torch.randint(0, 10, (a.batch,), device=dev)
    dt, loss = time_steps(model, opt, x, lambda logits: F.cross_entropy(logits, y),
                          a.policy, dev, a.warmup, a.steps)
    print(json.dumps({
        "peer": "torch " + torch.__version__, "model": "resnet", "device": a.device,
        "policy": a.policy, "batch": a.batch, "size": a.size, "width": a.width,
        "blocks": a.blocks, "optimizer": a.optimizer, "threads": torch.get_num_threads(),
        "params": sum(p.numel() for p in model.parameters()),
        "ms_per_step": round(dt * 1e3, 3), "samples_per_s": round(a.batch / dt, 1),
        "steps": a.steps, "loss": round(loss, 5)}))


if __name__ == "__main__":
    main()
