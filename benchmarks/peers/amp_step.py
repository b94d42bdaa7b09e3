"""What the model twins share: one PyTorch training step under the policy's AMP recipe, timed.

Policies map as the MLP peer's (``shared/peers/torch_mlp.py``): float32 -> plain fp32;
mixed_float16 -> autocast(float16) + GradScaler; mixed_bfloat16 -> autocast(bfloat16). The
loss is computed in float32 from the logits, as mpcore's models compute theirs.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

POLICIES = ("float32", "mixed_float16", "mixed_bfloat16")


def time_steps(model: torch.nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor,
               loss_of: Callable[[torch.Tensor], torch.Tensor], policy: str,
               device: torch.device, warmup: int, steps: int) -> tuple[float, float]:
    """(seconds per step, last loss) of ``steps`` training steps after ``warmup`` ones;
    ``loss_of(float32 logits)`` is the loss."""
    low = {"mixed_float16": torch.float16, "mixed_bfloat16": torch.bfloat16}.get(policy)
    scaler = torch.amp.GradScaler(device.type, enabled=(policy == "mixed_float16"))
    model.train()

    def step() -> torch.Tensor:
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=low or torch.float32, enabled=low is not None):
            logits = model(x)
        loss = loss_of(logits.float())
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        return loss.detach()

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize()

    for _ in range(warmup):
        step()
    sync()
    t0 = time.perf_counter()
    loss = torch.zeros(())
    for _ in range(steps):
        loss = step()
    sync()
    return (time.perf_counter() - t0) / steps, float(loss.item())
