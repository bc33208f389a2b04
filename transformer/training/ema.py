"""An exponential moving average of the parameters (Polyak averaging), used for evaluation and inference.

    shadow ← shadow + (1 − d) · (θ − shadow),   d = min(decay, (1 + n) / (10 + n)) after n updates

Averaging the weights over the last few hundred updates smooths out the noise of the final steps, like the
checkpoint averaging of the paper (§6.1: "averaging the last 5 checkpoints"), without storing checkpoints.

``decay`` is a cap: the warm-up (1 + n) / (10 + n) stays below it until n = (10·decay − 1) / (1 − decay),
4490 updates for 0.998, 8990 for 0.999. Before that, 1 − d = 9 / (10 + n): the average reaches back about
n / 9 updates, a window that grows with the run. The main job (about 2100 updates) never reaches its cap;
there a true 0.998 from the start (window 500) validates lower (docs/experiments.md).
"""

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn


class EMA:
    def __init__(self, model: nn.Module, decay: float):
        self.decay, self.updates = decay, 0
        self.shadow = [p.detach().clone() for p in model.parameters()]

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        self.updates += 1
        decay = min(self.decay, (1 + self.updates) / (10 + self.updates))
        torch._foreach_lerp_(self.shadow, [p.detach() for p in model.parameters()], 1.0 - decay)

    @contextmanager
    def applied(self, model: nn.Module) -> Iterator[nn.Module]:
        """Inside the block the model holds the averaged weights; the training weights come back after."""
        params = list(model.parameters())
        backup = [p.detach().clone() for p in params]
        with torch.no_grad():
            torch._foreach_copy_([p.data for p in params], self.shadow)
        try:
            yield model
        finally:
            with torch.no_grad():
                torch._foreach_copy_([p.data for p in params], backup)

    def state_dict(self) -> dict:
        return {"updates": self.updates, "shadow": self.shadow}

    def load_state_dict(self, state: dict) -> None:
        self.updates = state["updates"]
        for mine, saved in zip(self.shadow, state["shadow"], strict=True):
            mine.copy_(saved)
