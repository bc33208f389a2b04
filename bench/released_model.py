"""The released-model walk-through: our attention inside Helsinki-NLP/opus-mt-en-de.

    python bench/released_model.py --model hf:Helsinki-NLP/opus-mt-en-de   # or a local Hugging Face folder
    python bench/released_model.py --model random [--random-size reduced|full]

``from_marian`` turns the Marian model into ours (same weights). For ONE sentence, right-padded with
``--pad`` pad tokens (as in a batch beside a longer sentence), the script prints:

1. the per-block differences between our ``MultiHeadAttention`` and Marian's own ``MarianAttention``:
   encoder self (padding mask), decoder self (causal mask), cross (padding mask). Forward hooks catch every
   block's output and weights in both models, each running its own forward pass;
2. the top source tokens per head: for each target token, the source token each head of one decoder
   layer's cross-attention attends to most;
3. the word alignment table from that layer's cross-attention, heads averaged, sub-words merged into words
   (``transformer.alignment``: the rule ``translate.py --alignments`` uses);
4. what each of the three classic mistakes (no 1/√d_k, masking after the softmax, head split without the
   transpose) does to each block: every block of ours is fed the inputs Marian's block received (caught by
   forward pre-hooks) and computed correctly and then with each mistake, written here, not in the package;
   the figure is the max |difference| from Marian's block output.

The translation is our greedy one (checked against ``generate(num_beams=1)``) unless ``--target`` gives one
to teacher-force. Offline (no Hugging Face Hub access and nothing in its cache), ``hf:NAME`` falls back,
loudly, to a RANDOM seeded Marian model with opus-mt-en-de's layout (its config: swish, post-norm, scaled
and tied embeddings, halves sinusoids, EOS 0, UNK 1, PAD last and the decoder start), at reduced (default)
or full size, with a small SentencePiece model trained here on a few sentences; its figures are about our
code, not about opus-mt, and it teacher-forces the German reference of the default sentence.
"""

import argparse
import io
import math
import socket
import sys
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

import torch
import torch.nn.functional as F

from transformer.alignment import word_alignment, word_index
from transformer.attention import MultiHeadAttention, merge_heads, split_heads
from transformer.decoding import greedy_decode, max_lengths
from transformer.interop.marian import MarianError, _transformers, from_marian
from transformer.masks import decoder_self_mask, padding_mask

ROOT = Path(__file__).resolve().parent.parent

SOURCE = "Two young dogs are playing in the snow."
REFERENCE = "Zwei junge Hunde spielen im Schnee."  # teacher-forced by the random fallback
# What the random fallback's SentencePiece model learns from: the default pair and a few more.
SENTENCES = [
    SOURCE, REFERENCE,
    "A man in a blue shirt is standing on a ladder.", "Ein Mann in einem blauen Hemd steht auf einer Leiter.",
    "Two men are playing football in the park.", "Zwei Männer spielen Fußball im Park.",
    "A young girl is running through the snow.", "Ein junges Mädchen läuft durch den Schnee.",
    "The dogs are playing with a red ball.", "Die Hunde spielen mit einem roten Ball.",
    "A woman is sitting on a bench in the sun.", "Eine Frau sitzt auf einer Bank in der Sonne.",
]  # fmt: skip
# opus-mt-en-de's config.json; "reduced" keeps everything but the sizes.
OPUS_MT_EN_DE = dict(
    vocab_size=58101, d_model=512, encoder_layers=6, decoder_layers=6, encoder_attention_heads=8,
    decoder_attention_heads=8, encoder_ffn_dim=2048, decoder_ffn_dim=2048, max_position_embeddings=512,
    activation_function="swish", scale_embedding=True, static_position_embeddings=True,
    pad_token_id=58100, eos_token_id=0, bos_token_id=0, decoder_start_token_id=58100,
    forced_eos_token_id=None, share_encoder_decoder_embeddings=True, tie_word_embeddings=True,
)  # fmt: skip
REDUCED = dict(
    d_model=128, encoder_layers=2, decoder_layers=2, encoder_ffn_dim=512, decoder_ffn_dim=512,
    max_position_embeddings=128,
)  # fmt: skip
MISTAKES = ("no_scale", "mask_after_softmax", "split_no_transpose")
MISTAKE_TITLES = {"no_scale": "no 1/√d_k", "mask_after_softmax": "mask after softmax",
                  "split_no_transpose": "split w/o transpose"}  # fmt: skip


@dataclass
class Released:
    """A Marian model and how to read text with it."""

    hf_model: object  # transformers.MarianMTModel, eager attention (weights come back through the hooks)
    encode_source: object  # text -> ids, EOS included
    encode_target: object  # text -> ids, EOS included
    pieces: object  # ids -> sub-word strings
    description: str
    is_random: bool


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="hf:Helsinki-NLP/opus-mt-en-de",
                        help="hf:NAME, a local Hugging Face Marian folder, or 'random'")  # fmt: skip
    parser.add_argument("--random-size", choices=("reduced", "full"), default="reduced")
    parser.add_argument("--seed", type=int, default=0, help="of the random fallback")
    parser.add_argument("--source", default=SOURCE)
    parser.add_argument("--target", help="teacher-force this translation (default: our greedy one)")
    parser.add_argument("--pad", type=int, default=3, help="pad tokens after the sentence (padding masks)")
    parser.add_argument("--layer", type=int, help="decoder layer of parts 2 and 3 (default: penultimate)")
    parser.add_argument("--max-len-offset", type=int, default=50)
    parser.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    return parser.parse_args(argv)


# -------- the model: a released one, or the random fallback ------------------------------------------


def hub_reachable(timeout: float = 3.0) -> bool:
    """Whether the Hugging Face Hub answers at all (from_pretrained retries for ~40 s before failing)."""
    from huggingface_hub import constants

    host = urlparse(constants.ENDPOINT).hostname or "huggingface.co"
    if constants.HF_HUB_OFFLINE:
        return False
    try:
        socket.create_connection((host, 443), timeout=timeout).close()
    except OSError:
        return False
    return True


def load_released(name: str) -> Released:
    """A local folder or a hub name (its cache first); OSError when neither is there."""
    transformers = _transformers()
    local = Path(name).is_dir()
    kwargs = dict(attn_implementation="eager")
    try:
        hf_model = transformers.MarianMTModel.from_pretrained(name, local_files_only=True, **kwargs)
        tokenizer = transformers.MarianTokenizer.from_pretrained(name, local_files_only=True)
    except OSError:
        if local or not hub_reachable():
            raise
        hf_model = transformers.MarianMTModel.from_pretrained(name, **kwargs)
        tokenizer = transformers.MarianTokenizer.from_pretrained(name)
    return Released(
        hf_model=hf_model.eval(),
        encode_source=lambda text: tokenizer(text).input_ids,
        encode_target=lambda text: tokenizer(text_target=text).input_ids,
        pieces=tokenizer.convert_ids_to_tokens,
        description=f"{name} (released weights)",
        is_random=False,
    )


def train_sentencepiece(sentences: list[str], vocab_size: int = 120):
    """A small SentencePiece model in Marian's layout: </s> 0, <unk> 1, no BOS; PAD comes after it."""
    import sentencepiece as spm

    proto = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(sentences), model_writer=proto, vocab_size=vocab_size, model_type="bpe",
        eos_id=0, unk_id=1, bos_id=-1, pad_id=-1, hard_vocab_limit=False, character_coverage=1.0,
        shuffle_input_sentence=False, num_threads=1, minloglevel=2,
    )  # fmt: skip
    return spm.SentencePieceProcessor(model_proto=proto.getvalue())


def randomise(hf_model, seed: int) -> None:
    """Weights that make attention neither uniform nor one-hot: linear layers N(0, 1.5² / fan-in), so that
    scores have a standard deviation of ~2; embeddings N(0, 1 / d_model); LayerNorms off 1 / 0."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in hf_model.named_parameters():
            noise = torch.randn(parameter.shape, generator=g, dtype=torch.float64)
            if "embed_positions" in name:
                continue  # the sinusoids
            if name.endswith("layer_norm.weight"):
                parameter.copy_(1.0 + 0.1 * noise)
            elif "shared" in name or "embed_tokens" in name:
                parameter.copy_(noise / math.sqrt(hf_model.config.d_model))
            elif parameter.dim() == 2:
                parameter.copy_(1.5 * noise / math.sqrt(parameter.size(1)))
            else:
                parameter.copy_(0.1 * noise)
        hf_model.final_logits_bias.copy_(torch.randn(hf_model.final_logits_bias.shape, generator=g))


def random_released(size: str, seed: int) -> Released:
    """A seeded random MarianMTModel with opus-mt-en-de's layout and a SentencePiece model trained here."""
    transformers = _transformers()
    sp = train_sentencepiece(SENTENCES)
    V = sp.get_piece_size()
    values = dict(OPUS_MT_EN_DE)
    if size == "reduced":  # the SentencePiece pieces, then PAD (opus-mt's PAD is its last id too)
        values |= REDUCED | dict(vocab_size=V + 1, pad_token_id=V, decoder_start_token_id=V)
    hf_config = transformers.MarianConfig(**values)
    hf_config._attn_implementation = "eager"
    hf_model = transformers.MarianMTModel(hf_config).eval()
    randomise(hf_model, seed)
    pad = hf_config.pad_token_id

    def pieces(ids: list[int]) -> list[str]:
        return ["<pad>" if i == pad else sp.id_to_piece(i) if i < V else f"<id {i}>" for i in ids]

    sizes = f"d_model {hf_config.d_model}, {hf_config.encoder_layers}+{hf_config.decoder_layers} layers"
    heads = hf_config.encoder_attention_heads
    return Released(
        hf_model=hf_model,
        encode_source=lambda text: sp.encode(text) + [0],
        encode_target=lambda text: sp.encode(text) + [0],
        pieces=pieces,
        description=f"RANDOM Marian, opus-mt-en-de layout, {size} size ({sizes}, {heads} heads, vocabulary "
        f"{hf_config.vocab_size}: {V} SentencePiece pieces trained here), seed {seed}",
        is_random=True,
    )


def load_model(args: argparse.Namespace, log=print) -> Released:
    if args.model == "random":
        return random_released(args.random_size, args.seed)
    name = args.model.removeprefix("hf:")
    if not args.model.startswith("hf:") and not Path(name).is_dir():
        raise MarianError(f"--model {args.model}: not a folder; a hub model is hf:NAME, or 'random'")
    try:
        return load_released(name)
    except OSError as error:
        if not args.model.startswith("hf:"):
            raise MarianError(f"cannot load {name}: {str(error).splitlines()[0]}") from None
        banner = (
            f"!!! OFFLINE: {name} is neither reachable on the Hugging Face Hub nor in its cache.\n"
            f"!!! FALLING BACK TO A RANDOM SEEDED MARIAN MODEL with opus-mt-en-de's layout "
            f"({args.random_size} size).\n!!! The figures below are about our code, NOT about {name}."
        )
        log(banner)
        print(banner, file=sys.stderr)
        return random_released(args.random_size, args.seed)


# -------- hooks ---------------------------------------------------------------------------------------


def attention_pairs(ours, hf_model) -> dict[str, tuple]:
    """{block name: (our MultiHeadAttention, Marian's MarianAttention, kind)}, kind: self | causal | cross."""
    pairs = {}
    for i, (a, b) in enumerate(zip(ours.encoder.layers, hf_model.model.encoder.layers)):
        pairs[f"encoder.{i}.self"] = (a.self_attn, b.self_attn, "self")
    for i, (a, b) in enumerate(zip(ours.decoder.layers, hf_model.model.decoder.layers)):
        pairs[f"decoder.{i}.self"] = (a.self_attn, b.self_attn, "causal")
        pairs[f"decoder.{i}.cross"] = (a.cross_attn, b.encoder_attn, "cross")
    return pairs


def caught(modules: dict[str, torch.nn.Module], run) -> tuple[dict, dict]:
    """Run ``run()``; return each module's (inputs: hidden_states, key_value_states) and outputs."""
    inputs, outputs, hooks = {}, {}, []
    for name, module in modules.items():

        def pre_hook(m, args, kwargs, name=name):
            hidden = args[0] if args else kwargs["hidden_states"]
            key_value = args[1] if len(args) > 1 else kwargs.get("key_value_states")
            inputs.setdefault(name, (hidden, key_value))

        hooks.append(module.register_forward_pre_hook(pre_hook, with_kwargs=True))
        hooks.append(module.register_forward_hook(lambda m, a, out, name=name: outputs.setdefault(name, out)))
    try:
        run()
    finally:
        for hook in hooks:
            hook.remove()
    return inputs, outputs


# -------- the three classic mistakes, written here (the package's attention stays correct) ---------------


def split_no_transpose(x: torch.Tensor, n_heads: int) -> torch.Tensor:
    B, T, D = x.shape
    return x.reshape(B, n_heads, T, D // n_heads)  # (B, H, T, Dh), time steps mixed into heads


def merge_no_transpose(x: torch.Tensor) -> torch.Tensor:
    B, H, T, Dh = x.shape
    return x.reshape(B, T, H * Dh)  # (B, T, D)


def attention_with(module: MultiHeadAttention, query, key, value, mask, mistake: str) -> torch.Tensor:
    """``module``'s multi-head attention with one of the MISTAKES -> output (B, Tq, D)."""
    H, D = module.n_heads, module.d_model
    w, b = module.qkv_proj.weight, module.qkv_proj.bias
    split = split_no_transpose if mistake == "split_no_transpose" else split_heads
    merge = merge_no_transpose if mistake == "split_no_transpose" else merge_heads
    q, k, v = (
        split(F.linear(x, w[i * D : (i + 1) * D], b[i * D : (i + 1) * D]), H)
        for i, x in enumerate((query, key, value))
    )  # 3 × (B, H, T, Dh)
    scores = q @ k.transpose(-2, -1)  # (B, H, Tq, Tk)
    if mistake != "no_scale":
        scores = scores / math.sqrt(q.size(-1))
    if mistake == "mask_after_softmax":
        weights = torch.softmax(scores, dim=-1).masked_fill(~mask, 0.0)  # not renormalised
    else:
        weights = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)  # (B, H, Tq, Tk)
    return module.out_proj(merge(weights @ v))  # (B, Tq, D)


# -------- the walk-through ----------------------------------------------------------------------------


def translation(ours, released: Released, src: torch.Tensor, args, log=print) -> tuple[list[int], bool]:
    """(the target ids without EOS, whether it ended with EOS): --target, the random fallback's reference,
    or our greedy translation, which is checked against ``generate(num_beams=1)``."""
    hf_config = released.hf_model.config
    pad, eos = hf_config.pad_token_id, hf_config.eos_token_id
    text = args.target or (REFERENCE if released.is_random and args.source == SOURCE else None)
    if text is not None:
        log(f"target: {text}  (given, teacher-forced)")
        return [i for i in released.encode_target(text) if i != eos], True
    start_id = ours.start_id
    hyp = greedy_decode(ours, src, args.max_len_offset)[0]
    limit = int(max_lengths(ours, src, args.max_len_offset)[0])
    settings = _transformers().GenerationConfig(
        decoder_start_token_id=start_id, pad_token_id=pad, eos_token_id=eos, max_new_tokens=limit,
        bad_words_ids=[[i] for i in sorted({pad, start_id} - {eos})], num_beams=1, do_sample=False,
    )  # fmt: skip
    theirs = released.hf_model.generate(input_ids=src, attention_mask=src != pad, generation_config=settings)
    theirs = [i for i in theirs[0, 1:].tolist() if i != pad]
    same = hyp == (theirs[:-1] if theirs and theirs[-1] == eos else theirs)
    log(f"target: {released.pieces(hyp)}  (our greedy translation; generate(num_beams=1) gives the same: "
        f"{'yes' if same else 'NO'})")  # fmt: skip
    return hyp, len(hyp) < limit


def max_diff(ours: torch.Tensor, theirs: torch.Tensor) -> float:
    return (ours - theirs).abs().max().item()


def block_differences(pairs: dict, ours, hf_model, src, tgt_in, pad: int) -> tuple[dict, dict, dict]:
    """Both models on (src, tgt_in), hooks on every attention block -> (per-block rows, our outputs,
    Marian's (inputs, outputs))."""
    _, our_outputs = caught({n: p[0] for n, p in pairs.items()}, lambda: ours(src, tgt_in))
    their_inputs, their_outputs = caught(
        {n: p[1] for n, p in pairs.items()},
        lambda: hf_model(input_ids=src, attention_mask=src != pad, decoder_input_ids=tgt_in),
    )
    rows = {}
    for name in pairs:
        (out, weights), (their_out, their_weights) = our_outputs[name], their_outputs[name][:2]
        rows[name] = {
            "output": max_diff(out, their_out),
            "weights": max_diff(weights, their_weights),
            "scale": their_out.abs().max().item(),
            "kind": pairs[name][2],
        }
    return rows, our_outputs, (their_inputs, their_outputs)


def mistake_rows(pairs: dict, marian: tuple[dict, dict], masks: dict) -> dict[str, dict[str, float]]:
    """Each of our blocks on the inputs Marian's block received: max |Δ| from Marian's block output, done
    right ("ours") and with each mistake."""
    their_inputs, their_outputs = marian
    rows = {}
    for name, (module, _, kind) in pairs.items():
        hidden, key_value = their_inputs[name]
        key = hidden if key_value is None else key_value
        want = their_outputs[name][0]  # (1, Tq, D)
        rows[name] = {"ours": max_diff(module(hidden, key, key, masks[kind])[0], want)}
        for mistake in MISTAKES:
            rows[name][mistake] = max_diff(
                attention_with(module, hidden, key, key, masks[kind], mistake), want
            )
    return rows


def words(pieces: list[str]) -> list[str]:
    """Sub-word pieces merged into words (the rule of ``transformer.alignment``)."""
    index = word_index(pieces)
    merged = [""] * (index[-1] + 1 if index else 0)
    for piece, word in zip(pieces, index):
        merged[word] += piece
    return [word.replace("\u2581", "") or "\u2581" for word in merged]


def print_blocks(rows: dict, dtype: str, log=print) -> None:
    log(f"\n== 1. per-block differences, our attention vs Marian's modules (forward hooks, {dtype}) ==")
    log(f"{'block':<18} {'mask':<8} {'output max|Δ|':>14} {'weights max|Δ|':>15} {'max|output|':>12}")
    for name, row in rows.items():
        mask = {"self": "padding", "causal": "causal", "cross": "padding"}[row["kind"]]
        log(f"{name:<18} {mask:<8} {row['output']:14.2e} {row['weights']:15.2e} {row['scale']:12.3f}")


def print_top_sources(weights: torch.Tensor, src_pieces: list[str], tgt_pieces: list[str], layer: int,
                      log=print) -> None:  # fmt: skip
    """weights (H, T, S) of one layer's cross-attention, padding columns dropped."""
    H = weights.size(0)
    log(f"\n== 2. top source token per head: decoder layer {layer} cross-attention (weight) ==")
    log(f"{'target':<12}" + "".join(f" {'head ' + str(h):<13}" for h in range(H)))
    best_weight, best = weights.max(dim=-1)  # (H, T) each
    for t, label in enumerate(tgt_pieces):
        cells = [f"{src_pieces[best[h, t]][:8]} {best_weight[h, t]:.2f}" for h in range(H)]
        log(f"{label[:12]:<12}" + "".join(f" {cell:<13}" for cell in cells))


def print_alignment(weights: torch.Tensor, src_pieces: list[str], tgt_pieces: list[str], layer: int,
                    log=print) -> list[tuple[int, int]]:  # fmt: skip
    """weights (T', S') heads averaged, rows/columns with EOS; the pieces without EOS."""
    pairs = word_alignment(weights, src_pieces, tgt_pieces)
    src_words, tgt_words = words(src_pieces), words(tgt_pieces)
    log(f"\n== 3. word alignment: decoder layer {layer} cross-attention, heads averaged, sub-words merged ==")
    log(f"{'target word':<16} source word(s)")
    for j, word in enumerate(tgt_words):
        linked = [f"{i}:{src_words[i]}" for i, k in pairs if k == j]
        log(f"{str(j) + ':' + word:<16} {', '.join(linked) or '-'}")
    log("pharaoh (source-target): " + " ".join(f"{i}-{j}" for i, j in pairs))
    return pairs


def print_mistakes(rows: dict, log=print) -> None:
    log("\n== 4. the classic mistakes: max |Δ| from Marian's block, each block fed Marian's own inputs ==")
    titles = ["ours"] + [MISTAKE_TITLES[m] for m in MISTAKES]
    log(f"{'block':<18}" + "".join(f" {title:>20}" for title in titles))
    for name, row in rows.items():
        log(f"{name:<18}" + "".join(f" {row[key]:20.2e}" for key in ("ours", *MISTAKES)))


def walk_through(released: Released, args: argparse.Namespace, log=print) -> dict:
    """The four parts for one sentence; returns their figures."""
    dtype = getattr(torch, args.dtype)
    hf_model = released.hf_model.to(dtype).eval()
    ours = from_marian(hf_model).eval()
    pad, eos = hf_model.config.pad_token_id, hf_model.config.eos_token_id
    src_ids = released.encode_source(args.source)  # with EOS
    src = torch.tensor([src_ids + [pad] * args.pad])  # (1, S + pad)
    log(f"model: {released.description}")
    log(f"source: {args.source}\nsource pieces: {released.pieces(src_ids)} + {args.pad} × <pad>")
    hyp, ended = translation(ours, released, src, args, log)
    predicted = hyp + [eos] if ended else hyp  # what each decoder row predicts
    tgt_in = torch.tensor([[ours.start_id] + predicted[:-1]])  # (1, T)
    pairs = attention_pairs(ours, hf_model)
    rows, our_outputs, marian = block_differences(pairs, ours, hf_model, src, tgt_in, pad)
    print_blocks(rows, args.dtype, log)
    layer = max(len(ours.decoder.layers) - 2, 0) if args.layer is None else args.layer
    layer %= len(ours.decoder.layers)
    cross = our_outputs[f"decoder.{layer}.cross"][1][0, :, :, : len(src_ids)].float()  # (H, T, S)
    src_pieces, tgt_pieces = released.pieces(src_ids), released.pieces(predicted)
    print_top_sources(cross, src_pieces, tgt_pieces, layer, log)
    alignment = print_alignment(cross.mean(dim=0), src_pieces[:-1], tgt_pieces[: len(hyp)], layer, log)
    masks = {
        "self": padding_mask(src, pad),  # (1, 1, 1, S)
        "causal": decoder_self_mask(tgt_in, pad),  # (1, 1, T, T)
        "cross": padding_mask(src, pad),  # (1, 1, 1, S)
    }
    mistakes = mistake_rows(pairs, marian, masks)
    print_mistakes(mistakes, log)
    return {"blocks": rows, "mistakes": mistakes, "alignment": alignment, "layer": layer}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        released = load_model(args)
        with torch.no_grad():
            walk_through(released, args)
    except MarianError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
