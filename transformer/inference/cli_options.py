"""The command line of ``translate.py``: its flags, their checks before any work, and ``--help``'s text."""

import argparse
import sys

from transformer.inference.constraints import GREEDY_BEAM
from transformer.runtime.precision import DECODE_PRECISIONS
from transformer.runtime.usage import UsageParser, command_name

DESCRIPTION = """\
Translate with a checkpoint written by train.py (or its run folder), or a released Marian model: one line
in, one line out. Examples:
  %(prog)s --checkpoint runs/multi30k_de_en "Ein Hund rennt im Schnee."
  %(prog)s --checkpoint runs/multi30k_de_en/best.pt --beam 4 --input test.de --output test.hyp.en
  %(prog)s --checkpoint runs/multi30k_de_en --input test.de --reference test.en --attention attn/
  %(prog)s --checkpoint runs/multi30k_de_en --prefix-text "A man" "Ein Mann fährt Fahrrad."
  %(prog)s --checkpoint hf:Helsinki-NLP/opus-mt-en-de "A dog runs."
"""

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
A prefix (--prefix, --prefix-text) is exact to the sub-word: its text is split into pieces by the target
tokenizer and forced, and the search goes on from its last piece, so a prefix ending mid-word ("A ma")
may be continued into a word ("A man").
With --attention DIR, each non-empty input line n gets DIR/line_<n>_cross_layer_<i>.png (mean of
the heads of decoder layer i), DIR/line_<n>_cross_heads_layer_<last>.png (every head of the last
layer) and DIR/line_<n>_cross_top_sources.md (the top source tokens of every head for each target
token), computed by one forward pass over (source, translation), or over (source, reference) with
--score-reference; the same go to TensorBoard (tensorboard --logdir DIR).
--stream (the default when stdin is a terminal) reads stdin a line at a time and writes and flushes each
line's output before reading the next; the model is loaded once.
Exit status: 0 on success, 1 on an error, 2 on a usage error (flags that cannot go together, a value out
of range); either is one line on stderr.
"""


def build_parser() -> UsageParser:
    """Every flag of translate.py with its help (docs/translate.md is generated from it)."""
    parser = UsageParser(
        prog=command_name("translate"),
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("sentences", nargs="*", metavar="SENTENCE", help="sentences to translate")
    parser.add_argument(
        "--checkpoint", required=True,
        help="a checkpoint written by train.py (best.pt, or its run folder: the checkpoint its final test "
        "scored), a Hugging Face Marian "
        "folder, or hf:NAME (e.g. hf:Helsinki-NLP/opus-mt-en-de): a released model, run by our code with "
        "its own tokenizer",
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
        help="beam search length penalty α: larger prefers longer translations (default: the checkpoint's "
        "eval.length_penalty: the paper's 0.6, or 3.0 in the configs multi30k_de_en and _long, which "
        "scored best on their validation set)",
    )  # fmt: skip
    parser.add_argument(
        "--reference", default=None, metavar="FILE",
        help="reference translations, one per input line: print sacreBLEU BLEU, chrF and the signature "
        "to stderr",
    )  # fmt: skip
    parser.add_argument(
        "--attention", default=None, metavar="DIR", help="write cross-attention heatmaps here (see below)"
    )
    parser.add_argument(
        "--target-lang", default=None, metavar="LANG",
        help="the language to translate into: needed by a multilingual model (one trained on several target "
        "languages, or a released one with >>LANG<< tokens); a bilingual model takes its own or none",
    )  # fmt: skip
    parser.add_argument("--device", default="auto", help="auto (cuda if present), cpu, cuda, cuda:1, ...")
    parser.add_argument(
        "--max-tokens", type=int, default=None, metavar="N",
        help="batch size in padded tokens: source + an equal-length guess of the output (default: the "
        "checkpoint's eval.max_tokens)",
    )  # fmt: skip
    add_output_arguments(parser)
    add_search_arguments(parser)
    return parser


def parse_args(argv):
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.sentences and args.input is not None:
        parser.error("give SENTENCEs or --input, not both")
    check_output_arguments(parser, args)
    check_search_arguments(parser, args)
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
        "--precision", default="auto", choices=DECODE_PRECISIONS,
        help="autocast: auto = bf16 on CUDA, fp32 on the CPU (a run validated in results.json's precision); "
        "int8: linear layers multiply in int8 on the CPU (torchao, the extra .[int8]), the rest fp32; "
        "int8-bf16: the same, the rest bf16; a note says where bf16 decodes faster (default: auto)",
    )  # fmt: skip
    parser.add_argument(
        "--fast", action=argparse.BooleanOptionalAction, default=True,
        help="decode with the fast tier's modules and search kernels (the same translations, faster on a "
        "CPU); --no-fast: the plain core alone (default: fast)",
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


def add_search_arguments(parser) -> None:
    parser.add_argument(
        "--prefix", default=None, metavar="FILE",
        help="target prefixes, one per input line (an empty line = none): each translation starts with its "
        "prefix and the rest is searched (greedy or beam); scores count the whole translation",
    )  # fmt: skip
    parser.add_argument(
        "--prefix-text", default=None, metavar="TEXT",
        help="the same target prefix for every input line (instead of --prefix FILE)",
    )  # fmt: skip
    parser.add_argument(
        "--constraint", action="append", default=[], metavar="TEXT",
        help="a target phrase every translation must contain, anywhere (terminology); repeat for several. "
        f"Searched by the constrained beam search (greedy: beam {GREEDY_BEAM})",
    )  # fmt: skip
    parser.add_argument(
        "--constraints", default=None, metavar="FILE",
        help="target phrases per input line, separated by tabs (an empty line = none), besides --constraint",
    )  # fmt: skip
    parser.add_argument(
        "--sample", action="store_true",
        help="draw each token from the model's distribution instead of searching (beam 1), e.g. for "
        "back-translation; see --top-k, --top-p, --temperature, --seed",
    )  # fmt: skip
    parser.add_argument(
        "--top-k", type=int, default=0, metavar="K",
        help="sample among the K most probable tokens only (default 0: no limit)",
    )  # fmt: skip
    parser.add_argument(
        "--top-p", type=float, default=1.0, metavar="P",
        help="sample from the nucleus: the fewest most probable tokens of probability >= P (default 1: all)",
    )  # fmt: skip
    parser.add_argument("--temperature", type=float, default=1.0, metavar="T",
                        help="divide the logits by T before sampling (default 1; 0 = greedy)")  # fmt: skip
    parser.add_argument("--seed", type=int, default=0, help="the sampling seed (default 0)")
    parser.add_argument(
        "--sample-unk", action="store_true",
        help="let sampling draw UNK, the unknown piece (printed ⁇); never drawn without this flag",
    )  # fmt: skip


def check_search_arguments(parser, args) -> None:
    """Usage errors of --prefix, constraints and sampling, before anything is loaded."""
    constrained = "--constraint" if args.constraint else "--constraints" if args.constraints else None
    if constrained and (args.sample or args.score_reference is not None):
        parser.error(
            f"{constrained} steers the constrained beam search: not with --sample or --score-reference"
        )
    if args.constraints is not None and args.stream:
        parser.error("--constraints needs every input line at once: not with --stream (--constraint is)")
    if args.prefix is not None and (args.stream or args.score_reference is not None):
        parser.error("--prefix needs every input line at once and a search: not with --stream or "
                     "--score-reference")  # fmt: skip
    if args.prefix_text is not None and (args.prefix is not None or args.score_reference is not None):
        parser.error("--prefix-text gives every search one prefix: not with --prefix or --score-reference")
    defaults = (("--top-k", args.top_k, 0), ("--top-p", args.top_p, 1.0),
                ("--temperature", args.temperature, 1.0), ("--seed", args.seed, 0),
                ("--sample-unk", args.sample_unk, False))  # fmt: skip
    given = [flag for flag, value, default in defaults if value != default]
    if given and not args.sample:
        parser.error(f"{', '.join(given)} only apply with --sample")
    if args.sample:
        for flag, value in (("--beam", args.beam), ("--nbest", args.nbest)):
            if value is not None and value > 1:
                parser.error(f"--sample draws one translation token by token: no {flag} {value}")
        if args.score_reference is not None:
            parser.error("--score-reference scores given translations: no search, so no --sample")
        if args.top_k < 0 or not 0.0 < args.top_p <= 1.0 or args.temperature < 0.0:
            parser.error("--top-k must be >= 0, --top-p in (0, 1], --temperature >= 0")
