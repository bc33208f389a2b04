"""Translate text with a trained checkpoint: one line in, one line out.

    python translate.py --checkpoint RUN/best.pt "Ein Hund rennt im Schnee."
    python translate.py --checkpoint RUN/best.pt --beam 4 --input test.de --output test.hyp.en
    python translate.py --checkpoint RUN/best.pt --input test.de --reference test.en --attention RUN/attn
    cat test.de | python translate.py --checkpoint RUN/best.pt > test.hyp.en

Everything needed (model, tokenizer, config) comes from the checkpoint. Decoding is batched by length
(``--max-tokens``) and the translations come back in input order.
"""

import argparse
import contextlib
import dataclasses
import sys
from pathlib import Path

import torch

from transformer.checkpoint import CheckpointError, load_for_inference
from transformer.corpus import split_lines
from transformer.evaluation import bleu_chrf, sentence_attention, translate_ids
from transformer.plotting import add_attention_figures
from transformer.runtime import DeviceError, resolve_device

EPILOG = """\
stdout holds the translations only, exactly one line per input line, in input order; warnings,
errors and the --reference scores go to stderr.
  - An empty (or blank) line gives an empty line; the model is not run on it.
  - A line longer than the model allows (model.max_positions - eval.max_len_offset - 1 tokens, so that
    the source with its EOS and up to eval.max_len_offset more output tokens fit the position table) is
    truncated to that length, with a warning naming the line.
  - Invalid UTF-8: the undecodable bytes are replaced by U+FFFD and a warning names the line.
  - A translation has at most (source tokens + 1) + eval.max_len_offset tokens, EOS included (§6.1).
With --attention DIR, each non-empty input line n gets DIR/line_<n>_cross_layer_<i>.png (mean of
the heads of decoder layer i) and DIR/line_<n>_cross_heads_layer_<last>.png (every head of the last
layer), computed by one forward pass over (source, translation); the same images go to TensorBoard
(tensorboard --logdir DIR). Exit status: 0 on success, 1 on an error (one line on stderr).
"""


class InputError(RuntimeError):
    """An input, reference or output file cannot be used; the message says which and why."""


def parse_args(argv):
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("sentences", nargs="*", metavar="SENTENCE", help="sentences to translate")
    parser.add_argument("--checkpoint", required=True, help="a checkpoint written by train.py")
    parser.add_argument(
        "--input", default=None, metavar="FILE",
        help="read sentences from FILE, one per line ('-' = stdin, the default without SENTENCEs)",
    )  # fmt: skip
    parser.add_argument("--output", default=None, metavar="FILE", help="write here instead of stdout")
    parser.add_argument(
        "--beam", type=int, default=None, metavar="K",
        help="beam size; 1 = greedy (default: the checkpoint's eval.beam_size, normally 1; the paper: 4)",
    )  # fmt: skip
    parser.add_argument(
        "--length-penalty", type=float, default=None, metavar="A",
        help="beam search length penalty α (default: the checkpoint's eval.length_penalty, normally 0.6)",
    )  # fmt: skip
    parser.add_argument(
        "--reference", default=None, metavar="FILE",
        help="reference translations, one per input line: print sacreBLEU BLEU, chrF and the signature "
        "to stderr",
    )  # fmt: skip
    parser.add_argument(
        "--attention", default=None, metavar="DIR", help="write cross-attention heatmaps here (see below)"
    )
    parser.add_argument("--device", default="auto", help="auto (cuda if present), cpu, cuda, cuda:1, ...")
    parser.add_argument(
        "--max-tokens", type=int, default=None, metavar="N",
        help="batch size in padded tokens: source + an equal-length guess of the output (default: the "
        "checkpoint's eval.max_tokens)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if args.sentences and args.input is not None:
        parser.error("give SENTENCEs or --input, not both")
    if args.beam is not None and args.beam < 1:
        parser.error(f"--beam must be >= 1, got {args.beam}")
    if args.length_penalty is not None and args.length_penalty < 0:
        parser.error(f"--length-penalty must be >= 0, got {args.length_penalty}")
    if args.max_tokens is not None and args.max_tokens < 1:
        parser.error(f"--max-tokens must be >= 1, got {args.max_tokens}")
    return args


# ------------------------------------------------------------------------------------------- input


def read_text(path: str | None, what: str) -> tuple[list[str], str]:
    """The lines of a file, or of stdin for None / '-'; and the name to use in messages."""
    if path is None or path == "-":
        return split_lines(sys.stdin.buffer.read(), "<stdin>", warn), "<stdin>"
    try:
        data = Path(path).read_bytes()
    except OSError as error:
        raise InputError(f"cannot read {what} {path}: {error.strerror}") from None
    return split_lines(data, path, warn), path


def argument_lines(sentences: list[str]) -> list[str]:
    """One line per SENTENCE argument (a newline inside one is a space), with the same UTF-8 policy."""
    lines = []
    for n, sentence in enumerate(sentences, start=1):
        try:  # bytes the OS could not decode arrive as surrogate escapes
            data = sentence.encode("utf-8", "surrogateescape")
        except UnicodeEncodeError:
            data = sentence.encode("utf-8", "replace")
        text = data.decode("utf-8", errors="replace")
        if "\ufffd" in text and "\ufffd" not in sentence:
            warn(f"argument {n}: invalid UTF-8; undecodable bytes replaced by U+FFFD")
        lines.append(text.replace("\r", " ").replace("\n", " "))
    return lines


def warn(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr)


def encode_lines(lines: list[str], tokenizer, limit: int, where: str) -> list[list[int] | None]:
    """Token ids per line (None for a blank line), truncated to ``limit`` tokens with a warning.

    ``where``: how messages name line n, e.g. "test.de line {n}".
    """
    sources: list[list[int] | None] = [None] * len(lines)
    todo = [i for i, line in enumerate(lines) if line.strip()]
    for i, ids in zip(todo, tokenizer.encode_batch([lines[i] for i in todo])):
        if len(ids) > limit:
            warn(f"{where.format(n=i + 1)}: {len(ids)} tokens, truncated to the model's limit of {limit}")
            ids = ids[:limit]
        sources[i] = ids or None  # e.g. only control characters: nothing to translate
    return sources


# ------------------------------------------------------------------------------------------ output


def write_attention(model, tokenizer, sources, hyp_ids, max_len_offset: int, out_dir: Path) -> None:
    """Cross-attention heatmaps of every translated line: PNG files and TensorBoard images."""
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(out_dir))
    for n, (src_ids, hyp) in enumerate(zip(sources, hyp_ids), start=1):
        if src_ids is None:
            continue
        attention, *labels = sentence_attention(model, tokenizer, src_ids, hyp, max_len_offset)
        add_attention_figures(writer, f"line_{n:05d}", attention, labels, 0, png_dir=out_dir)
        writer.add_text(
            f"line_{n:05d}/text", f"**src** {tokenizer.decode(src_ids)}  \n**hyp** {tokenizer.decode(hyp)}", 0
        )
    writer.close()


def write_lines(lines: list[str], path: str | None) -> None:
    text = "".join(line + "\n" for line in lines)
    if path is None or path == "-":
        sys.stdout.flush()
        if hasattr(sys.stdout, "buffer"):  # UTF-8 whatever the locale says
            sys.stdout.buffer.write(text.encode("utf-8"))
            sys.stdout.buffer.flush()
        else:
            sys.stdout.write(text)
        return
    try:
        Path(path).write_text(text, encoding="utf-8")
    except OSError as error:
        raise InputError(f"cannot write --output {path}: {error.strerror}") from None


# -------------------------------------------------------------------------------------------- main


def translate(args) -> None:
    if args.output not in (None, "-") and not Path(args.output).parent.is_dir():
        raise InputError(f"cannot write --output {args.output}: no folder {Path(args.output).parent}")
    if args.attention is not None:
        try:
            Path(args.attention).mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise InputError(f"cannot create --attention folder {args.attention}: {error.strerror}") from None
    stdin_users = [args.input in (None, "-") and not args.sentences, args.reference == "-"]
    if all(stdin_users):
        raise InputError("the input and --reference cannot both come from stdin")
    try:
        device = resolve_device(args.device)
    except DeviceError as error:
        raise InputError(f"--{error}") from None
    model, tokenizer, config = load_for_inference(args.checkpoint, device)  # before waiting for input
    offset = config.eval.max_len_offset
    limit = config.model.max_positions - offset - 1  # source tokens; + EOS + offset output tokens fit
    if limit < 1:
        raise CheckpointError(
            f"model.max_positions={config.model.max_positions} leaves no room for a source with "
            f"eval.max_len_offset={offset}"
        )
    if args.sentences:
        lines, where = argument_lines(args.sentences), "argument {n}"
    else:
        lines, name = read_text(args.input, "--input")
        where = name.replace("{", "{{").replace("}", "}}") + " line {n}"
    references = None
    if args.reference is not None:
        references, ref_name = read_text(args.reference, "--reference")
        if len(references) != len(lines):
            raise InputError(
                f"--reference {ref_name} has {len(references)} lines but the input has {len(lines)}"
            )
    sources = encode_lines(lines, tokenizer, limit, where)
    todo = [i for i, ids in enumerate(sources) if ids is not None]
    given = {"beam_size": args.beam, "length_penalty": args.length_penalty, "max_tokens": args.max_tokens}
    settings = dataclasses.replace(config.eval, **{k: v for k, v in given.items() if v is not None})
    hyps_todo = translate_ids(
        model, [sources[i] for i in todo], tokenizer, device, contextlib.nullcontext, settings
    )
    hyp_ids: list[list[int]] = [[] for _ in lines]
    for i, hyp in zip(todo, hyps_todo):
        hyp_ids[i] = hyp
    # a newline inside a translation would shift every later line
    hyps = [tokenizer.decode(ids).replace("\r", " ").replace("\n", " ") for ids in hyp_ids]
    write_lines(hyps, args.output)
    if references is not None:
        scores = bleu_chrf(hyps, references)
        print(f"BLEU {scores['bleu']:.2f} chrF {scores['chrf']:.2f}\n{scores['signature']}", file=sys.stderr)
    if args.attention is not None:
        write_attention(model, tokenizer, sources, hyp_ids, offset, Path(args.attention))


def main(argv=None) -> int:
    try:
        args = parse_args(argv)
    except SystemExit as stop:  # --help, or a usage error (already printed)
        return int(stop.code or 0)
    try:
        translate(args)
    except (CheckpointError, InputError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        raise
    except (OSError, torch.cuda.OutOfMemoryError) as error:  # e.g. an unwritable --attention DIR
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BrokenPipeError:  # e.g. piped into `head`: stop quietly
        sys.stderr.close()
        sys.exit(1)
