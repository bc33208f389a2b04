"""The eight classic mistakes on one small multi-head block, each with its size of error."""

import torch
from mistakes import MISTAKES, multi_head_with

from transformer.core.masks import causal_mask, padding_mask

from .heads import small_block
from .section import Section, max_abs


def block_masks(x: torch.Tensor) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """{kind: (key input, mask)} for the three uses; sentence 2 ends in two padding tokens."""
    tokens = torch.tensor([[4, 5, 6, 7, 8], [4, 5, 6, 0, 0]])  # (2, 5), pad id 0
    memory = x.flip(1)  # (2, 5, 16): another sequence to read from
    return {
        "encoder": (x, padding_mask(tokens, 0)),
        "decoder": (x, causal_mask(5)),
        "cross": (memory, padding_mask(tokens, 0)),
    }


def eight_mistakes() -> Section:
    s = Section(
        "eight_mistakes", "eight classic mistakes: max |Δ| from the right output, per use of the block"
    )
    block, x = small_block()
    uses = block_masks(x)
    s.say(f"{'mistake':<22}" + "".join(f"{kind:>12}" for kind in uses))
    with torch.no_grad():
        right = {kind: block(x, key, key, mask)[0] for kind, (key, mask) in uses.items()}
        for name, title in {None: "none (ours)", **MISTAKES}.items():
            row = {
                kind: max_abs(multi_head_with(block, x, key, mask, kind, name)[0], right[kind])
                for kind, (key, mask) in uses.items()
            }
            s.say(f"{title:<22}" + "".join(f"{row[kind]:12.1e}" for kind in uses))
            s.numbers[name] = row
        _, w_right = block(x, x, x)
        _, w_no_scale = multi_head_with(block, x, x, None, "encoder", "no_scale")
    s.say("a mask mistake changes nothing where nothing is masked (the first sentence has no padding);")
    s.say("'causal enc/cross' changes nothing in the decoder, which is causal already")
    s.say(
        f"no scale: the largest weight in any row goes {w_right.max().item():.3f}"
        f" -> {w_no_scale.max().item():.3f}"
    )
    return s
