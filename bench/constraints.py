"""Terminology on the test set: constraints drawn from the references, as the literature draws them.

    python bench/constraints.py CHECKPOINT [--limit N] [--per-sentence 2] [--data-dir DIR]

For each test sentence, up to ``--per-sentence`` words of its reference that the unconstrained beam-4
translation lacks (words of three letters or more, in the reference's order) become its constraints, as in
Post & Vilar (2018); a sentence whose translation already holds every such word has none. Prints, for one
run on this machine: the share of constraints whose text appears in the constrained output, test BLEU
without and with constraints, and the sentences per second of the constrained search against plain beam 4
on the sentences that have constraints.
"""

import argparse
import dataclasses
import re
import time

import torch

from transformer.inference.translator import Translator
from transformer.runtime.checkpoints import load_for_inference
from transformer.runtime.metrics import bleu_chrf
from transformer.training.multi30k import load_multi30k

WORD = re.compile(r"\w{3,}")


def draw_constraints(references: list[str], hypotheses: list[str], per_sentence: int) -> list[list[str]]:
    """Per sentence, up to ``per_sentence`` reference words (3+ letters) missing from its hypothesis."""
    drawn = []
    for reference, hypothesis in zip(references, hypotheses):
        have = set(WORD.findall(hypothesis))
        missing = [w for w in dict.fromkeys(WORD.findall(reference)) if w not in have]
        drawn.append(missing[:per_sentence])
    return drawn


def contains(ids: list[int], phrase: list[int]) -> bool:
    return any(ids[i : i + len(phrase)] == phrase for i in range(len(ids) - len(phrase) + 1))


def timed(translator: Translator, sources, constraints=None) -> tuple[list[list[int]], float]:
    """The ids of the beam-4 translations of ``sources`` (with ``constraints``) and the seconds they took."""
    start = time.perf_counter()
    found = translator.translate_ids(sources, beam=4, constraints=constraints)
    return [hyps[0].ids for hyps in found], time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint", help="a trained checkpoint (runs/NAME/best.pt)")
    parser.add_argument("--limit", type=int, default=None, help="only the first N test sentences")
    parser.add_argument("--per-sentence", type=int, default=2, help="constraints per sentence, at most")
    parser.add_argument("--data-dir", default=None)
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    model, tokenizer, config = load_for_inference(args.checkpoint)
    translator = Translator(model, tokenizer, dataclasses.replace(config.eval, beam_size=4), "cpu", "fp32")
    test = load_multi30k(config.data.src_lang, config.data.tgt_lang, args.data_dir)["test"]
    src_lines, references = test.src[: args.limit], test.tgt[: args.limit]
    sources = translator.encode(src_lines)
    plain_ids, _ = timed(translator, sources)
    plain = [translator.decode(ids) for ids in plain_ids]
    drawn = draw_constraints(references, plain, args.per_sentence)
    phrased = [i for i, words in enumerate(drawn) if words]
    phrases = translator.encode_constraints([drawn[i] for i in phrased])
    subset = [sources[i] for i in phrased]
    _, plain_seconds = timed(translator, subset)
    constrained_ids, constrained_seconds = timed(translator, subset, phrases)
    outputs = list(plain)
    for i, ids in zip(phrased, constrained_ids):
        outputs[i] = translator.decode(ids)
    n_constraints = sum(len(drawn[i]) for i in phrased)
    n_pieces = sum(
        contains(ids, phrase) for ids, wanted in zip(constrained_ids, phrases) for phrase in wanted
    )
    n_words = sum(word in set(WORD.findall(outputs[i])) for i in phrased for word in drawn[i])
    before, after = bleu_chrf(plain, references)["bleu"], bleu_chrf(outputs, references)["bleu"]
    print(f"{args.checkpoint}: {len(sources)} test sentences, {len(phrased)} with constraints, "
          f"{n_constraints} constraints")  # fmt: skip
    share = lambda n: f"{n} / {n_constraints} ({100 * n / max(n_constraints, 1):.1f} %)"  # noqa: E731
    print(f"constraints met: {share(n_pieces)} as pieces (the search's promise), {share(n_words)} as whole "
          "words (a phrase's last piece may be followed by more of its word)")  # fmt: skip
    print(f"test BLEU: {before:.2f} without constraints, {after:.2f} with")
    speeds = (len(subset) / plain_seconds, len(subset) / constrained_seconds)
    print(f"sentences with constraints: plain beam 4 {speeds[0]:.1f} sent/s, constrained {speeds[1]:.1f} "
          f"sent/s ({speeds[1] / speeds[0]:.2f}x)")  # fmt: skip
    free = [i for i in range(len(plain)) if i not in set(phrased)]
    same = sum(plain[i] == outputs[i] for i in free)
    print(f"lines without constraints equal to plain beam 4: {same} / {len(free)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
