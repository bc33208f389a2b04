"""The source texts' remaining points, each computed with the package's attention: the low rank of the
scores, the 1/d_k of μP when queries and keys are correlated, reading a row (not a column), the memory of the
weights beside the FLOPs, a whole encoder's permutation equivariance, the Jacobian's sign, the recall card."""

import math

import torch

from transformer.core.attention import scaled_dot_product_attention
from transformer.core.config import ModelConfig
from transformer.core.model import Transformer

from .scaling import jacobian
from .section import Section, max_abs, rounded


def low_rank() -> Section:
    """Q Kᵀ of T tokens has rank at most d_k: with T > d_k the scores are a low-rank matrix."""
    s = Section("low_rank", "the scores Q Kᵀ have rank at most d_k (float64, T = 12 tokens)")
    torch.manual_seed(0)
    ranks = {}
    for d_k in (2, 4, 8, 16):
        q, k = torch.randn(12, d_k, dtype=torch.float64), torch.randn(12, d_k, dtype=torch.float64)
        ranks[d_k] = int(torch.linalg.matrix_rank(q @ k.T))  # (12, 12) scores
        s.say(f"d_k = {d_k:>2}: rank of the (12, 12) scores = {ranks[d_k]}")
    s.say("the scores of T tokens span at most d_k directions; the softmax that follows is not linear")
    s.numbers.update(ranks=ranks)
    return s


def correlated_scale() -> Section:
    """With q = k, q·k/√d_k grows as √d_k (4, 8, 16 at d_k 16, 64, 256); μP's 1/d_k keeps it near 1."""
    s = Section("correlated_scale", "when queries and keys are correlated: 1/√d_k or μP's 1/d_k (q = k)")
    g = torch.Generator().manual_seed(0)
    means = {}
    for d_k in (16, 64, 256):
        q = torch.randn(10000, d_k, generator=g, dtype=torch.float64)  # independent N(0, 1) entries
        dots = (q * q).sum(-1)  # (10000,) q·k with k = q
        means[d_k] = ((dots / math.sqrt(d_k)).mean().item(), (dots / d_k).mean().item())
        scaled, mup = means[d_k]
        s.say(
            f"d_k = {d_k:>3}: mean q·k/√d_k = {scaled:6.2f} (√d_k = {math.sqrt(d_k):4.1f}), "
            f"q·k/d_k = {mup:.3f}"
        )
    s.say(
        "1/√d_k holds the scores' spread at 1 for independent q and k; aligned ones grow as √d_k (μP's case)"
    )
    s.numbers.update(means=means)
    return s


def rows_not_columns() -> Section:
    """weights[i, j]: how much query i takes from key j. A row is a distribution; a column is not."""
    s = Section("rows_not_columns", "read a row, not a column: weights[i, j] is query i's share of key j")
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(4, 3, generator=g) for _ in range(3))
    _, weights = scaled_dot_product_attention(q, k, v)  # (4, 4)
    rows, columns = weights.sum(-1), weights.sum(-2)
    s.table("weights (query down, key across)", weights)
    s.say(f"row sums (one distribution per query): {rounded(rows, 4)}")
    s.say(f"column sums (no meaning as a distribution): {rounded(columns, 4)}")
    s.numbers.update(rows=rows.tolist(), columns=columns.tolist())
    return s


def memory_cost() -> Section:
    """The weights take B·H·Tq·Tk numbers: quadratic memory beside the quadratic FLOPs."""
    s = Section(
        "memory_cost", "the memory of the weights: B·H·Tq·Tk numbers, beside the FLOPs (H = 8, D = 512)"
    )
    sizes = {}
    for T in (128, 512, 2048, 8192):
        weights_bytes = 8 * T * T * 4  # one sentence, H = 8 heads, float32
        flops = 4 * T * T * 512  # the scores and the weighted sums
        sizes[T] = weights_bytes
        s.say(
            f"T = {T:>4}: weights {weights_bytes / 2**20:8.1f} MiB a sentence per layer, "
            f"{flops / 1e9:7.2f} GFLOP"
        )
    s.say("both grow as T²: double the length, four times the memory and the FLOPs")
    s.numbers.update(bytes=sizes)
    return s


def encoder_permutation() -> Section:
    """A whole encoder without positions is permutation-equivariant; its mean over tokens is invariant."""
    s = Section(
        "encoder_permutation", "a whole encoder, without positions: equivariant, and its mean invariant"
    )
    torch.manual_seed(0)
    config = ModelConfig(d_model=32, n_heads=4, d_ff=64, n_encoder_layers=3, n_decoder_layers=1, dropout=0.0)
    model = Transformer(config, 50, 50, 0, 2, 3).double().eval()
    tokens = torch.randint(4, 50, (1, 9))
    perm = torch.randperm(9)
    embed = model.encoder.embedding(tokens)  # (1, 9, 32) without the sinusoids
    x = embed
    with torch.no_grad():
        for layer in model.encoder.layers:
            x, _ = layer(x, None)
        y = embed[:, perm]
        for layer in model.encoder.layers:
            y, _ = layer(y, None)
    equivariant = max_abs(x[:, perm], y)
    invariant = max_abs(x.mean(1), y.mean(1))
    s.say(f"3 layers: max |encoder(x)[perm] - encoder(x[perm])| = {equivariant:.1e}")
    s.say(f"mean over tokens: max |mean(encoder(x)) - mean(encoder(x[perm]))| = {invariant:.1e}")
    s.say("the sinusoids are what tell the encoder the order")
    s.numbers.update(equivariant=equivariant, invariant=invariant)
    return s


def jacobian_sign() -> Section:
    """diag(p) - p pᵀ is positive semi-definite: eigenvalues >= 0, one of them 0 (along the ones)."""
    s = Section("jacobian_sign", "the softmax Jacobian diag(p) - p pᵀ is positive semi-definite (float64)")
    g = torch.Generator().manual_seed(2)
    probs = torch.softmax(torch.randn(5, generator=g, dtype=torch.float64), -1)
    eigenvalues = torch.linalg.eigvalsh(jacobian(probs))
    ones = jacobian(probs) @ torch.ones(5, dtype=torch.float64)
    s.say(f"p = {rounded(probs, 3)}")
    s.say(f"eigenvalues: {[f'{e:.3g}' for e in eigenvalues.tolist()]}")
    s.say(
        "J · (1, ..., 1) = 0 (adding a constant to every score changes nothing): "
        f"max |.| {ones.abs().max():.1e}"
    )
    s.numbers.update(eigenvalues=eigenvalues.tolist())
    return s


def recall_card() -> Section:
    """Scores (0, ln 3): weights (0.25, 0.75)."""
    s = Section("recall_card", "the recall card: scores (0, ln 3) give weights (0.25, 0.75)")
    weights = torch.softmax(torch.tensor([0.0, math.log(3.0)], dtype=torch.float64), -1)
    s.say(f"softmax(0, ln 3) = {rounded(weights, 4)}  (e^0 : e^ln 3 = 1 : 3)")
    s.say(
        "causal training equals generating one token at a time: "
        "tests/core/test_attention.py::test_cached_self_attention_equals_full checks it"
    )
    s.numbers.update(weights=weights.tolist())
    return s
