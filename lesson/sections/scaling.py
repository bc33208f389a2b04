"""Why divide by √d_k: the variance of q·k, softmax saturation, the softmax Jacobian and its shrink, and the
backward formulas of attention checked against autograd."""

import math

import torch

from transformer.core.attention import scaled_dot_product_attention

from .section import Section, max_abs

# The first document's table (its own draws, generator not given): d_k -> (mean, variance, std, scaled std).
DOCUMENT_VARIANCE = {4: (0.003, 3.99, 2.00, 0.999), 16: (0.012, 15.92, 3.99, 0.997),
                     64: (-0.034, 64.01, 8.00, 1.000), 512: (-0.077, 514.16, 22.68, 1.002)}  # fmt: skip
# The first document's 10-key draw: (d_k, scaled) -> (score range, top weight, largest Jacobian entry).
DOCUMENT_TEN_KEYS = {
    (64, False): (-15.8, 9.5, 0.8407, 0.1339),
    (64, True): (-2.0, 1.2, 0.2484, 0.1867),
    (512, False): (-60.1, 46.0, 1.0000, 0.0000),
    (512, True): (-2.7, 2.0, 0.5176, 0.2497),
}


def variance_table() -> Section:
    """Var(q·k) = d_k over 100,000 random pairs (mean 0, variance 1), ours beside the first document's."""
    s = Section("variance_table", "dot products of random vectors (mean 0, variance 1), 100,000 pairs each")
    s.say("our draw: torch.Generator seed 0, float64; the document's generator is not given, so its")
    s.say("Monte Carlo figures differ from ours in the last digits (document in brackets)")
    generator = torch.Generator().manual_seed(0)
    for d_k, (mean_doc, var_doc, sd_doc, std_doc) in DOCUMENT_VARIANCE.items():
        q, k = (torch.randn(100_000, d_k, dtype=torch.float64, generator=generator) for _ in range(2))
        dots = (q * k).sum(-1)  # (100000,): q·k
        scaled_std = (dots / math.sqrt(d_k)).std().item()
        s.say(
            f"d_k={d_k:4d}  mean {dots.mean().item():+.3f} [{mean_doc:+.3f}]  variance"
            f" {dots.var().item():7.2f} [{var_doc:.2f}]  std {dots.std().item():5.2f} [{sd_doc:.2f}]"
            f"  scaled std {scaled_std:.3f} [{std_doc:.3f}]"
        )
        s.numbers[d_k] = (dots.var().item(), scaled_std)
    return s


def variance_seeded() -> Section:
    """The second document's check with its own settings: torch.manual_seed(0), float64, d_k 16, 64, 256."""
    s = Section("variance_seeded", "Var(q·k) = d_k with the second document's generator settings")
    s.say("torch.manual_seed(0); q, k = torch.randn(100_000, d_k, dtype=float64) for d_k in (16, 64, 256)")
    torch.manual_seed(0)
    for d_k in (16, 64, 256):
        q, k = torch.randn(100_000, d_k, dtype=torch.float64), torch.randn(100_000, d_k, dtype=torch.float64)
        dots = (q * k).sum(-1)  # (100000,)
        pair = (round(dots.var().item(), 1), round((dots / d_k**0.5).var().item(), 2))
        s.say(f"{d_k} {pair[0]} {pair[1]}")
        s.numbers[d_k] = pair
    generator = torch.Generator().manual_seed(0)
    q, k = (2.0 * torch.randn(100_000, 64, dtype=torch.float64, generator=generator) for _ in range(2))
    sigma4 = ((q * k).sum(-1) / 8.0).var().item()  # entries of variance σ² = 4
    s.say(f"entries of variance σ² = 4 (d_k 64, seed 0): Var(q·k / √d_k) = {sigma4:.1f}, σ⁴ = 16")
    s.numbers["sigma4"] = sigma4
    return s


def jacobian(probs: torch.Tensor) -> torch.Tensor:
    """The softmax Jacobian diag(p) - p pᵀ of one row of weights (n,) -> (n, n)."""
    return torch.diag(probs) - torch.outer(probs, probs)


def printed(p: float, largest_logit: float) -> str:
    """A weight at the precision the lesson prints it: 3 decimals, 5 for a saturated row, 7 below 1e-5."""
    if largest_logit < 10:
        return f"{p:.3f}"
    return f"{p:.5f}" if p >= 1e-5 else f"{p:.7f}"


def row_weights(query: torch.Tensor, keys: torch.Tensor, scaled: bool) -> torch.Tensor:
    """One query (d,) against keys (n, d) through our Eq. 1 -> weights (n,). ``scaled=False`` undoes the
    1/√d_k (the query is multiplied by √d_k first): the scores the mistake would give."""
    d_k = query.numel()
    q = query if scaled else query * math.sqrt(d_k)
    _, weights = scaled_dot_product_attention(q[None], keys, keys)  # (1, n)
    return weights[0]


def ten_keys() -> Section:
    """Softmax over 10 keys, one query, with and without the scale, for d_k = 64 and 512."""
    s = Section("ten_keys", "softmax over 10 keys, one query, the same draw scaled and not scaled")
    s.say("our draw: torch.Generator seed 0; the document's draw is not given (its figures beside ours)")
    for d_k in (64, 512):
        generator = torch.Generator().manual_seed(0)
        query, keys = torch.randn(d_k, generator=generator), torch.randn(10, d_k, generator=generator)
        for scaled in (False, True):
            probs = row_weights(query, keys, scaled)
            scores = keys @ query / (math.sqrt(d_k) if scaled else 1.0)  # (10,)
            top, grad = probs.max().item(), jacobian(probs).abs().max().item()
            low_doc, high_doc, top_doc, grad_doc = DOCUMENT_TEN_KEYS[(d_k, scaled)]
            name = f"{'scaled' if scaled else 'unscaled'}{d_k}"
            s.say(
                f"{name:<12} scores [{scores.min().item():+.1f}, {scores.max().item():+.1f}]"
                f" [{low_doc:+.1f}, {high_doc:+.1f}]  top weight {top:.4f} [{top_doc:.4f}]"
                f"  largest gradient entry {grad:.4f} [{grad_doc:.4f}]"
            )
            s.numbers[name] = (top, grad)
    s.say("no entry of a softmax Jacobian can exceed 0.25 (p(1 - p) <= 1/4)")
    return s


def saturation() -> Section:
    """Logits (2, 1, 0) and the same times 8: the Jacobian shrinks ~660 times; J checked against autograd."""
    s = Section("saturation", "the softmax Jacobian diag(p) - p pᵀ, and saturation in numbers (float64)")
    sizes = {}
    for logits in ([2.0, 1.0, 0.0], [16.0, 8.0, 0.0], [3.0, 0.0]):
        z = torch.tensor(logits, dtype=torch.float64)
        auto = torch.autograd.functional.jacobian(lambda t: torch.softmax(t, -1), z)
        probs = torch.softmax(z, -1)
        J = jacobian(probs)
        ok = torch.allclose(auto, J) and torch.allclose(J, J.T) and J.sum(-1).abs().max() < 1e-15
        sizes[tuple(logits)] = J.abs().max().item()
        p_text = ", ".join(printed(p, max(logits)) for p in probs.tolist())
        s.say(
            f"logits {tuple(logits)}: p = ({p_text}), J = autograd, symmetric, J 1 = 0: {ok}, "
            f"max |J_ij| = {sizes[tuple(logits)]:.2e}"
        )
        s.numbers[tuple(logits)] = (probs.tolist(), sizes[tuple(logits)], ok)
    shrink = sizes[(2.0, 1.0, 0.0)] / sizes[(16.0, 8.0, 0.0)]
    s.say(
        f"(16, 8, 0) is (2, 1, 0) times 8, what d_k = 64 gives without the scale: {shrink:.0f}x smaller"
        " (about 660)"
    )
    p1, p2 = torch.softmax(torch.tensor([3.0, 0.0], dtype=torch.float64), -1).tolist()
    s.say(f"logits (3, 0): J = p1 p2 [[1, -1], [-1, 1]] with p1 p2 = {p1 * p2:.3f}")
    s.numbers.update(shrink=shrink, p1p2=p1 * p2)
    return s


def saturation_bound() -> Section:
    """Every entry of J is at most ε when the largest weight is 1 - ε, and the VJP p ⊙ (g - pᵀg)."""
    s = Section("saturation_bound", "the bound |J_ij| <= ε when the top weight is 1 - ε, and the O(T) VJP")
    generator = torch.Generator().manual_seed(0)
    worst = 0.0
    for scale in (1.0, 4.0, 16.0):
        for _ in range(1000):
            probs = torch.softmax(scale * torch.randn(8, dtype=torch.float64, generator=generator), -1)
            epsilon = probs.sort().values[:-1].sum()  # 1 - the top weight, without the cancellation
            if epsilon > 1e-6:  # below, p - p² in float64 has too few correct digits to compare
                worst = max(worst, (jacobian(probs).abs().max() / epsilon).item())
    g = torch.randn(8, dtype=torch.float64, generator=generator)
    probs = torch.softmax(torch.randn(8, dtype=torch.float64, generator=generator), -1)
    vjp_diff = max_abs(jacobian(probs) @ g, probs * (g - probs @ g))
    s.say(f"3,000 random rows of 8 logits: largest max|J_ij| / ε = {worst:.3f} (the bound says <= 1)")
    s.say(f"J g against p * (g - (pᵀg) 1): max abs difference {vjp_diff:.1e}")
    s.numbers.update(worst=worst, vjp=vjp_diff)
    return s


def many_keys() -> Section:
    """128 keys without the scale: the median top weight and the share of keys below 1e-3."""
    s = Section("many_keys", "128 keys, no scale: how one-hot the softmax gets (1,000 draws, median)")
    s.say("our draw: torch.Generator seed 0; the document gives rounded figures (in brackets)")
    generator = torch.Generator().manual_seed(0)
    document = {64: "about 0.8, ~95%", 256: "about 0.98"}
    for d_k in (64, 256):
        q = torch.randn(1000, 1, d_k, generator=generator)  # 1,000 draws of one query
        k = torch.randn(1000, 128, d_k, generator=generator)  # ... and 128 keys each
        _, weights = scaled_dot_product_attention(q * math.sqrt(d_k), k, k)  # (1000, 1, 128), unscaled
        top = weights.amax(-1).median().item()
        small = (weights < 1e-3).float().mean().item()
        s.say(
            f"d_k={d_k}: median top weight {top:.2f}, keys with weight < 1e-3: {small:.0%}  [{document[d_k]}]"
        )
        s.numbers[d_k] = (top, small)
        spread = ((k[:, 0] - k[:, 1]) * q[:, 0]).sum(-1)  # (1000,): two keys' unscaled logits, difference
        if d_k == 64:
            s.say(
                f"  unscaled, two keys' logits differ by std {spread.std().item():.1f} (√(2 d_k) = 11.3);"
                f" e^11 = {math.exp(11):,.0f}"
            )
    return s


def backward() -> Section:
    """dV = Aᵀ dO, dA = dO Vᵀ, dS = A ⊙ (dA - rowsum(A ⊙ dA)), dQ = dS K/√d_k, dK = dSᵀ Q/√d_k."""
    s = Section("backward", "the backward pass of attention by formula, against autograd through ours")
    generator = torch.Generator().manual_seed(0)
    q, k, v = (
        torch.randn(2, 4, 6, 8, dtype=torch.float64, generator=generator, requires_grad=True)
        for _ in range(3)
    )
    grad_out = torch.randn(2, 4, 6, 8, dtype=torch.float64, generator=generator)  # dO
    out, A = scaled_dot_product_attention(q, k, v)
    auto = torch.autograd.grad(out, (q, k, v), grad_out)
    with torch.no_grad():
        dV = A.transpose(-2, -1) @ grad_out
        dA = grad_out @ v.transpose(-2, -1)
        dS = A * (dA - (A * dA).sum(-1, keepdim=True))
        dQ = dS @ k / math.sqrt(8)
        dK = dS.transpose(-2, -1) @ q / math.sqrt(8)
    for name, mine, theirs in zip(("dQ", "dK", "dV"), (dQ, dK, dV), auto):
        s.say(f"{name}: formula vs autograd, max abs difference {max_abs(mine, theirs):.1e}")
        s.numbers[name] = max_abs(mine, theirs)
    return s
