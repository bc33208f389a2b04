"""One optimizer update under the fp16 loss scaler (a no-op in fp32 and bf16): the gradients unscaled and
clipped, then the step at the schedule's learning rate (``core/optim.py``), skipped when fp16 overflowed.
"""

import math

import torch

from transformer.core.optim import set_lr


def unscale_and_clip(model: torch.nn.Module, optimizer, scaler: torch.amp.GradScaler, max_norm: float):
    """Undo the fp16 loss scale on the gradients, clip their global norm (0 = no clipping); the norm."""
    scaler.unscale_(optimizer)
    return torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm if max_norm > 0 else math.inf)


def scaled_step(optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler, lr: float) -> bool:
    """One update at ``lr``, gradients cleared. False when fp16 overflowed and the scaler skipped it."""
    set_lr(optimizer, lr)
    loss_scale = scaler.get_scale()
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    return not scaler.get_scale() < loss_scale
