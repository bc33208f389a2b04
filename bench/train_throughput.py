"""Training throughput of our hand-written model, with and without the fast tier, vs the same model built on
torch.nn.Transformer.

All three get the same embeddings, positions, output layer, batches (real Multi30k token-bucket batches;
without the data the script refuses to run rather than time made-up ones) and optimizer; steps (forward +
backward + Adam) are interleaved, ours / plain / theirs / ours / ..., and we compare the medians of target
tokens per second. Each runs its own training step: ours as ``train.py`` does by default (the fast tier's
modules, the decoder's features, then ``output_loss``: the output layer and loss by blocks of rows, padding
rows skipped), the plain core's as with ``train.fast: false`` and nn.Transformer's the textbook way (logits,
then ``token_loss``); the FLOPs counted are the same for all.

    python bench/train_throughput.py [--data-dir DIR] [--steps 20] [--sizes default base]
                                     [--precisions fp32 bf16] [--device cuda --max-tokens 25000] [--compile]

Each precision (autocast; fp32 master weights and Adam state) runs both models, every batch through each
(model, precision) in turn. Model FLOP utilisation (MFU): the model's matmul FLOPs per step (forward ×3 for
forward + backward) ÷ step time ÷ the roofline: on a CPU, a 1024³ matmul in that precision measured by this
script first; on CUDA, the GPU's peak dense throughput (``--peak-tflops``).

Last lines: ratio_fast_vs_plain_<precision>=<ours ÷ the plain core's tokens/s> and
ratio_vs_torch_<precision>=<ours tokens/s ÷ PyTorch tokens/s>, on the default config's sizes, for each
precision, then ratio_vs_torch= (the first precision's).
"""

import argparse
import copy
import statistics
import sys
import time
from pathlib import Path

import torch
from torch import nn

from transformer.core.config import ModelConfig, TrainConfig
from transformer.core.loss import token_loss
from transformer.core.masks import causal_mask
from transformer.core.model import Transformer
from transformer.core.optim import make_optimizer, set_lr
from transformer.fast.output_loss import output_loss
from transformer.fast.twins import speed_up
from transformer.runtime.configs import load_config
from transformer.runtime.memory import keep_freed_memory
from transformer.runtime.precision import size_onednn_cache

ROOT = Path(__file__).resolve().parent.parent
SIZES = {
    "default": load_config(ROOT / "transformer/configs/multi30k_de_en.yaml").model,
    "base": load_config(ROOT / "transformer/configs/base.yaml").model,
}


class TorchTransformerMT(nn.Module):
    """The same translation model, its stacks from nn.Transformer; embeddings and output from ours."""

    def __init__(self, ours: Transformer):
        super().__init__()
        c: ModelConfig = ours.config
        self.pad_id = ours.pad_id
        self.encoder_embed, self.decoder_embed = ours.encoder, ours.decoder  # reuse embedding + positions
        self.core = nn.Transformer(
            c.d_model, c.n_heads, c.n_encoder_layers, c.n_decoder_layers, c.d_ff, c.dropout,
            batch_first=True, norm_first=c.norm_first,
        )  # fmt: skip
        if not c.norm_first:  # nn.Transformer always adds final norms; the paper's post-norm has none
            self.core.encoder.norm = None
            self.core.decoder.norm = None
        self.output_proj = nn.Linear(c.d_model, ours.output_proj.out_features, bias=False)
        self.output_proj.weight = ours.output_proj.weight

    def forward(self, src, tgt_in):
        e = self.encoder_embed
        d = self.decoder_embed
        x_src = e.dropout(e.positions(e.embedding(src)))  # (B, S, D)
        x_tgt = d.dropout(d.positions(d.embedding(tgt_in)))  # (B, T, D)
        out = self.core(
            x_src,
            x_tgt,
            tgt_mask=~causal_mask(tgt_in.size(1), src.device),  # PyTorch: True = blocked
            src_key_padding_mask=src == self.pad_id,
            tgt_key_padding_mask=tgt_in == self.pad_id,
            memory_key_padding_mask=src == self.pad_id,
        )
        return self.output_proj(out)  # (B, T, V)


def real_batches(data_dir: str | None, max_tokens: int, n: int, vocab_size: int = 8000):
    """n Multi30k training batches of at most ``max_tokens`` padded tokens (token ids from a joint BPE of
    ``vocab_size``); returns (batches, vocabulary size).

    Without the data this raises ``DataError``: throughput and MFU of made-up batches would mean nothing.
    """
    import tempfile

    from transformer.core.batches import iter_batches, make_batches
    from transformer.training.multi30k import load_multi30k
    from transformer.training.splits import encode_split
    from transformer.training.tokenizer_job import train_tokenizer

    corpus = load_multi30k("de", "en", data_dir)
    train = corpus["train"]
    with tempfile.TemporaryDirectory() as tmp:
        tok = train_tokenizer(train.src + train.tgt, Path(tmp) / "sp", vocab_size)
    src, tgt = encode_split(train, tok)
    batches = make_batches([len(s) for s in src], [len(t) for t in tgt], max_tokens, True, seed=0)
    return list(iter_batches(src, tgt, batches[:n], 0, 2, 3)), tok.vocab_size


def step_flops(c: ModelConfig, B: int, S: int, T: int, V: int) -> float:
    """Matmul FLOPs of one training step on a padded (B, S) / (B, T) batch: 3 × the forward's."""
    D, F_ = c.d_model, c.d_ff
    encoder = c.n_encoder_layers * (2 * B * S * (4 * D * D + 2 * D * F_) + 4 * B * S * S * D)
    decoder = c.n_decoder_layers * (
        2 * B * T * (6 * D * D + 2 * D * F_)  # self-attention q, k, v, out + cross q, out + FFN
        + 2 * B * S * 2 * D * D  # cross-attention k, v of the memory
        + 4 * B * T * T * D  # self-attention scores and values
        + 4 * B * T * S * D  # cross-attention scores and values
    )
    output = 2 * B * T * D * V
    return 3.0 * (encoder + decoder + output)


def measure(
    sizes: ModelConfig,
    batches,
    vocab: int,
    steps: int,
    device: str,
    dtypes: dict[str, torch.dtype | None],
    compile_backend: str | None = None,
) -> dict:
    """{(model, precision): (median target tokens/s, median model FLOP/s)} over ``steps`` steps, model in
    "ours" | "plain" | "torch" and precision a key of ``dtypes``; every batch goes through each (model,
    precision) in turn (ours fp32, plain fp32, torch fp32, ours bf16, ...), so that a slower spell of the
    machine hits them all.

    On the CPU every batch goes through every (model, precision) once before the timed steps: bf16 matmuls
    there run a oneDNN kernel compiled for their shape, which training compiles in its first epoch and then
    keeps (``runtime.size_onednn_cache``); timing first sightings would time the compiler. On CUDA, which
    compiles no kernel per shape, 2 warm-up steps (3 compiled), and the GPU script's time shares stay.

    ``compile_backend`` (e.g. "inductor"): our model runs under ``torch.compile(dynamic=True)``, as with
    ``train.compile``; nn.Transformer stays eager. Compilation happens in the warm-up rounds.
    """
    torch.manual_seed(0)
    plain = Transformer(sizes, vocab, vocab, 0, 2, 3).to(device)
    ours = speed_up(copy.deepcopy(plain))  # the same weights, the fast tier's modules
    theirs = TorchTransformerMT(Transformer(sizes, vocab, vocab, 0, 2, 3))
    models = {"ours": ours, "plain": plain, "torch": theirs.to(device)}
    if compile_backend is not None:
        models["ours"] = torch.compile(ours, dynamic=True, backend=compile_backend)
    warmup = (len(batches) if device == "cpu" else 2) + (compile_backend is not None)  # kernels, compiler
    optimizers = {k: make_optimizer(m, TrainConfig()) for k, m in models.items()}  # train.py's Adam, for both
    for optimizer in optimizers.values():
        set_lr(optimizer, 1e-4)
    keys = [(name, precision) for precision in dtypes for name in models]
    rates, flops_per_s = {k: [] for k in keys}, {k: [] for k in keys}
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    for i in range(steps + warmup):
        batch = batches[i % len(batches)].to(device)
        B, S, T = batch.src.size(0), batch.src.size(1), batch.tgt_in.size(1)
        for name, precision in keys:
            model, dtype = models[name], dtypes[precision]
            model.train()
            sync()
            t0 = time.perf_counter()
            train_step(name == "ours", model, batch, optimizers[name], device, dtype)
            sync()
            seconds = time.perf_counter() - t0
            if i >= warmup:
                rates[name, precision].append(batch.n_tgt_tokens / seconds)
                flops_per_s[name, precision].append(step_flops(sizes, B, S, T, vocab) / seconds)
    return {k: (statistics.median(rates[k]), statistics.median(flops_per_s[k])) for k in keys}


def train_step(fast: bool, model: nn.Module, batch, optimizer, device: str, dtype) -> None:
    """One step: forward, backward, Adam. ``fast``: train.py's (features, then the projection + loss by blocks
    of rows); else the plain core's and the textbook one (logits (B, T, V), then the loss)."""
    with torch.autocast(device.split(":")[0], dtype=dtype, enabled=dtype is not None):
        if fast:
            features = model(batch.src, batch.tgt_in, project=False)
            loss = output_loss(features, model.output_proj, batch.tgt_out, 0, 0.1)
        else:
            loss = token_loss(model(batch.src, batch.tgt_in), batch.tgt_out, 0, 0.1)
    optimizer.zero_grad(set_to_none=True)
    (loss / batch.n_tgt_tokens).backward()
    optimizer.step()


MATMULS = ("aten::mm", "aten::addmm", "aten::addmm_", "aten::bmm", "aten::baddbmm")


def profile(sizes: ModelConfig, batches, vocab: int, dtype: torch.dtype | None, steps: int = 6) -> None:
    """Where ours and nn.Transformer's training steps spend the CPU's time (``--profile``): every batch once
    (the warm-up of ``measure``), then ``steps`` steps under torch.profiler; prints each one's share in
    matmuls and its top operators by self CPU time."""
    torch.manual_seed(0)
    models = {"ours": speed_up(Transformer(sizes, vocab, vocab, 0, 2, 3)),
              "torch": TorchTransformerMT(Transformer(sizes, vocab, vocab, 0, 2, 3))}  # fmt: skip
    for name, model in models.items():
        optimizer = make_optimizer(model.train(), TrainConfig())
        for batch in batches:
            train_step(name == "ours", model, batch, optimizer, "cpu", dtype)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profiled:
            for batch in batches[:steps]:
                train_step(name == "ours", model, batch, optimizer, "cpu", dtype)
        ops = sorted(profiled.key_averages(), key=lambda op: op.self_cpu_time_total, reverse=True)
        total = sum(op.self_cpu_time_total for op in ops)
        matmuls = sum(op.self_cpu_time_total for op in ops if op.key in MATMULS)
        top = ", ".join(f"{op.key} {op.self_cpu_time_total / total:.1%}" for op in ops[:8])
        print(f"profile {name}: {total / 1e6 / steps:.3f} s of CPU per step, matmuls {matmuls / total:.1%}; "
              f"top: {top}", flush=True)  # fmt: skip


def matmul_roofline(device: str, dtype: torch.dtype | None, n: int = 1024, repeats: int = 20) -> float:
    """FLOP/s of one (n, n) @ (n, n) matmul in ``dtype`` on ``device``, measured here: the ceiling that a
    model's matmuls can reach on this machine (what MFU is measured against on a CPU)."""
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    a, b = (torch.randn(n, n, device=device).to(dtype or torch.float32) for _ in range(2))
    for _ in range(3):
        a @ b
    sync()
    start = time.perf_counter()
    for _ in range(repeats):
        a @ b
    sync()
    return 2.0 * n**3 * repeats / (time.perf_counter() - start)


DTYPES = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--max-tokens", type=int, default=4000)
    parser.add_argument("--sizes", nargs="+", default=["default", "base"], choices=list(SIZES))
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--precisions", nargs="+", default=["fp32", "bf16"], choices=list(DTYPES))
    parser.add_argument("--peak-tflops", type=float, default=989.0, help="GPU peak (H100/H200 bf16: 989)")
    parser.add_argument("--compile", action="store_true", help="our model under torch.compile (inductor)")
    parser.add_argument("--profile", action="store_true", help="then where each step's CPU time goes")
    args = parser.parse_args()
    dtypes = {precision: DTYPES[precision] for precision in args.precisions}
    from transformer.runtime.lines import DataError

    try:
        batches, vocab = real_batches(args.data_dir, args.max_tokens, args.steps)
    except DataError as error:
        print(f"error: no Multi30k data ({error}); pass --data-dir or set MULTI30K_DIR", file=sys.stderr)
        return 1
    cuda = args.device.startswith("cuda")
    where = torch.cuda.get_device_name() if cuda else f"{torch.get_num_threads()} threads"
    print(f"torch {torch.__version__}, {args.device} ({where}), {len(batches)} batches", flush=True)
    for dtype in dtypes.values():
        size_onednn_cache(torch.device(args.device), dtype)  # as train.py does, before the first bf16 matmul
    keep_freed_memory(torch.device(args.device))  # as train.py does: for every model measured here
    roofline = {p: matmul_roofline(args.device, dtype) for p, dtype in dtypes.items()}
    measured = ", ".join(f"{p} {flops / 1e9:.0f} GFLOP/s" for p, flops in roofline.items())
    print(f"roofline (a 1024³ matmul, measured here): {measured}", flush=True)
    ratios, fast_vs_plain = {}, {}
    for name in args.sizes:
        backend = "inductor" if args.compile else None
        result = measure(SIZES[name], batches, vocab, args.steps, args.device, dtypes, backend)
        for precision in dtypes:
            (ours, ours_flops), (theirs, theirs_flops) = result["ours", precision], result["torch", precision]
            ratios[name, precision] = ours / theirs
            peak = args.peak_tflops * 1e12 if cuda else roofline[precision]
            print(f"{name:8s} {precision}  ours {ours:7.0f} tgt tok/s  torch {theirs:7.0f} tgt tok/s  ratio "
                  f"{ours / theirs:.3f}   ours {ours_flops / 1e9:.1f} GFLOP/s, MFU ours "
                  f"{ours_flops / peak:.1%} torch {theirs_flops / peak:.1%}", flush=True)  # fmt: skip
        for precision in dtypes:
            fast_vs_plain[name, precision] = result["ours", precision][0] / result["plain", precision][0]
            print(f"{name:8s} {precision}  plain core {result['plain', precision][0]:7.0f} tgt tok/s: ours "
                  f"(fast) ÷ plain {fast_vs_plain[name, precision]:.3f}", flush=True)  # fmt: skip
        if "fp32" in dtypes and len(dtypes) > 1:
            for precision in (p for p in dtypes if p != "fp32"):
                speedup = result["ours", precision][0] / result["ours", "fp32"][0]
                print(f"{name:8s} ours {precision} ÷ ours fp32: {speedup:.3f}", flush=True)
    first = args.sizes[0] if "default" not in args.sizes else "default"
    for precision in dtypes:
        print(f"ratio_fast_vs_plain_{precision}={fast_vs_plain[first, precision]:.3f}")
    for precision in dtypes:
        print(f"ratio_vs_torch_{precision}={ratios[first, precision]:.3f}")
    print(f"ratio_vs_torch={ratios[first, args.precisions[0]]:.3f}")
    if args.profile:
        for precision, dtype in dtypes.items():
            print(f"{first} {precision}:", flush=True)
            profile(SIZES[first], batches, vocab, dtype)


if __name__ == "__main__":
    sys.exit(main())
