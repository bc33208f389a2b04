"""Adam with the warmup / inverse-square-root learning-rate schedule of §5.3.

    lrate = scale · d_model^-0.5 · min(step^-0.5, step · warmup_steps^-1.5)

It rises linearly for ``warmup_steps`` updates, peaks at step = warmup_steps, then decays as 1/√step.
"""

import math

import torch

from transformer.config import TrainConfig


def lr_scale(config: TrainConfig, d_model: int) -> float:
    """``train.lr_scale``, or the scale that makes the peak (at step = warmup) equal ``train.peak_lr``."""
    if config.peak_lr > 0:
        return config.peak_lr / (d_model**-0.5 * config.warmup_steps**-0.5)
    return config.lr_scale


def learning_rate(step: int, d_model: int, warmup_steps: int, scale: float) -> float:
    """The learning rate for optimizer update number ``step`` (1-based)."""
    step = max(step, 1)
    return scale * d_model**-0.5 * min(step**-0.5, step * warmup_steps**-1.5)


def make_optimizer(model: torch.nn.Module, config: TrainConfig) -> torch.optim.Adam:
    """Adam(β1, β2, ε) of §5.3; the learning rate is set before every update by ``set_lr``."""
    return torch.optim.Adam(
        model.parameters(),
        lr=0.0,
        betas=(config.adam_beta1, config.adam_beta2),
        eps=config.adam_eps,
        weight_decay=config.weight_decay,
    )


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr


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
