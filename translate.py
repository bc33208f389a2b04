"""Translate text with a trained checkpoint: one line in, one line out.

    python translate.py --checkpoint RUN/best.pt "Ein Hund rennt im Schnee."
    python translate.py --checkpoint RUN/best.pt --beam 4 --input test.de --output test.hyp.en
    python translate.py --checkpoint RUN/best.pt --input test.de --reference test.en --attention RUN/attn
    cat test.de | python translate.py --checkpoint RUN/best.pt > test.hyp.en
    python translate.py --checkpoint RUN/best.pt --beam 4 --nbest 4 --input test.de > test.nbest
    python translate.py --checkpoint RUN/best.pt --input test.de --score-reference test.en --alignments a.txt
    python translate.py --checkpoint RUN/best.pt --stream      # a line in, its translation out, flushed
    python translate.py --checkpoint hf:Helsinki-NLP/opus-mt-en-de --attention attn/ "A dog runs."  # released

Everything needed (model, tokenizer, config) comes from the checkpoint, through
``transformer.translator.Translator`` (the Python API: this script adds only files and formats). Decoding is
batched by length (``--max-tokens``) and the translations come back in input order.
"""

import argparse
import io
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from transformer.alignment import pharaoh
from transformer.checkpoint import CheckpointError
from transformer.config import PRECISIONS
from transformer.corpus import split_lines
from transformer.evaluation import bleu_chrf
from transformer.plotting import add_attention_figures
from transformer.runtime import DeviceError
from transformer.translator import SentenceAttention, Translator, warn

EPILOG = """\
stdout holds the translations only, exactly one line per input line, in input order; warnings,
errors and the --reference scores go to stderr.
  - An empty (or blank) line gives an empty line; the model is not run on it.
  - A line longer than the model allows (model.max_positions - eval.max_len_offset - 1 tokens, so that
    the source with its EOS and up to eval.max_len_offset more output tokens fit the position table) is
    truncated to that length, with a warning naming the line.
  - Invalid UTF-8: the undecodable bytes are replaced by U+FFFD and a warning names the line.
  - A translation has at most (source tokens + 1) + eval.max_len_offset tokens, EOS included (§6.1).
Other outputs (log-probs are natural logs summed over the tokens and EOS, as the search scores them):
  --with-scores        LOG_PROB<TAB>TRANSLATION (a blank input line still gives an empty line)
  --nbest N            N lines per input: LINE_NO<TAB>RANK<TAB>SCORE<TAB>LOG_PROB<TAB>TRANSLATION, RANK from
                       1 by SCORE = LOG_PROB / ((5 + TOKENS) / 6) ** --length-penalty, what beam search ranks
                       by (TOKENS counts EOS); LOG_PROB need not decrease (a blank input line gives one line
                       "LINE_NO<TAB>1<TAB>0.000000<TAB>0.000000<TAB>")
  --score-reference F  no search: LOG_PROB<TAB>TOKENS<TAB>LOG_PROB/TOKENS (the mean per token, not --nbest's
                       SCORE) of each reference line given its input line (TOKENS counts EOS; a blank input
                       line gives 0.000000<TAB>0<TAB>0.000000)
  --alignments F       one line per input: Pharaoh "i-j" pairs, 0-based source word i, target word j (of
                       the 1-best, or of the --score-reference line), from the cross-attention of decoder
                       layer --align-layer averaged over heads, sub-words merged into words
                       (docs/alignments.md)
  --attention-out F    numpy .npz: line_<n>/cross (L, H, T, S), line_<n>/encoder_self (L, H, S, S),
                       line_<n>/decoder_self (L, H, T, T), line_<n>/source_pieces (S,), line_<n>/target_pieces
                       (T, what each row predicted), line_<n>/input_pieces (T, what each row read)
With --attention DIR, each non-empty input line n gets DIR/line_<n>_cross_layer_<i>.png (mean of
the heads of decoder layer i), DIR/line_<n>_cross_heads_layer_<last>.png (every head of the last
layer) and DIR/line_<n>_cross_top_sources.md (the top source tokens of every head for each target
token), computed by one forward pass over (source, translation), or over (source, reference) with
--score-reference; the same go to TensorBoard (tensorboard --logdir DIR).
--stream (the default when stdin is a terminal) reads stdin a line at a time and writes and flushes each
line's output before reading the next; the model is loaded once.
Exit status: 0 on success, 1 on an error (one line on stderr), 2 on a usage error.
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
    parser.add_argument(
        "--checkpoint", required=True,
        help="a checkpoint written by train.py, a Hugging Face Marian folder, or hf:NAME (e.g. "
        "hf:Helsinki-NLP/opus-mt-en-de): a released model, run by our code with its own tokenizer",
    )  # fmt: skip
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
    add_output_arguments(parser)
    args = parser.parse_args(argv)
    if args.sentences and args.input is not None:
        parser.error("give SENTENCEs or --input, not both")
    check_output_arguments(parser, args)
    if args.beam is not None and args.beam < 1:
        parser.error(f"--beam must be >= 1, got {args.beam}")
    if args.length_penalty is not None and args.length_penalty < 0:
        parser.error(f"--length-penalty must be >= 0, got {args.length_penalty}")
    if args.max_tokens is not None and args.max_tokens < 1:
        parser.error(f"--max-tokens must be >= 1, got {args.max_tokens}")
    return args


def add_output_arguments(parser) -> None:
    parser.add_argument(
        "--nbest", type=int, default=None, metavar="N",
        help="write the N best translations of each line with their ranking scores and log-probs "
        "(N <= --beam; see below)",
    )  # fmt: skip
    parser.add_argument("--with-scores", action="store_true", help="prefix each translation by its log-prob")
    parser.add_argument(
        "--score-reference", default=None, metavar="FILE",
        help="no search: score these translations, one per input line (see below)",
    )  # fmt: skip
    parser.add_argument("--alignments", default=None, metavar="FILE", help="write Pharaoh word alignments")
    parser.add_argument(
        "--align-layer", type=int, default=None, metavar="L",
        help="decoder layer for --alignments, from 0, negative from the end (default: the penultimate)",
    )  # fmt: skip
    parser.add_argument(
        "--attention-out", default=None, metavar="FILE.npz", help="write every attention weight (see below)"
    )
    parser.add_argument(
        "--stream", action=argparse.BooleanOptionalAction, default=None,
        help="translate stdin line by line, flushing each answer (default: when stdin is a terminal)",
    )  # fmt: skip
    parser.add_argument(
        "--precision", default="auto", choices=PRECISIONS,
        help="autocast as in validation: auto = bf16 on CUDA, fp32 on the CPU (default: auto)",
    )  # fmt: skip


def check_output_arguments(parser, args) -> None:
    """Usage errors among the output options, before anything is loaded."""
    if args.nbest is not None and args.nbest < 1:
        parser.error(f"--nbest must be >= 1, got {args.nbest}")
    if args.score_reference is not None:
        for flag, given in (("--nbest", args.nbest), ("--with-scores", args.with_scores),
                            ("--beam", args.beam), ("--reference", args.reference)):  # fmt: skip
            if given:
                parser.error(f"--score-reference scores given translations: no search, so no {flag}")
    from_stdin = not args.sentences and args.input in (None, "-")
    if args.stream is None:
        refs = args.reference is not None or args.score_reference is not None
        args.stream = from_stdin and not refs and sys.stdin is not None and sys.stdin.isatty()
    elif args.stream and not from_stdin:
        parser.error("--stream reads stdin: no SENTENCEs or --input FILE")
    elif args.stream and (args.reference is not None or args.score_reference is not None):
        parser.error("--stream cannot be used with --reference or --score-reference (they need every line)")


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


def stream_lines():
    """(line number, text) of each stdin line as soon as it arrives, with the same UTF-8 policy."""
    n = 0
    for data in iter(sys.stdin.buffer.readline, b""):
        n += 1
        # split_lines numbers the lines of its input: this one is line n of stdin
        yield n, split_lines(data, "<stdin>", lambda m, n=n: warn(m.replace(" line 1:", f" line {n}:", 1)))[0]


# ------------------------------------------------------------------------------------------ output


@dataclass
class Record:
    """What one input line gave: its output lines, and the pair its attention is drawn for."""

    lines: list[str]  # output lines (several with --nbest)
    text: str  # the 1-best translation ("" for a blank line or --score-reference)
    source: list[int] | None  # source ids, None for a blank line
    target: list[int]  # the 1-best translation's ids, or the reference's
    ended: bool  # whether the target ends with EOS (a reference does; a translation unless cut off)


class Outputs:
    """Every output file of a run, written line by line (and flushed: ``--stream``)."""

    def __init__(self, args, translator: Translator):
        self.args, self.translator, self.texts = args, translator, []
        self.out = open_output(args.output, "--output")
        self.align = open_output(args.alignments, "--alignments") if args.alignments else None
        self.arrays: dict[str, np.ndarray] | None = {} if args.attention_out else None
        self.writer = None
        if args.attention is not None:
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(str(args.attention))

    def write(self, records: list[Record], first: int) -> None:
        """The records of input lines first, first + 1, ..."""
        self.texts += [r.text for r in records]
        write_lines(self.out, [line for r in records for line in r.lines])
        needs_attention = self.align is not None or self.arrays is not None or self.writer is not None
        alignments = []
        for n, r in enumerate(records, start=first):
            if r.source is None or not needs_attention:
                alignments.append("")
                continue
            attention = self.translator.attention_ids(r.source, r.target, r.ended)
            if self.align is not None:
                alignments.append(pharaoh(self.translator.alignments_of(attention, self.args.align_layer)))
            if self.arrays is not None:
                self.arrays |= attention_arrays(f"line_{n:05d}", attention)
            if self.writer is not None:
                self.draw(f"line_{n:05d}", attention, r)
        if self.align is not None:
            write_lines(self.align, alignments)

    def draw(self, tag: str, attention: SentenceAttention, record: Record) -> None:
        """Cross-attention heatmaps (PNG and TensorBoard) and the top-source table of one line."""
        tokenizer, out_dir = self.translator.tokenizer, Path(self.args.attention)
        add_attention_figures(self.writer, tag, attention.batched(), attention.labels, 0, png_dir=out_dir)
        what = "ref" if self.args.score_reference else "hyp"
        self.writer.add_text(
            f"{tag}/text",
            f"**src** {tokenizer.decode(record.source)}  \n**{what}** {tokenizer.decode(record.target)}",
            0,
        )

    def close(self, references: list[str] | None) -> None:
        for path, stream in ((self.args.output, self.out), (self.args.alignments, self.align)):
            if path not in (None, "-"):
                stream.close()
        if self.writer is not None:
            self.writer.close()
        if self.arrays is not None:
            try:
                np.savez_compressed(self.args.attention_out, **self.arrays)
            except OSError as error:
                raise InputError(f"cannot write --attention-out {self.args.attention_out}: {error}") from None
        if references is not None:
            scores = bleu_chrf(self.texts, references)
            print(
                f"BLEU {scores['bleu']:.2f} chrF {scores['chrf']:.2f}\n{scores['signature']}", file=sys.stderr
            )


def attention_arrays(key: str, attention: SentenceAttention) -> dict[str, np.ndarray]:
    """One sentence's weights and labels for ``--attention-out``: (L, H, Tq, Tk) per kind."""
    arrays = {f"{key}/{kind}": torch.stack(getattr(attention, kind)).numpy()  # (L, H, Tq, Tk)
              for kind in ("cross", "encoder_self", "decoder_self")}  # fmt: skip
    for name in ("source_pieces", "target_pieces", "input_pieces"):
        arrays[f"{key}/{name}"] = np.array(getattr(attention, name), dtype=str)
    return arrays


def open_output(path: str | None, what: str):
    """A binary stream to write lines to: stdout for None / '-'; the file is created now."""
    if path is None or path == "-":
        sys.stdout.flush()
        return getattr(sys.stdout, "buffer", sys.stdout)  # UTF-8 whatever the locale says
    try:
        return open(path, "wb")
    except OSError as error:
        raise InputError(f"cannot write {what} {path}: {error.strerror}") from None


def write_lines(stream, lines: list[str]) -> None:
    text = "".join(line + "\n" for line in lines)
    stream.write(text if isinstance(stream, io.TextIOBase) else text.encode("utf-8"))
    stream.flush()


# -------------------------------------------------------------------------------------------- main


def check_paths(args) -> None:
    """Every output's folder exists and the inputs do not both come from stdin: errors before any work."""
    for flag, path in (("--output", args.output), ("--alignments", args.alignments),
                       ("--attention-out", args.attention_out)):  # fmt: skip
        if path not in (None, "-") and not Path(path).parent.is_dir():
            raise InputError(f"cannot write {flag} {path}: no folder {Path(path).parent}")
    if args.attention is not None:
        try:
            Path(args.attention).mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise InputError(f"cannot create --attention folder {args.attention}: {error.strerror}") from None
    from_stdin = args.input in (None, "-") and not args.sentences
    for flag in ("--reference", "--score-reference"):
        if from_stdin and getattr(args, flag[2:].replace("-", "_")) == "-":
            raise InputError(f"the input and {flag} cannot both come from stdin")


def load_translator(args) -> Translator:
    """The model, once, with the command line's settings; checks the settings against it."""
    given = {"beam_size": args.beam, "length_penalty": args.length_penalty, "max_tokens": args.max_tokens}
    try:
        translator = Translator.from_checkpoint(
            args.checkpoint, args.device, args.precision, **{k: v for k, v in given.items() if v is not None}
        )
    except DeviceError as error:
        raise InputError(f"--{error}") from None
    beam = translator.settings.beam_size
    if args.nbest is not None and args.nbest > beam:
        raise InputError(
            f"--nbest {args.nbest} is more than the beam size {beam}: give --beam {args.nbest} or more"
        )
    n_layers = len(translator.model.decoder.layers)
    if args.align_layer is not None and not -n_layers <= args.align_layer < n_layers:
        raise InputError(
            f"--align-layer {args.align_layer}: the decoder has {n_layers} layers (0 to {n_layers - 1})"
        )
    return translator


def process(
    translator: Translator, lines: list[str], first: int, where: str, args, targets=None
) -> list[Record]:
    """The records of input lines first, first + 1, ...: translations, or scores of ``targets``."""
    sources = translator.encode(lines, where)
    if targets is not None:  # --score-reference
        scores = translator.score_ids(sources, targets)
        n_tokens = [0 if src is None else len(tgt) + 1 for src, tgt in zip(sources, targets)]
        return [
            Record([f"{score:.6f}\t{n}\t{score / max(n, 1):.6f}"], "", src, tgt, True)
            for score, n, src, tgt in zip(scores, n_tokens, sources, targets)
        ]
    found = translator.translate_ids(sources, nbest=args.nbest, with_scores=args.with_scores)
    records = []
    for n, (src, hyps) in enumerate(zip(sources, found), start=first):
        texts = [translator.decode(h.ids) for h in hyps]
        if args.nbest is not None:
            out = [
                f"{n}\t{rank}\t{h.score:.6f}\t{h.log_prob:.6f}\t{text}"
                for rank, (h, text) in enumerate(zip(hyps, texts), 1)
            ]
        elif args.with_scores and src is not None:
            out = [f"{hyps[0].log_prob:.6f}\t{texts[0]}"]
        else:
            out = [texts[0]]
        records.append(Record(out, texts[0], src, hyps[0].ids, hyps[0].ended))
    return records


def translate(args) -> None:
    check_paths(args)
    translator = load_translator(args)  # before waiting for input
    if args.stream:
        outputs = Outputs(args, translator)
        for n, line in stream_lines():
            outputs.write(process(translator, [line], n, "<stdin> line {n}".replace("{n}", str(n)), args), n)
        outputs.close(None)
        return
    if args.sentences:
        lines, where = argument_lines(args.sentences), "argument {n}"
    else:
        lines, name = read_text(args.input, "--input")
        where = name.replace("{", "{{").replace("}", "}}") + " line {n}"
    references, targets = None, None
    for flag in ("--reference", "--score-reference"):
        path = getattr(args, flag[2:].replace("-", "_"))
        if path is not None:
            references, ref_name = read_text(path, flag)
            if len(references) != len(lines):
                raise InputError(
                    f"{flag} {ref_name} has {len(references)} lines but the input has {len(lines)}"
                )
            if flag == "--score-reference":
                escaped = ref_name.replace("{", "{{").replace("}", "}}")
                targets, references = translator.encode_targets(references, escaped + " line {n}"), None
    outputs = Outputs(args, translator)
    outputs.write(process(translator, lines, 1, where, args, targets), 1)
    outputs.close(references)


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
