"""Translate text with a trained checkpoint: one line in, one line out (``--help``: examples, every flag).

Everything needed (model, tokenizer, config) comes from the checkpoint, through
``transformer.inference.translator.Translator`` (the Python API: this script adds only files and formats);
the flags and their checks are in ``transformer/inference/cli_options.py``. Decoding is batched by length
(``--max-tokens``) and the translations come back in input order.
"""

import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from transformer.core.checkpoint import CheckpointError
from transformer.inference.cli_options import parse_args
from transformer.inference.inspection import Inspection
from transformer.inference.sampling import Sampling
from transformer.inference.text_lines import (
    InputError,
    argument_lines,
    open_output,
    read_constraints,
    read_prefixes,
    read_text,
    stream_lines,
    write_lines,
)
from transformer.inference.translator import Translator, warn
from transformer.interop.formats import run_folder_note
from transformer.runtime.metrics import bleu_chrf
from transformer.runtime.precision import DeviceError
from transformer.runtime.usage import USAGE_ERROR, UsageError, command_name

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
        self.args, self.texts = args, []
        self.out = open_output(args.output, "--output")
        align = open_output(args.alignments, "--alignments") if args.alignments else None
        self.inspection = Inspection(
            translator, align, args.align_layer, args.attention_out, args.attention,
            "ref" if args.score_reference else "hyp",
        )  # fmt: skip

    def write(self, records: list[Record], first: int) -> None:
        """The records of input lines first, first + 1, ..."""
        self.texts += [r.text for r in records]
        write_lines(self.out, [line for r in records for line in r.lines])
        alignments = [
            self.inspection.add(n, r.source, r.target, r.ended) for n, r in enumerate(records, first)
        ]
        if self.inspection.align_stream is not None:
            write_lines(self.inspection.align_stream, alignments)

    def close(self, references: list[str] | None) -> None:
        for path, stream in (
            (self.args.output, self.out),
            (self.args.alignments, self.inspection.align_stream),
        ):
            if path not in (None, "-"):
                stream.close()
        self.inspection.close()
        if references is not None:
            scores = bleu_chrf(self.texts, references)
            print(
                f"BLEU {scores['bleu']:.2f} chrF {scores['chrf']:.2f}\n{scores['signature']}", file=sys.stderr
            )


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
    if note := run_folder_note(args.checkpoint):
        print(f"{command_name('translate')}: {note}", file=sys.stderr)
    try:
        given = {k: v for k, v in given.items() if v is not None}
        translator = Translator.from_checkpoint(
            args.checkpoint, args.device, args.precision, fast=args.fast, **given
        )
    except DeviceError as error:
        raise InputError(f"--{error}") from None
    try:  # one the model translates into; a multilingual model needs one
        translator.target_lang = translator.language_of(args.target_lang)
        translator.language_ids()
    except ValueError as error:
        raise UsageError(f"--target-lang: {error}") from None
    beam = translator.settings.beam_size
    if args.nbest is not None and args.nbest > beam:
        raise UsageError(
            f"--nbest {args.nbest} is more than the beam size {beam}: give --beam {args.nbest} or more"
        )
    n_layers = len(translator.model.decoder.layers)
    if args.align_layer is not None and not -n_layers <= args.align_layer < n_layers:
        raise UsageError(
            f"--align-layer {args.align_layer}: the decoder has {n_layers} layers (0 to {n_layers - 1})"
        )
    return translator


def process(
    translator: Translator, lines: list[str], first: int, where: str, args, targets=None, prefixes=None,
    constraints=None,
) -> list[Record]:  # fmt: skip
    """The records of input lines first, first + 1, ...: translations (starting with ``prefixes``, holding
    ``constraints``), or scores of ``targets``."""
    sources = translator.encode(lines, where)
    if targets is not None:  # --score-reference
        scores = translator.score_ids(sources, targets)
        n_tokens = [0 if src is None else len(tgt) + 1 for src, tgt in zip(sources, targets)]
        return [
            Record([f"{score:.6f}\t{n}\t{score / max(n, 1):.6f}"], "", src, tgt, True)
            for score, n, src, tgt in zip(scores, n_tokens, sources, targets)
        ]
    sampling = (
        Sampling(args.top_k, args.top_p, args.temperature, args.seed, args.sample_unk)
        if args.sample
        else None
    )
    found = translator.translate_ids(sources, 1 if args.sample else None, args.nbest, args.with_scores,
                                     prefixes, sampling, constraints)  # fmt: skip
    records = []
    for n, (src, hyps) in enumerate(zip(sources, found), start=first):
        if not hyps[0].met:
            warn(f"{where.format(n=n)}: no translation within the length limit holds every constraint")
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
            where, prefixes = "<stdin> line {n}".replace("{n}", str(n)), read_prefixes(args, translator, 1)
            constraints = read_constraints(args, translator, 1)
            outputs.write(process(translator, [line], n, where, args, None, prefixes, constraints), n)
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
    prefixes, constraints = (
        read_prefixes(args, translator, len(lines)),
        read_constraints(args, translator, len(lines)),
    )
    outputs = Outputs(args, translator)
    outputs.write(process(translator, lines, 1, where, args, targets, prefixes, constraints), 1)
    outputs.close(references)


def main(argv=None) -> int:
    try:
        args = parse_args(argv)
    except SystemExit as stop:  # --help, or a usage error (already printed)
        return int(stop.code or 0)
    try:
        translate(args)
    except UsageError as error:  # found once the checkpoint is read: one line, as argparse's are
        print(f"error: {error} (see {command_name('translate')} --help)", file=sys.stderr)
        return USAGE_ERROR
    except (CheckpointError, InputError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        raise
    except (OSError, torch.cuda.OutOfMemoryError) as error:  # e.g. an unwritable --attention DIR
        print(f"error: {error}", file=sys.stderr)
        return 1
    except RuntimeError as error:  # a failure while decoding: one line, as every other error
        print(f"error: translating failed: {(str(error).splitlines() or [''])[0]}", file=sys.stderr)
        return 1
    return 0
