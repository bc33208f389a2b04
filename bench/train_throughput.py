"""Training throughput of our hand-written model vs the same model built on torch.nn.Transformer.

Both get the same embeddings, positions, output layer, batches (real Multi30k token-bucket batches when the
data is there, else random ones of the same shape) and optimizer; steps (forward + backward + Adam) are
interleaved, ours / theirs / ours / ..., and we compare the medians of target tokens per second.

    python bench/train_throughput.py [--data-dir ../shared/data/multi30k] [--steps 20] [--sizes default base]

Last line: ratio_vs_torch=<ours tokens/s ÷ PyTorch tokens/s on the default config's sizes>.
"""

import argparse
import statistics
import time
from pathlib import Path

import torch
from torch import nn

from transformer.config import ModelConfig, load_config
from transformer.evaluation import token_loss
from transformer.masks import causal_mask
from transformer.model import Transformer

ROOT = Path(__file__).resolve().parent.parent
SIZES = {
    "default": load_config(ROOT / "configs/multi30k_de_en.yaml").model,
    "base": load_config(ROOT / "configs/base.yaml").model,
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


def real_batches(data_dir: str | None, max_tokens: int, n: int):
    """n Multi30k training batches (token ids from a small joint BPE), or None when there is no data."""
    import tempfile

    from transformer.data import encode_split, iter_batches, load_multi30k, make_batches
    from transformer.tokenizer import train_tokenizer

    try:
        corpus = load_multi30k("de", "en", data_dir)
    except Exception as error:  # noqa: BLE001 - benchmark falls back to random batches
        print(f"no Multi30k ({error}); using random batches")
        return None, 8000
    pairs = corpus["train"]["translation"]
    with tempfile.TemporaryDirectory() as tmp:
        tok = train_tokenizer([p["de"] for p in pairs] + [p["en"] for p in pairs], Path(tmp) / "sp", 8000)
    src, tgt = encode_split(corpus["train"], tok, "de", "en")
    batches = make_batches([len(s) for s in src], [len(t) for t in tgt], max_tokens, True, seed=0)
    return list(iter_batches(src, tgt, batches[:n], 0, 2, 3)), tok.vocab_size


def measure(sizes: ModelConfig, batches, vocab: int, steps: int) -> tuple[float, float]:
    torch.manual_seed(0)
    ours = Transformer(sizes, vocab, vocab, 0)
    theirs = TorchTransformerMT(Transformer(sizes, vocab, vocab, 0))
    models = {"ours": ours, "torch": theirs}
    optimizers = {k: torch.optim.Adam(m.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9) for k, m in models.items()}
    rates = {k: [] for k in models}
    for i in range(steps + 2):  # the first two rounds warm up the allocator and caches
        batch = batches[i % len(batches)]
        for name, model in models.items():
            model.train()
            t0 = time.perf_counter()
            loss = token_loss(model(batch.src, batch.tgt_in), batch.tgt_out, 0, 0.1) / batch.n_tgt_tokens
            optimizers[name].zero_grad(set_to_none=True)
            loss.backward()
            optimizers[name].step()
            if i >= 2:
                rates[name].append(batch.n_tgt_tokens / (time.perf_counter() - t0))
    return statistics.median(rates["ours"]), statistics.median(rates["torch"])


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--max-tokens", type=int, default=4000)
    parser.add_argument("--sizes", nargs="+", default=["default", "base"], choices=list(SIZES))
    args = parser.parse_args()
    batches, vocab = real_batches(args.data_dir, args.max_tokens, args.steps)
    if batches is None:
        from transformer.data import collate

        gen = torch.Generator().manual_seed(0)
        pairs = [(torch.randint(4, vocab, (15,), generator=gen).tolist(),) * 2 for _ in range(120)]
        batches = [collate(pairs, range(120), 0, 2, 3)]
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {len(batches)} batches")
    ratios = {}
    for name in args.sizes:
        ours, theirs = measure(SIZES[name], batches, vocab, args.steps)
        ratios[name] = ours / theirs
        print(f"{name:8s} ours {ours:8.0f} tgt tok/s   torch {theirs:8.0f} tgt tok/s   ratio {ratios[name]:.3f}")
    print(f"ratio_vs_torch={ratios.get('default', next(iter(ratios.values()))):.3f}")


if __name__ == "__main__":
    main()
