"""Masks: -inf before the softmax, the 5-token causal example, two ways to get it wrong, a fully masked row,
the two conventions, and what the causal mask tells a decoder about positions."""

import torch
import torch.nn.functional as F
from mistakes import attend

from transformer.core.attention import scaled_dot_product_attention
from transformer.core.masks import causal_mask, decoder_self_mask, padding_mask

from .section import Section, max_abs, rounded


def minus_infinity() -> Section:
    """Scores (2, 1, 5) of word 2 against words 1..3, word 3 in the future."""
    s = Section("minus_infinity", "why -inf works: scores (2, 1, 5), the third key in the future")
    query = torch.ones(1, 1)  # d_k = 1: the scores are the keys themselves
    keys = torch.tensor([[2.0], [1.0], [5.0]])  # (3, 1)
    allowed = torch.tensor([[True, True, False]])  # (1, 3), True = attend
    _, masked = scaled_dot_product_attention(query, keys, keys, allowed)
    _, unmasked = scaled_dot_product_attention(query, keys, keys)
    s.say(f"with the mask: {rounded(masked[0], 3)}  (e^2 / (e^2 + e^1) = 7.389 / 10.107)")
    s.say(f"without it, the future score 5 takes most of the weight: {rounded(unmasked[0], 3)}")
    s.numbers.update(masked=rounded(masked[0], 3), unmasked=rounded(unmasked[0], 3))
    return s


def five_tokens() -> tuple[torch.Tensor, ...]:
    """The first document's 5-token example: q, k, v of (5, 4) from torch.Generator().manual_seed(3)."""
    g = torch.Generator().manual_seed(3)
    return tuple(torch.randn(5, 4, generator=g) for _ in range(3))


def causal_table() -> Section:
    """The mask as two loops = torch.tril = masks.causal_mask; the scores through it; ours vs the library."""
    s = Section("causal_table", "the causal mask on 5 tokens (torch.Generator().manual_seed(3), d_k 4)")
    n = 5
    loops = torch.tensor([[j <= i for j in range(n)] for i in range(n)])  # query i may see key j <= i
    allowed = causal_mask(n)  # (5, 5) bool, True = attend
    s.say(
        f"two loops == torch.tril(ones) == masks.causal_mask: "
        f"{torch.equal(loops, allowed) and torch.equal(allowed, torch.ones(n, n).tril().bool())}"
    )
    s.table("allowed (1 = may look, 0 = future)", allowed.int(), digits=0, width=3)
    q, k, v = five_tokens()
    scores = q @ k.T / 2.0  # (5, 5), √d_k = 2
    s.table("scores before the mask", scores)
    s.table(
        "scores after the mask (shown as -inf; the code writes the dtype's minimum)",
        scores.masked_fill(~allowed, float("-inf")),
    )
    out, weights = scaled_dot_product_attention(q, k, v, allowed)
    s.table("weights", weights)
    additive = torch.nn.Transformer.generate_square_subsequent_mask(n)  # (5, 5) 0 / -inf
    diffs = {
        "library is_causal=True": max_abs(out, F.scaled_dot_product_attention(q, k, v, is_causal=True)),
        "library attn_mask=allowed": max_abs(out, F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)),
        "ours with the additive mask": max_abs(out, scaled_dot_product_attention(q, k, v, additive)[0]),
    }
    for name, diff in diffs.items():
        s.say(f"ours vs {name}: max abs difference {diff:.1e}")
    s.say("(document: 1.5e-07 for both library calls: float32 rounding, whose last digits depend on the CPU)")
    s.numbers.update(scores=rounded(scores, 3), weights=rounded(weights, 3), diffs=diffs)
    return s


def mask_mistakes() -> Section:
    """The mask applied after the softmax, and the mask written with 0 instead of -inf."""
    s = Section("mask_mistakes", "two wrong masks on the same 5 tokens: after the softmax, and with 0")
    q, k, v = five_tokens()
    allowed = causal_mask(5)
    _, after = attend(q, k, v, allowed, "mask_after_softmax")
    _, zero = attend(q, k, v, allowed, "mask_with_zero")
    out, _ = scaled_dot_product_attention(q, k, v, allowed)
    s.table("weights, mask after softmax", after)
    s.say(f"row sums: {rounded(after.sum(-1), 3)}  (correct: all 1.0)")
    future = zero.masked_fill(allowed, 0.0).sum(-1)  # (5,): the weight each row gives the future
    s.say(f"masked scores set to 0, not -inf; weight on the future per row: {rounded(future, 3)}")
    for name, wrong in (("after the softmax", after), ("with 0", zero)):
        s.say(f"output, mask {name}: max abs difference from the right one {max_abs(wrong @ v, out):.3f}")
    s.numbers.update(after=rounded(after, 3), row_sums=rounded(after.sum(-1), 3), future=rounded(future, 3))
    return s


def fully_masked_row() -> Section:
    """A row with no visible key: NaN by the formula, zeros here and in F.sdpa, NaN in nn.MultiheadAttention
    (its general path)."""
    s = Section(
        "fully_masked_row",
        f"a fully masked row: what each implementation returns (PyTorch {torch.__version__.split('+')[0]})",
    )
    q, k, v = five_tokens()
    allowed = causal_mask(5)
    allowed[1] = False  # query 2 may look at nothing
    naive = torch.softmax((q @ k.T / 2.0).masked_fill(~allowed, float("-inf")), -1) @ v  # the formula, -inf
    ours, _ = scaled_dot_product_attention(q, k, v, allowed)
    library = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)
    torch.manual_seed(0)
    mha = torch.nn.MultiheadAttention(4, 1, batch_first=True)
    with torch.no_grad():
        module, _ = mha(q[None], k[None], v[None], attn_mask=~allowed)  # True = blocked there
    results = {
        "the formula with -inf": naive[1],
        "ours": ours[1],
        "F.scaled_dot_product_attention": library[1],
        "nn.MultiheadAttention": module[0, 1],
    }
    for name, row in results.items():
        s.say(f"{name:<31} row 2: {[round(x, 4) for x in row.tolist()]}")
    s.say(
        "the other rows of ours equal the library's: max abs difference "
        f"{max_abs(ours[[0, 2, 3, 4]], library[[0, 2, 3, 4]]):.1e}"
    )
    lowest = torch.finfo(torch.float32).min
    uniform = torch.softmax(torch.full((3,), lowest), -1)  # a row of minimums: uniform, hence zeroed after
    s.say(
        f"masked with the minimum, a fully masked row softmaxes to {[round(x, 4) for x in uniform.tolist()]};"
        " ours then writes zeros"
    )
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        smallest = torch.finfo(dtype).min
        row = torch.softmax(torch.tensor([0.0, smallest, smallest], dtype=dtype), -1)
        s.say(f"{str(dtype):<15} minimum {smallest:.3e}: softmax(0, min, min) = {row.tolist()}")
    s.numbers.update({name: row.tolist() for name, row in results.items()})
    s.say("nn.MultiheadAttention, a sentence whose keys are all padding (key_padding_mask), by path:")
    s.numbers["module paths"] = {}
    for shape in ((4, 1, 5), (16, 4, 5), (64, 8, 7), (512, 8, 12)):
        found = {path: module_row(*shape, **how) for path, how in MODULE_PATHS.items()}
        s.numbers["module paths"][shape] = found
        s.say(
            f"  (D, H, T) = {str(shape):<13} " + "   ".join(f"{path}: {what}" for path, what in found.items())
        )
    return s


# nn.MultiheadAttention's paths: the fast one runs in eval mode under no_grad for self-attention without
# weights; the general one otherwise
MODULE_PATHS = {
    "fast (no_grad)": {"grad": False, "need_weights": False},
    "general, need_weights=False": {"grad": True, "need_weights": False},
    "general, need_weights=True": {"grad": True, "need_weights": True},
}


def module_row(D: int, H: int, T: int, grad: bool, need_weights: bool) -> str:
    """What ``nn.MultiheadAttention`` (eval mode, self-attention) returns for a sentence whose keys are all
    padding: "NaN", "zeros" or "other"."""
    torch.manual_seed(0)
    mha = torch.nn.MultiheadAttention(D, H, batch_first=True).eval()
    x = torch.randn(2, T, D)
    padding = torch.zeros(2, T, dtype=torch.bool)
    padding[1] = True  # True = a padding key, in this module's convention
    with torch.set_grad_enabled(grad):
        out, _ = mha(x, x, x, key_padding_mask=padding, need_weights=need_weights)
    row = out[1]
    return "NaN" if row.isnan().any() else "zeros" if bool((row == 0).all()) else "other"


def conventions() -> Section:
    """True means "attend" in F.sdpa and here; "blocked" in nn.MultiheadAttention: the same table, flipped."""
    s = Section("conventions", "mask conventions: True = attend (ours, F.sdpa), True = blocked (nn.MHA)")
    q, k, v = five_tokens()
    allowed = causal_mask(5)
    ours, _ = scaled_dot_product_attention(q, k, v, allowed)
    flipped, _ = attend(q, k, v, allowed, "flipped_mask")
    library = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)
    s.say(f"ours vs F.sdpa(attn_mask=allowed): {max_abs(ours, library):.1e}")
    s.say(
        f"the same table read the other way (True = blocked): max abs difference {max_abs(flipped, ours):.3f}"
    )
    s.numbers.update(flipped=max_abs(flipped, ours))
    return s


def batch_masks() -> Section:
    """The masks the project builds never leave a query without a key, even for an empty sentence."""
    s = Section("batch_masks", "the project's own masks on a padded batch: every query sees a key")
    pad = 0
    src = torch.tensor([[5, 6, 7, 3], [3, 0, 0, 0]])  # an empty source line is its EOS (3), then padding
    tgt_in = torch.tensor([[2, 8, 9], [2, 0, 0]])  # BOS (2) first, then padding
    masks = {
        "encoder self (padding)": padding_mask(src, pad).expand(2, 1, 4, 4),
        "decoder self (causal + padding)": decoder_self_mask(tgt_in, pad),
        "cross (padding)": padding_mask(src, pad).expand(2, 1, 3, 4),
    }
    for name, mask in masks.items():
        empty = int((~mask.any(-1)).sum())
        s.say(f"{name:<32} {tuple(mask.shape)}: query rows with no visible key: {empty}")
        s.numbers[name] = empty
    s.say("a real sentence always has its EOS (source) or its start token (target) to look at")
    return s


def positions() -> Section:
    """Under a causal mask, equal scores give token i the weight 1/i on each of its i keys."""
    s = Section("positions", "a causal mask tells a decoder where it is: equal scores, weight 1/i")
    q = torch.zeros(6, 4)  # every score 0: no content preference
    _, weights = scaled_dot_product_attention(q, torch.randn(6, 4), torch.randn(6, 4), causal_mask(6))
    first = weights[:, 0]  # (6,): the weight each query gives the first token
    s.say(f"weight on token 1, queries 1..6: {rounded(first, 3)}  (1/i)")
    s.numbers.update(first=rounded(first, 3))
    return s
