"""The released-model walk-through: our attention inside Helsinki-NLP/opus-mt-en-de.

    python lesson/released_model.py --model hf:Helsinki-NLP/opus-mt-en-de   # or a local Hugging Face folder
    python lesson/released_model.py --model random [--random-size reduced|full]

``from_marian`` turns the Marian model into ours (same weights). For ONE sentence, right-padded with
``--pad`` pad tokens (as in a batch beside a longer sentence), the script prints (layers and heads counted
from 0, as the block names; the tables are in ``released_tables.py``) the shapes of one attention block's
projections and its parameters counted on the model, then:

1. the per-block differences between our ``MultiHeadAttention`` and Marian's own ``MarianAttention``:
   encoder self (padding mask), decoder self (causal mask), cross (padding mask). Forward hooks catch every
   block's output and weights in both models, each running its own forward pass;
2. the plain float32 formula (``x @ W + b`` with ``W = q_proj.weight.T`` etc., scores divided by √d_k, -inf
   mask) on the three blocks of layer 0, fed the inputs Marian's blocks received, beside ours; the three
   uses' shapes (input -> weights -> output) and their largest |output|;
3. for one source token (``--query-token``), the top 2 keys of each head of one encoder layer's
   self-attention (``--encoder-layer``, default 0);
4. the top source token of each head (and of their mean) of one decoder layer's cross-attention
   (``--layer``, default the penultimate), a row per decoder position: the token it reads -> the token it
   predicts; then, for one row (``--target-token``, the token it reads) of one layer (``--cross-layer``),
   the top 3 source tokens of the heads' mean;
5. the word alignment from that layer's cross-attention, heads averaged, sub-words merged into words
   (``transformer.inference.alignment``: the rule ``translate.py --alignments`` uses);
6. the last decoder layer's self-attention, heads averaged (its first 5 × 5), and the largest weight any
   decoder self-attention gives the future;
7. what each of the eight classic mistakes of ``lesson/mistakes.py`` does to each block: every block of
   ours is fed the inputs Marian's block received (caught by forward pre-hooks) and computed correctly and
   then with each mistake; the figure is the max |difference| from Marian's block output;
8. the walk-through's mistakes 1 (no scale: top weights with and without it) and 3 (split or merge without
   the transpose: the shapes look right) on part 3's encoder block, as the walk-through computes them.

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

import released_tables as tables
import torch
import torch.nn.functional as F
from mistakes import MISTAKES, attend, merge_no_transpose, multi_head_with, split_no_transpose

from transformer.core.attention import merge_heads, split_heads
from transformer.core.decoding import greedy_decode, max_lengths
from transformer.core.masks import decoder_self_mask, padding_mask
from transformer.inference.alignment import WORD_START
from transformer.interop.marian import MarianError, _transformers, from_marian

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


class WalkThroughError(Exception):
    """A question the model cannot answer: a layer it does not have, a token the source does not hold."""


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
    parser.add_argument("--layer", type=int, help="decoder layer of parts 4 and 5, from 0, negative from the "
                        "end (default: the penultimate)")  # fmt: skip
    parser.add_argument("--encoder-layer", type=int, help="encoder layer of part 3, from 0, negative from "
                        "the end (default: 0, the first)")  # fmt: skip
    parser.add_argument("--query-token", help="source piece of parts 3 and 8, with or without its leading ▁ "
                        "(default: the first of the longest pieces that start a word)")  # fmt: skip
    parser.add_argument("--cross-layer", type=int, help="decoder layer of part 4's top 3, from 0 (default: "
                        "--layer's)")  # fmt: skip
    parser.add_argument("--target-token", help="the piece read by the row of part 4's top 3, matched as "
                        "--query-token (default: the first of the longest word starts read)")  # fmt: skip
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
    """{block name: (our MultiHeadAttention, Marian's MarianAttention, kind)}, kind: encoder | decoder |
    cross (the kinds of ``lesson/mistakes.py``)."""
    pairs = {}
    for i, (a, b) in enumerate(zip(ours.encoder.layers, hf_model.model.encoder.layers)):
        pairs[f"encoder.{i}.self"] = (a.self_attn, b.self_attn, "encoder")
    for i, (a, b) in enumerate(zip(ours.decoder.layers, hf_model.model.decoder.layers)):
        pairs[f"decoder.{i}.self"] = (a.self_attn, b.self_attn, "decoder")
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


# -------- the walk-through ----------------------------------------------------------------------------


def layer_index(flag: str, value: int | None, count: int, stack: str, default: int) -> int:
    """``value`` (from 0, negative from the end) checked against the ``count`` layers of ``stack``."""
    if value is None:
        return default
    if not -count <= value < count:
        raise WalkThroughError(
            f"{flag} {value}: the model has {count} {stack} layers, 0 to {count - 1} (or -{count} to -1 "
            "from the end)"
        )
    return value % count


def query_position(pieces: list[str], text: str | None, flag: str = "--query-token",
                   where: str = "the source") -> int:  # fmt: skip
    """The first piece spelled ``text``, as a word start (▁text) first, then as written; by default the
    first of the longest pieces that start a word."""
    if text is None:
        starts = [i for i, piece in enumerate(pieces) if piece.startswith(WORD_START)] or range(len(pieces))
        return max(starts, key=lambda i: len(pieces[i]))
    for spelling in (WORD_START + text.removeprefix(WORD_START), text):
        if spelling in pieces:
            return pieces.index(spelling)
    raise WalkThroughError(f"{flag} {text}: not a piece of {where}; its pieces: {pieces}")


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


def marian_io(marian: tuple[dict, dict], name: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(query input (1, Tq, D), key = value input (1, Tk, D), output (1, Tq, D)) of Marian's block."""
    their_inputs, their_outputs = marian
    hidden, key_value = their_inputs[name]
    return hidden, hidden if key_value is None else key_value, their_outputs[name][0]


def plain_formula(block, x_q: torch.Tensor, x_kv: torch.Tensor, mask: torch.Tensor) -> tuple:
    """The walk-through's plain formula on one MarianAttention: its nn.Linear weights (out, in) read as the
    paper's x @ W matrices, Eq. 1 with / √d_k, the mask as -inf. -> (output (1, Tq, D), weights)."""
    H = block.num_heads
    W_Q, W_K, W_V, W_O = (p.weight.T for p in (block.q_proj, block.k_proj, block.v_proj, block.out_proj))
    Q = split_heads(x_q @ W_Q + block.q_proj.bias, H)  # (1, H, Tq, Dh)
    K = split_heads(x_kv @ W_K + block.k_proj.bias, H)  # (1, H, Tk, Dh)
    V = split_heads(x_kv @ W_V + block.v_proj.bias, H)  # (1, H, Tk, Dh)
    scores = Q @ K.transpose(-2, -1) / math.sqrt(Q.size(-1))  # (1, H, Tq, Tk)
    weights = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)  # (1, H, Tq, Tk)
    return merge_heads(weights @ V) @ W_O + block.out_proj.bias, weights  # (1, Tq, D), (1, H, Tq, Tk)


def plain_rows(pairs: dict, marian: tuple[dict, dict], masks: dict) -> dict[str, dict[str, float]]:
    """The blocks of layer 0, ours and the plain formula fed Marian's inputs: max |Δ| from its output, and
    the plain formula's shapes (query input, key and value input, weights, output)."""
    rows = {}
    for name in ("encoder.0.self", "decoder.0.self", "decoder.0.cross"):
        ours, theirs, kind = pairs[name]
        hidden, key, want = marian_io(marian, name)
        out, weights = plain_formula(theirs, hidden, key, masks[kind])  # (1, Tq, D), (1, H, Tq, Tk)
        rows[name] = {
            "ours": max_diff(ours(hidden, key, key, masks[kind])[0], want),
            "plain": max_diff(out, want),
            "scale": want.abs().max().item(),
            "kind": kind,
            "shapes": [tuple(x.shape) for x in (hidden, key, weights, out)],
        }
    return rows


def text_mistakes(block, x: torch.Tensor, want: torch.Tensor, mask: torch.Tensor) -> dict:
    """The walk-through's mistakes 1 and 3 on one encoder self-attention block of ours, fed Marian's input x
    (1, S, D), each against Marian's output ``want``: the weights without the scale, the heads split with
    view(B, H, S, Dh) and no transpose (and merged back by reshape, as the walk-through does), the right
    split merged by reshape."""
    H, D, w, b = block.n_heads, block.d_model, block.qkv_proj.weight, block.qkv_proj.bias
    right, weights = block(x, x, x, mask)  # (1, S, D), (1, H, S, S)
    no_scale, no_scale_weights = multi_head_with(block, x, x, mask, "encoder", "no_scale")  # (1, H, S, S)
    projected = [F.linear(x, w[i * D : (i + 1) * D], b[i * D : (i + 1) * D]) for i in range(3)]  # (1, S, D)
    q, k, v = (split_no_transpose(p, H) for p in projected)  # (1, H, S, Dh) each, tokens mixed
    heads, _ = attend(q, k, v, mask)  # (1, H, S, Dh)
    split = block.out_proj(merge_no_transpose(heads))  # (1, S, D)
    merge, _ = multi_head_with(block, x, x, mask, "encoder", "merge_no_transpose")  # (1, S, D)
    right_split = split_heads(projected[0], H)  # (1, H, S, Dh)
    return {
        "weights": weights[0], "no_scale_weights": no_scale_weights[0], "no_scale": max_diff(no_scale, want),
        "split_shapes": [tuple(z.shape) for z in (q, k, v)], "right_split": tuple(right_split.shape),
        "split": max_diff(split, want), "merge_shape": tuple(merge.shape), "right_shape": tuple(right.shape),
        "merge": max_diff(merge, want), "right": max_diff(right, want),
    }  # fmt: skip


def mistake_rows(pairs: dict, marian: tuple[dict, dict], masks: dict) -> dict[str, dict]:
    """Each of our blocks on the inputs Marian's block received: max |Δ| from Marian's block output, done
    right ("ours") and with each mistake (None where it changes nothing: a causal mask on a causal block)."""
    rows = {}
    for name, (block, _, kind) in pairs.items():
        hidden, key, want = marian_io(marian, name)
        rows[name] = {"ours": max_diff(block(hidden, key, key, masks[kind])[0], want)}
        for mistake in MISTAKES:
            if mistake == "causal_everywhere" and kind == "decoder":
                rows[name][mistake] = None
                continue
            wrong, _ = multi_head_with(block, hidden, key, masks[kind], kind, mistake)  # (1, Tq, D)
            rows[name][mistake] = max_diff(wrong, want)
    return rows


@dataclass
class Sentence:
    """The source, padded, and the decoder's rows: row i reads ``read[i]`` and predicts ``predicted[i]``."""

    src: torch.Tensor  # (1, S + pad)
    src_pieces: list[str]  # S, EOS included, no padding
    tgt_in: torch.Tensor  # (1, T): the start token, then the translation shifted right
    read: list[str]  # T pieces of tgt_in
    predicted: list[str]  # T pieces: the translation, then EOS if it ended
    n_target: int  # the translation's length, without EOS


def sentence(released: Released, ours, args, log=print) -> Sentence:
    """The source padded with --pad pad tokens and its translation (see ``translation``), both logged."""
    pad, eos = released.hf_model.config.pad_token_id, released.hf_model.config.eos_token_id
    src_ids = released.encode_source(args.source)  # with EOS
    log(f"source: {args.source}\nsource pieces: {released.pieces(src_ids)} + {args.pad} × <pad>")
    src = torch.tensor([src_ids + [pad] * args.pad])  # (1, S + pad)
    hyp, ended = translation(ours, released, src, args, log)
    predicted = hyp + [eos] if ended else hyp  # what each decoder row predicts
    tgt_in = torch.tensor([[ours.start_id] + predicted[:-1]])  # (1, T): what each decoder row reads
    read = released.pieces(tgt_in[0].tolist())
    return Sentence(src, released.pieces(src_ids), tgt_in, read, released.pieces(predicted), len(hyp))


def choices(hf_config, src_pieces: list[str], args: argparse.Namespace) -> dict:
    """The layers and the source token asked for, checked before anything runs."""
    n_encoder, n_decoder = hf_config.encoder_layers, hf_config.decoder_layers
    layer = layer_index("--layer", args.layer, n_decoder, "decoder", max(n_decoder - 2, 0))
    return {
        "layer": layer,
        "cross_layer": layer_index("--cross-layer", args.cross_layer, n_decoder, "decoder", layer),
        "encoder_layer": layer_index("--encoder-layer", args.encoder_layer, n_encoder, "encoder", 0),
        "query": query_position(src_pieces, args.query_token),
    }


def walk_through(released: Released, args: argparse.Namespace, log=print) -> dict:
    """The eight parts for one sentence; returns their figures."""
    hf_model = released.hf_model.to(getattr(torch, args.dtype)).eval()
    src_pieces = released.pieces(released.encode_source(args.source))
    pick = choices(hf_model.config, src_pieces, args)
    ours = from_marian(hf_model).eval()
    pairs, pad = attention_pairs(ours, hf_model), hf_model.config.pad_token_id
    log(f"model: {released.description}")
    tables.print_layout(pairs, hf_model.config, log)
    s = sentence(released, ours, args, log)
    pick["target"] = query_position(s.read, args.target_token, "--target-token", "the decoder's input")
    rows, our_outputs, marian = block_differences(pairs, ours, hf_model, s.src, s.tgt_in, pad)
    tables.print_blocks(rows, args.dtype, log)
    masks = {
        "encoder": padding_mask(s.src, pad),  # (1, 1, 1, S + pad)
        "decoder": decoder_self_mask(s.tgt_in, pad),  # (1, 1, T, T)
        "cross": padding_mask(s.src, pad),  # (1, 1, 1, S + pad)
    }
    plain = plain_rows(pairs, marian, masks)
    tables.print_plain(plain, args.dtype, log)
    figures = tables.print_reading(our_outputs, s, pick, hf_model.config, log)
    mistakes = mistake_rows(pairs, marian, masks)
    tables.print_mistakes(mistakes, log)
    name = f"encoder.{pick['encoder_layer']}.self"
    hidden, _, want = marian_io(marian, name)
    text = text_mistakes(pairs[name][0], hidden, want, masks["encoder"])
    title = tables.layer_title("encoder", pick["encoder_layer"], hf_model.config.encoder_layers)
    tables.print_text_mistakes(text, s.src_pieces, pick["query"], title, log)
    return {"blocks": rows, "plain": plain, "mistakes": mistakes, "text_mistakes": text, **pick, **figures}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        released = load_model(args)
        with torch.no_grad():
            walk_through(released, args)
    except (MarianError, WalkThroughError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
