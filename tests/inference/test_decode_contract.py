"""One contract for every decoding path: a translation made to start with a long prefix, or to hold
constraints, is scored with its EOS (``with_scores`` equals scoring the same output as a reference);
sampling is refused with a beam whatever else is asked; a blank source gives an empty translation in
validation and the final test, as in ``translate.py``."""

import pytest
import torch
from helpers import EOS, random_model

from transformer.core.config import EvalConfig
from transformer.inference.sampling import Sampling
from transformer.inference.translator import Translator
from transformer.runtime.search import search
from transformer.training.ranks import Runtime
from transformer.training.validation import translate_and_score


def test_a_prefix_longer_than_the_length_limit_still_ends_with_eos_and_is_scored_with_it():
    model = random_model(0, eos_bias=30.0)  # EOS as soon as the prefix lets it
    translator = Translator(model, tokenizer=None, settings=EvalConfig(max_len_offset=1, beam_size=4))
    sources, prefixes = (
        [[5, 6]],
        [[7, 8, 9, 10, 11]],
    )  # limit 2 + 1 + 1 = 4 tokens, + 5 for the prefix
    for beam in (1, 4):
        (hyp,) = translator.translate_ids(sources, beam=beam, with_scores=True, prefixes=prefixes)[0]
        assert hyp.ids == prefixes[0] and hyp.ended  # the prefix, then EOS: it ended, it was not cut
        assert hyp.log_prob == pytest.approx(translator.score_ids(sources, [hyp.ids])[0])  # with its EOS
    nbest = translator.translate_ids(sources, beam=4, nbest=2, prefixes=prefixes)[0]
    assert nbest[0].ended and nbest[0].log_prob == pytest.approx(
        translator.score_ids(sources, [nbest[0].ids])[0]
    )


def test_a_constrained_translation_that_ends_with_eos_is_scored_with_it():
    model = random_model(3, eos_bias=30.0)  # EOS as soon as the constraints let it
    translator = Translator(model, tokenizer=None, settings=EvalConfig(max_len_offset=1, beam_size=4))
    sources, constraints = [[5, 6], [7]], [[[9, 10, 11], [12]], [[13]]]
    for beam in (1, 4):
        found = translator.translate_ids(sources, beam=beam, with_scores=True, constraints=constraints)
        for src, (hyp,), phrases in zip(sources, found, constraints):
            assert hyp.met and hyp.ended and sorted(hyp.ids) == sorted(sum(phrases, []))  # only the phrases
            assert hyp.log_prob == pytest.approx(translator.score_ids([src], [hyp.ids])[0])  # with its EOS


def test_sampling_with_a_beam_is_refused_with_scores_and_n_best_lists_too():
    translator = Translator(random_model(1), tokenizer=None, settings=EvalConfig())
    for extra in ({}, {"with_scores": True}, {"nbest": 2}):
        with pytest.raises(ValueError, match="needs beam 1"):
            translator.translate_ids([[5, 6]], beam=4, sampling=Sampling(seed=1), **extra)


@pytest.mark.parametrize("beam", [1, 3])
def test_the_core_search_gives_a_blank_source_an_empty_translation_and_the_rest_their_own(beam):
    model, settings = random_model(2, eos_bias=2.0), EvalConfig(beam_size=beam, max_len_offset=5)
    sources = [[5, 6, 7], [], [8, 9]]
    with_blank = search(model, sources, settings)
    assert with_blank[1] == [] and with_blank[::2] == search(model, sources[::2], settings)
    assert EOS not in sum(with_blank, [])


def test_the_final_test_and_translate_py_give_a_blank_line_the_same_empty_translation(tiny_checkpoint):
    translator = Translator.from_checkpoint(tiny_checkpoint)
    lines = ["Ein Hund läuft.", "", "Zwei Männer sitzen auf einer Bank."]
    sources = [translator.tokenizer.encode(line) for line in lines]  # as the splits encode them: [] if blank
    runtime = Runtime(torch.device("cpu"), None)
    hyps, _ = translate_and_score(
        translator.model, translator.tokenizer, sources, lines, translator.settings, runtime
    )
    assert hyps == translator.translate(lines) and hyps[1] == ""
