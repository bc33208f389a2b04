"""Adam with the warmup / inverse-square-root learning-rate schedule of §5.3.

    lrate = scale · d_model^-0.5 · min(step^-0.5, step · warmup_steps^-1.5)

It rises linearly for ``warmup_steps`` updates, peaks at step = warmup_steps, then decays as 1/√step.
With ``train.cooldown`` > 0 (not in the paper) it is multiplied, over that last fraction of the run's budget
(``max_steps`` or ``max_minutes``), by a factor that falls linearly from 1 to 0: the run ends annealed.
"""

import torch

from transformer.core.config import TrainConfig


def lr_scale(config: TrainConfig, d_model: int) -> float:
    """``train.lr_scale``, or the scale that makes the peak (at step = warmup) equal ``train.peak_lr``."""
    if config.peak_lr > 0:
        return config.peak_lr / (d_model**-0.5 * config.warmup_steps**-0.5)
    return config.lr_scale


def learning_rate(step: int, d_model: int, warmup_steps: int, scale: float) -> float:
    """The learning rate for optimizer update number ``step`` (1-based)."""
    step = max(step, 1)
    return scale * d_model**-0.5 * min(step**-0.5, step * warmup_steps**-1.5)


def cooldown_factor(budget_used: float, cooldown: float) -> float:
    """The learning rate's multiplier once ``budget_used`` (0..1) of the budget is spent: 1 until the last
    ``cooldown`` fraction, then falling linearly to 0 at the end of the budget."""
    if cooldown <= 0.0:
        return 1.0
    return min(1.0, max(0.0, (1.0 - budget_used) / cooldown))


def make_optimizer(model: torch.nn.Module, config: TrainConfig) -> torch.optim.Adam:
    """Adam(β1, β2, ε) of §5.3; the learning rate is set before every update by ``set_lr``. On the CPU and
    CUDA, PyTorch's fused kernel: one pass over each parameter and its moments instead of a dozen."""
    params = list(model.parameters())
    return torch.optim.Adam(
        params,
        lr=0.0,
        betas=(config.adam_beta1, config.adam_beta2),
        eps=config.adam_eps,
        weight_decay=config.weight_decay,
        fused=True if all(p.device.type in ("cpu", "cuda") for p in params) else None,  # None: the default
    )


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr
