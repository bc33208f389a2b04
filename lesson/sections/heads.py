"""Multi-head attention: the head split line by line, against nn.MultiheadAttention, its parameters and its
cost for every H, cross-attention's shapes, and permutation equivariance."""

import math

import torch
from torch.utils.flop_counter import FlopCounterMode

from transformer.core.attention import MultiHeadAttention, scaled_dot_product_attention, split_heads
from transformer.core.masks import causal_mask
from transformer.reference.pytorch_oracle import copy_attention

from .section import Section, max_abs


def small_block(seed: int = 0) -> tuple[MultiHeadAttention, torch.Tensor]:
    """The first document's example: 2 sentences of 5 tokens, d_model 16, h = 4 (d_k = 4), seeded."""
    torch.manual_seed(seed)
    block = MultiHeadAttention(16, 4).eval()
    with torch.no_grad():
        block.qkv_proj.bias.normal_(0.0, 0.1)  # nonzero biases, so that a dropped bias would show
        block.out_proj.bias.normal_(0.0, 0.1)
    return block, torch.randn(2, 5, 16)  # (B, T, D)


def paper_matrices(block: MultiHeadAttention) -> dict[str, torch.Tensor]:
    """The block's weights in the paper's layout, x @ W + b (nn.Linear stores W transposed)."""
    D = block.d_model
    w, b = block.qkv_proj.weight.detach(), block.qkv_proj.bias.detach()
    m = {f"W_{c}": w[i * D : (i + 1) * D].T for i, c in enumerate("QKV")}  # (D, D) each
    m.update({f"b_{c}": b[i * D : (i + 1) * D] for i, c in enumerate("QKV")})
    m.update(W_O=block.out_proj.weight.detach().T, b_O=block.out_proj.bias.detach())
    return m


def line_by_line() -> Section:
    """The split, Eq. 1 per head and the merge, one line at a time, with the shape after every line."""
    s = Section("line_by_line", "multi-head attention line by line: batch 2, n 5, d_model 16, h 4 (d_k 4)")
    block, x = small_block()
    p, h, d_k = paper_matrices(block), 4, 4
    steps = [("x", x, "(batch, n, d_model)")]
    Qm = x @ p["W_Q"] + p["b_Q"]  # (2, 5, 16): all heads' queries in one product
    steps += [("Q = x W_Q + b_Q", Qm, "(batch, n, d_model)")]
    steps += [("Q.view(batch, n, h, d_k)", Qm.view(2, 5, h, d_k), "(batch, n, h, d_k)")]
    Qh = Qm.view(2, 5, h, d_k).transpose(1, 2)  # (2, 4, 5, 4)
    Kh, Vh = (split_heads(x @ p[f"W_{c}"] + p[f"b_{c}"], h) for c in "KV")  # (2, 4, 5, 4) each
    S = Qh @ Kh.transpose(-2, -1) / math.sqrt(d_k)  # (2, 4, 5, 5)
    heads = torch.softmax(S, dim=-1) @ Vh  # (2, 4, 5, 4)
    merged = heads.transpose(1, 2)  # (2, 5, 4, 4)
    y_steps = merged.reshape(2, 5, h * d_k) @ p["W_O"] + p["b_O"]  # (2, 5, 16)
    steps += [
        (".transpose(1, 2)", Qh, "(batch, h, n, d_k)"),
        ("K, V the same way", Kh, "(batch, h, n, d_k)"),
        ("Q K^T / sqrt(d_k)", S, "(batch, h, n, n)"),
        ("softmax over the last axis", S, "(batch, h, n, n)"),
        ("weights V", heads, "(batch, h, n, d_k)"),
        (".transpose(1, 2)", merged, "(batch, n, h, d_k)"),
        (".reshape(batch, n, h * d_k)", merged.reshape(2, 5, 16), "(batch, n, d_model)"),
        ("concat W_O + b_O", y_steps, "(batch, n, d_model)"),
    ]
    for name, tensor, axes in steps:
        s.say(f"{name:<36} {str(tuple(tensor.shape)):<14} {axes}")
    with torch.no_grad():
        y_block, _ = block(x, x, x)
    s.say(f"step by step vs our MultiHeadAttention: max abs difference {max_abs(y_steps, y_block):.1e}")
    s.numbers.update(shapes=[tuple(t.shape) for _, t, _ in steps], diff=max_abs(y_steps, y_block))
    return s


def against_library() -> Section:
    """Our block against nn.MultiheadAttention with the same weights: outputs, weights, the causal mask."""
    s = Section("against_library", "our MultiHeadAttention against torch.nn.MultiheadAttention, same weights")
    block, x = small_block()
    mha = torch.nn.MultiheadAttention(16, 4, batch_first=True).eval()
    copy_attention(block, mha)  # our qkv_proj is laid out as in_proj_weight: (3 D, D), no transpose needed
    causal = causal_mask(5)  # (5, 5) bool, True = attend
    with torch.no_grad():
        y_ours, w_ours = block(x, x, x)
        y_lib, w_lib = mha(x, x, x, need_weights=True, average_attn_weights=False)
        y_ours_c, _ = block(x, x, x, causal)
        y_lib_c, _ = mha(x, x, x, attn_mask=~causal)  # nn.MultiheadAttention: True = may NOT attend
    n_params = sum(t.numel() for t in mha.parameters())
    s.say(f"library output {tuple(y_lib.shape)}, weights {tuple(w_lib.shape)}")
    s.say(f"output : max abs difference {max_abs(y_ours, y_lib):.1e}   (document, its own draw: 4.8e-07)")
    s.say(f"weights: max abs difference {max_abs(w_ours, w_lib):.1e}   (document, its own draw: 1.2e-07)")
    s.say(
        f"with the causal mask (library gets ~mask): max abs difference {max_abs(y_ours_c, y_lib_c):.1e}"
        "   (document: 3.6e-07)"
    )
    s.say(
        f"parameters: {n_params} = 4 x 16 x 16 + 4 x 16; ours: {sum(t.numel() for t in block.parameters())}"
    )
    s.numbers.update(
        output=max_abs(y_ours, y_lib),
        weights=max_abs(w_ours, w_lib),
        causal=max_abs(y_ours_c, y_lib_c),
        params=n_params,
    )
    return s


def parameters() -> Section:
    """4 D² + 4 D parameters for every H that divides D: heads split the width, they add nothing."""
    s = Section("parameters", "parameters of one multi-head attention block, for every H")
    per_head = 3 * 8 * 512 * 64
    s.say(
        f"8 heads x three 512 x 64 matrices: 3 x 8 x 512 x 64 = {per_head:,}"
        f" = 3 x 512 x 512 = {3 * 512 * 512:,}"
    )
    counts = {}
    for d_model, heads in ((512, (1, 8, 16, 64)), (16, (1, 4))):
        for H in heads:
            counts[(d_model, H)] = sum(t.numel() for t in MultiHeadAttention(d_model, H).parameters())
        formula = 4 * d_model**2 + 4 * d_model
        s.say(
            f"D = {d_model}: H = {', '.join(map(str, heads))} -> "
            f"{', '.join(f'{counts[(d_model, H)]:,}' for H in heads)}  (4 D² + 4 D = {formula:,})"
        )
    s.say(f"as a list, H in (1, 8, 64): {[counts[(512, H)] for H in (1, 8, 64)]}")
    s.numbers.update(per_head=per_head, counts=counts)
    return s


def flops(T: int, D: int, H: int = 8) -> dict[str, int]:
    """FLOPs of one forward pass of our block on (1, T, D), counted by PyTorch: projections and attention."""
    block = MultiHeadAttention(D, H).to("meta")  # shapes only: the counter needs no numbers
    x = torch.empty(1, T, D, device="meta")  # (1, T, D)
    with torch.no_grad(), FlopCounterMode(display=False) as total:
        block(x, x, x)
    with torch.no_grad(), FlopCounterMode(display=False) as attention:
        q = torch.empty(1, H, T, D // H, device="meta")  # (1, H, T, Dh)
        scaled_dot_product_attention(q, q, q)
    return {
        "projections": total.get_total_flops() - attention.get_total_flops(),
        "attention": attention.get_total_flops(),
    }


def cost() -> Section:
    """8 T D² for the four projections, 4 T² D for the scores and the weighted sums: equal at T = 2 D."""
    s = Section("cost", "the cost of self-attention, counted by torch.utils.flop_counter on our block")
    counted = {}
    for T, D in ((512, 512), (1024, 512), (2048, 1024)):
        counted[(T, D)] = flops(T, D)
        proj, att = counted[(T, D)]["projections"], counted[(T, D)]["attention"]
        s.say(
            f"T = {T}, D = {D}: projections {proj / 1e9:.2f} GFLOP (8 T D² = {8 * T * D * D / 1e9:.2f}), "
            f"scores + weighted sums {att / 1e9:.2f} GFLOP (4 T² D = {4 * T * T * D / 1e9:.2f})"
        )
    s.say("the two parts cost the same at T = 2 D: 1024 for D = 512, 2048 for D = 1024")
    s.numbers.update(counted=counted)
    return s


def cross_shapes() -> Section:
    """Cross-attention with B = 2, Tq = 5, Tk = 7, D = 64, H = 4: every shape."""
    s = Section("cross_shapes", "cross-attention shapes: B 2, Tq 5, Tk 7, D 64, H 4 (d_k 16)")
    block = MultiHeadAttention(64, 4, self_attention=False)
    queries_in, memory = torch.randn(2, 5, 64), torch.randn(2, 7, 64)  # (B, Tq, D), (B, Tk, D)
    D, w = 64, block.qkv_proj.weight.detach()
    q = split_heads(queries_in @ w[:D].T, 4)  # (2, 4, 5, 16)
    v = split_heads(memory @ w[2 * D :].T, 4)  # (2, 4, 7, 16)
    with torch.no_grad():
        out, weights = block(queries_in, memory, memory)  # (2, 5, 64), (2, 4, 5, 7)
    shapes = {
        "queries": tuple(q.shape),
        "keys and values": tuple(v.shape),
        "weights": tuple(weights.shape),
        "per-head outputs": tuple((weights @ v).shape),
        "output": tuple(out.shape),
    }
    for name, shape in shapes.items():
        s.say(f"{name:<18} {shape}")
    s.numbers.update(shapes)
    return s


def permutation() -> Section:
    """Self-attention is permutation-equivariant without a mask; the causal mask breaks it."""
    s = Section(
        "permutation", "permutation equivariance: shuffle the tokens, the outputs shuffle the same way"
    )
    torch.manual_seed(0)
    block = MultiHeadAttention(64, 4).double().eval()
    x, perm = torch.randn(1, 10, 64, dtype=torch.float64), torch.randperm(10)
    causal = torch.nn.Transformer.generate_square_subsequent_mask(
        10, dtype=torch.float64
    )  # additive 0 / -inf
    with torch.no_grad():
        plain = torch.allclose(block(x, x, x)[0][:, perm], block(*(x[:, perm],) * 3)[0])
        masked = torch.allclose(block(x, x, x, causal)[0][:, perm], block(*(x[:, perm],) * 3, causal)[0])
    s.say(f"no mask: attn(x)[perm] == attn(x[perm]): {plain}")
    s.say(f"causal mask (the additive form, generate_square_subsequent_mask): {masked}")
    s.numbers.update(plain=plain, masked=masked)
    return s
