"""Eq. 1 on small examples: the three-token example, the library check, the worked example with d_k = 2."""

import math

import numpy as np
import torch
import torch.nn.functional as F

from transformer.core.attention import scaled_dot_product_attention
from transformer.core.masks import causal_mask

from .section import Section, max_abs, rounded

Q3 = [[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]  # three queries, d_k = 2
K3 = [[2.0, 0.0], [0.0, 2.0], [1.0, 1.0]]  # three keys
V3 = [[10.0, 0.0], [0.0, 10.0], [5.0, 5.0]]  # three values


def three_tokens() -> Section:
    """Eq. 1 step by step: every intermediate table of the three-token example."""
    s = Section("three_tokens", "Eq. 1 on three tokens, d_k = 2, every table")
    q, k, v = (torch.tensor(t) for t in (Q3, K3, V3))  # (3, 2) each
    out, weights = scaled_dot_product_attention(q, k, v)  # (3, 2), (3, 3)
    scores = q @ k.T  # (3, 3)
    scaled = scores / math.sqrt(q.size(-1))  # (3, 3)
    s.table("Q K^T", scores)
    s.table("Q K^T / sqrt(d_k)", scaled)
    s.table("weights = softmax(rows)", weights)
    s.say(f"row sums: {rounded(weights.sum(-1), 3)}")
    s.table("output = weights V", out, digits=2)
    s.numbers.update(scaled=rounded(scaled, 3), weights=rounded(weights, 3), output=rounded(out, 2))
    return s


def library_check() -> Section:
    """The same example against F.scaled_dot_product_attention, then a random (2, 8, 10, 64) step."""
    s = Section("library_check", "our attention against torch.nn.functional.scaled_dot_product_attention")
    q, k, v = (torch.tensor(t) for t in (Q3, K3, V3))
    ours, _ = scaled_dot_product_attention(q, k, v)
    lib = F.scaled_dot_product_attention(q, k, v)
    generator = torch.Generator().manual_seed(0)
    qr, kr, vr = (torch.randn(2, 8, 10, 64, generator=generator) for _ in range(3))  # (B, H, T, Dh)
    ours_r, _ = scaled_dot_product_attention(qr, kr, vr)  # (2, 8, 10, 64)
    lib_r = F.scaled_dot_product_attention(qr, kr, vr)
    s.say(f"three tokens, ours   : {rounded(ours, 4)}")
    s.say(f"three tokens, library: {rounded(lib, 4)}")
    s.say(f"max abs difference: {max_abs(ours, lib):.1e}   (document: 4.8e-07)")
    s.say(
        f"random (batch 2, heads 8, n 10, d_k 64), seed 0: output {tuple(ours_r.shape)}, "
        f"max abs difference {max_abs(ours_r, lib_r):.1e}   (document, its own draw: 6.0e-07)"
    )
    s.numbers.update(
        ours=rounded(ours, 4),
        lib=rounded(lib, 4),
        diff=max_abs(ours, lib),
        random_diff=max_abs(ours_r, lib_r),
    )
    return s


def numpy_reference() -> Section:
    """Method 1 of the first document, in NumPy, against ours: the same tables."""
    s = Section("numpy_reference", "the NumPy reference (Eq. 1 with the row maximum subtracted) against ours")
    Q, K, V = (np.array(t) for t in (Q3, K3, V3))
    scaled = Q @ K.T / np.sqrt(Q.shape[1])
    e = np.exp(scaled - scaled.max(axis=1, keepdims=True))  # the same softmax, no overflow
    weights = e / e.sum(axis=1, keepdims=True)
    ours, ours_w = scaled_dot_product_attention(*(torch.tensor(t, dtype=torch.float64) for t in (Q, K, V)))
    s.say(f"NumPy output: {np.round(weights @ V, 2).tolist()}")
    diff = max(np.abs(ours.numpy() - weights @ V).max(), np.abs(ours_w.numpy() - weights).max())
    s.say(f"ours (float64) vs NumPy, outputs and weights: max abs difference {diff:.1e}")
    s.numbers.update(diff=float(diff))
    return s


def quick_checks() -> Section:
    """The second document's quick checks: scores (ln 3, 0, 0), and the shapes of one head."""
    s = Section("quick_checks", "quick checks: a soft lookup, and the shapes of one head")
    query = torch.ones(1, 1)  # d_k = 1, so the scores q·k / √1 are the keys themselves
    keys = torch.tensor([[math.log(3.0)], [0.0], [0.0]])  # (3, 1): scores (ln 3, 0, 0)
    values = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.0, 0.0]])  # (3, 2)
    out, weights = scaled_dot_product_attention(query, keys, values)  # (1, 2), (1, 3)
    s.say(f"scores (ln 3, 0, 0): weights {rounded(weights[0], 3)}, output {rounded(out[0], 3)}")
    x = torch.randn(10, 64, generator=torch.Generator().manual_seed(0))  # T = 10 tokens, D = 64
    w_q, w_k, w_v = (torch.randn(64, 8, generator=torch.Generator().manual_seed(i)) for i in range(3))
    head, head_weights = scaled_dot_product_attention(x @ w_q, x @ w_k, x @ w_v)  # d_k = d_v = 8
    s.say(f"T = 10, D = 64, d_k = d_v = 8: Q K^T {tuple(head_weights.shape)}, A V {tuple(head.shape)}")
    s.numbers.update(
        weights=rounded(weights[0], 3),
        output=rounded(out[0], 3),
        shapes=(tuple(head_weights.shape), tuple(head.shape)),
    )
    return s


def worked_example() -> Section:
    """The second document's worked example: Q = K = V = X, without and with the causal mask."""
    s = Section("worked_example", "worked example: one head, Q = K = V = X, d_k = 2, float64")
    x = torch.tensor(Q3, dtype=torch.float64)  # (3, 2)
    out, weights = scaled_dot_product_attention(x, x, x)
    s.table("Q K^T", x @ x.T)
    s.table("S = Q K^T / sqrt(2)", x @ x.T / math.sqrt(2))
    e = math.exp(1 / math.sqrt(2))
    s.say(f"row 1: e^0.707 = {e:.3f}, e^0 = 1, sum {2 * e + 1:.3f}; causal row 2: 1 + {e:.3f} = {1 + e:.3f}")
    s.table("A (no mask)", weights)
    s.table("O = A V (no mask)", out)
    out_c, weights_c = scaled_dot_product_attention(x, x, x, causal_mask(3))
    s.table("A (causal mask)", weights_c)
    s.table("O = A V (causal mask)", out_c)
    p1, p2 = weights_c[1, :2].tolist()
    J = torch.tensor([[p1 - p1 * p1, -p1 * p2], [-p1 * p2, p2 - p2 * p2]], dtype=torch.float64)
    s.table("Jacobian of row 2 (causal), p1 p2 [[1, -1], [-1, 1]]", J)
    lib = F.scaled_dot_product_attention(x, x, x)
    lib_c = F.scaled_dot_product_attention(x, x, x, is_causal=True)
    s.say(f"F.scaled_dot_product_attention, rounded: {rounded(lib, 3)} / causal {rounded(lib_c, 3)}")
    s.say(f"ours vs the library: max abs difference {max(max_abs(out, lib), max_abs(out_c, lib_c)):.1e}")
    s.numbers.update(
        weights=rounded(weights, 3),
        output=rounded(out, 3),
        causal_weights=rounded(weights_c, 3),
        causal_output=rounded(out_c, 3),
        jacobian=round(p1 * p2, 3),
        lib=max(max_abs(out, lib), max_abs(out_c, lib_c)),
    )
    return s
