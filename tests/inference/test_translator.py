"""The Python API (transformer/inference/translator.py), word alignments
(transformer/inference/alignment.py) and n-best beam
search: n-best scores are the teacher-forced scores of the same ids, the first of the n-best is the plain
output, alignments stay within the word counts. The tiny checkpoint is trained once per session."""

import math
import os

import pytest
import torch
from helpers import BOS, EOS, cpu_with, random_model, random_sources

from transformer.core.config import EvalConfig
from transformer.core.decoding import beam_search, length_normaliser, max_lengths
from transformer.inference.alignment import pharaoh, word_alignment, word_index
from transformer.inference.nbest import beam_search_nbest
from transformer.inference.translator import Translator

SENTENCES = [
    "Ein Hund rennt durch den Schnee.",
    "Zwei Männer.",
    "",
    "Eine Frau mit einem roten Hut sitzt am Tisch.",
]


class Ids:
    """A stand-in tokenizer for random models: ids are the text."""

    pad_id, bos_id, eos_id = 0, BOS, EOS


@pytest.fixture(scope="module")
def translator(tiny_checkpoint) -> Translator:
    return Translator.from_checkpoint(tiny_checkpoint, "cpu")


# ------------------------------------------------------------------------------ n-best beam search


@pytest.mark.parametrize("alpha", [0.0, 0.6])
def test_first_of_the_nbest_is_the_beam_search_output(alpha):
    model, src = random_model(3, eos_bias=1.5), random_sources(3)
    best = beam_search(model, src, 4, alpha, 6)
    nbest = beam_search_nbest(model, src, 4, alpha, 6, 4)
    assert [hyps[0][0] for hyps in nbest] == best
    limits = max_lengths(model, src, 6).tolist()
    for hyps, limit in zip(nbest, limits):
        assert 1 <= len(hyps) <= 4 and len({tuple(ids) for ids, _ in hyps}) == len(hyps)  # distinct
        ranks = [p / length_normaliser(len(ids) + (len(ids) < limit), alpha) for ids, p in hyps]
        assert ranks == sorted(ranks, reverse=True)


def test_nbest_scores_are_the_teacher_forced_log_probs():
    model, src = random_model(5, eos_bias=1.5), random_sources(5)
    nbest = beam_search_nbest(model, src, 3, 0.6, 6, 3)
    limits = max_lengths(model, src, 6).tolist()
    sources = [[t for t in row if t not in (0, EOS)] for row in src.tolist()]
    pairs = [
        (s, ids, p, len(ids) < limit) for s, hyps, limit in zip(sources, nbest, limits) for ids, p in hyps
    ]
    settings = EvalConfig(max_tokens=200)
    got = Translator(model, Ids(), settings, "cpu", "fp32").sequence_log_probs(
        [s for s, *_ in pairs], [ids for _, ids, *_ in pairs], [e for *_, e in pairs]
    )
    assert got == pytest.approx([p for _, _, p, _ in pairs], abs=1e-9)  # float64
    assert any(not e for *_, e in pairs) and any(e for *_, e in pairs)  # both endings were checked


def test_nbest_must_fit_the_beam():
    model, src = random_model(1), random_sources(1)
    with pytest.raises(ValueError, match="nbest"):
        beam_search_nbest(model, src, 2, 0.6, 4, 3)


# -------------------------------------------------------------------------------------- alignments


def test_word_index_merges_sub_words_at_the_word_start_marker():
    assert word_index(["▁Ein", "▁H", "und", "▁rennt", "."]) == [0, 1, 1, 2, 2]
    assert word_index(["Ein", "▁Hund"]) == [0, 1]  # a first piece without the marker is word 0
    assert word_index(["▁", "Ü", "ber", "▁alles"]) == [0, 0, 0, 1]  # a bare "▁" joins the next piece
    assert word_index(["▁Hund", "▁"]) == [0, 0]  # ... or, at the end, the word before
    assert word_index([]) == [] and word_index(["▁a", "b", "▁c"]) == [0, 0, 1]


def test_word_alignment_links_every_target_word_through_the_argmax():
    src, tgt = ["▁Ein", "▁H", "und", "."], ["▁A", "▁dog", "▁runs"]
    weights = torch.tensor(  # (T + EOS, S + EOS): rows predict ▁A ▁dog ▁runs </s>
        [[0.7, 0.1, 0.1, 0.0, 0.1], [0.1, 0.2, 0.6, 0.0, 0.1], [0.0, 0.0, 0.1, 0.8, 0.1], [0, 0, 0, 0, 1.0]]
    )
    assert word_alignment(weights, src, tgt) == [(0, 0), (1, 1), (1, 2)]  # "." is part of word 1 "Hund."
    assert word_alignment(weights, src, tgt, rows="input") == [(0, 2), (1, 0), (1, 1)]  # rows shifted
    assert pharaoh([(0, 0), (1, 2)]) == "0-0 1-2" and word_alignment(weights, [], tgt) == []
    with pytest.raises(ValueError):
        word_alignment(weights, src, tgt, rows="diagonal")


# --------------------------------------------------------------------------- the API, trained model


def test_translate_plain_scores_and_nbest(translator):
    plain, beam = translator.translate(SENTENCES), translator.translate(SENTENCES, beam=4)
    assert plain[2] == "" and beam[2] == "" and all(plain[i] for i in (0, 1, 3))
    scored = translator.translate(SENTENCES, with_scores=True)
    assert [t for t, _ in scored] == plain and scored[2] == ("", 0.0)
    nbest = translator.translate(SENTENCES, beam=4, nbest=3, with_scores=True)
    assert [hyps[0][0] for hyps in nbest] == beam and nbest[2] == [("", 0.0)]
    assert [[t for t, _ in hyps] for hyps in nbest] == translator.translate(SENTENCES, beam=4, nbest=3)
    assert all(len(hyps) == 3 and all(p < 0 for _, p in hyps) for hyps in nbest if hyps[0][0])
    with pytest.raises(ValueError, match="nbest"):
        translator.translate(SENTENCES, beam=2, nbest=3)
    with pytest.raises(TypeError):
        translator.translate("Ein Hund.")


@pytest.mark.parametrize("beam", [1, 4])
def test_scores_of_translations_equal_their_teacher_forced_scores(translator, beam):
    sources = translator.encode(SENTENCES)
    found = translator.translate_ids(sources, beam=beam, nbest=beam)
    hyps = [(src, h) for src, hyps in zip(sources, found) for h in hyps if src is not None]
    again = translator.score_ids([s for s, _ in hyps], [h.ids for _, h in hyps], [h.ended for _, h in hyps])
    assert again == pytest.approx([h.log_prob for _, h in hyps], abs=1e-4)
    assert all(math.isfinite(p) for p in again)


def test_score_of_references(translator):
    refs = ["A dog runs through the snow.", "Two men.", "Nothing.", ""]
    scores = translator.score(SENTENCES, refs)
    assert scores[2] == 0.0 and all(s < 0 for i, s in enumerate(scores) if i != 2)  # blank source: 0.0
    assert scores[3] < 0  # a blank reference: log P(EOS)
    assert translator.score(SENTENCES[:1], refs[:1])[0] == pytest.approx(scores[0], abs=1e-5)  # batching
    with pytest.raises(ValueError, match="references"):
        translator.score(SENTENCES, refs[:2])


def test_attention_of_the_greedy_translation_and_of_a_given_target(translator):
    greedy = translator.translate(SENTENCES[:1])[0]
    own = translator.attention(SENTENCES[0])
    pieces = translator.tokenizer.id_to_piece(translator.tokenizer.encode(greedy))
    assert (
        own.target_pieces[: len(pieces)] == pieces
        and own.input_pieces[1 : len(pieces) + 1] == pieces[: len(own.input_pieces) - 1]
    )
    given = translator.attention(SENTENCES[0], "A dog runs.")
    ref_pieces = translator.tokenizer.id_to_piece(translator.tokenizer.encode("A dog runs."))
    assert given.target_pieces == ref_pieces + ["</s>"] and given.input_pieces == ["<s>"] + ref_pieces
    S, T = len(given.source_pieces), len(given.target_pieces)
    assert given.source_pieces[-1] == "</s>"
    assert [w.shape for w in given.cross] == [(2, T, S)] and [w.shape for w in given.encoder_self] == [
        (2, S, S)
    ]
    assert [w.shape for w in given.decoder_self] == [(2, T, T)]
    assert torch.allclose(given.cross[0].sum(-1), torch.ones(2, T), atol=1e-5)
    assert torch.all(given.decoder_self[0].triu(1) == 0)  # the future is masked
    with pytest.raises(ValueError, match="blank"):
        translator.attention("   ")


def test_alignments_stay_within_the_word_counts(translator):
    for source in SENTENCES:
        hyp = translator.translate([source])[0]
        for target in (None, "A dog runs through the snow ."):
            text = hyp if target is None else target
            links = translator.alignments(source, target)
            assert all(0 <= i < len(source.split()) and 0 <= j < len(text.split()) for i, j in links)
            if source.strip() and text.strip():
                assert {j for _, j in links} == set(range(len(text.split())))
    assert translator.default_align_layer() == 0  # one decoder layer
    with pytest.raises(ValueError, match="layer 3"):
        translator.alignments(SENTENCES[0], layer=3)


def test_translator_from_parts_and_precision(translator, onednn_env):
    same = Translator(translator.model, translator.tokenizer, translator.settings, "cpu", "fp32")
    assert same.translate(SENTENCES) == translator.translate(SENTENCES) and same.dtype is None
    before = {name: tensor.clone() for name, tensor in translator.model.state_dict().items()}
    bf16 = Translator(translator.model, translator.tokenizer, translator.settings, "cpu", "bf16")
    # on the CPU, a bf16 copy of the model without autocast; the model itself is left as it is
    assert bf16.model is not translator.model and bf16.dtype is None
    assert {p.dtype for p in bf16.model.parameters()} == {torch.bfloat16}
    for name, tensor in translator.model.state_dict().items():
        assert tensor.dtype == torch.float32 and torch.equal(tensor, before[name]), name
    assert os.environ["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] == "16384"  # bf16 decoding keeps its kernels
    with pytest.raises(ValueError, match="precision"):
        Translator(translator.model, translator.tokenizer, translator.settings, "cpu", "fp8")


def test_a_precision_slower_than_fp32_on_this_cpu_is_said_once(translator, monkeypatch):
    parts, said = (translator.model, translator.tokenizer, translator.settings, "cpu"), []
    cpu_with(monkeypatch)  # an AVX2 CPU
    Translator(*parts, "bf16", warn=said.append)
    Translator(*parts, "fp32", warn=said.append)
    assert len(said) == 1 and said[0].startswith("--precision bf16: this CPU has no bf16 matrix instructions")
    cpu_with(monkeypatch, "avx512_bf16")
    Translator(*parts, "bf16", warn=said.append)
    assert len(said) == 1


def test_long_sources_are_truncated_with_a_warning(translator):
    warnings = []
    quiet = Translator(
        translator.model, translator.tokenizer, translator.settings, "cpu", warn=warnings.append
    )
    long = "Hund " * (quiet.max_source_tokens + 5)
    assert len(quiet.translate([long, "Hund"])) == 2
    assert len(warnings) == 1 and warnings[0].startswith("sentence 1:") and "truncated" in warnings[0]


def test_decoding_in_another_thread_than_the_builder_warns_once(translator):
    """On a CPU, PyTorch in two threads runs ~0.6x slower (Translator._check_thread): say so, once; not
    when the Translator is used where it was built."""
    import threading

    said = []
    here = Translator(translator.model, translator.tokenizer, translator.settings, "cpu", warn=said.append)
    here.translate(["Hund"])
    assert said == []
    worker = threading.Thread(target=lambda: [here.translate(["Hund"]) for _ in range(2)], name="server")
    worker.start()
    worker.join()
    assert len(said) == 1 and "'MainThread'" in said[0] and "'server'" in said[0]
    scorer = Translator(translator.model, translator.tokenizer, translator.settings, "cpu", warn=said.append)
    worker = threading.Thread(target=lambda: scorer.score(["Hund"], ["Dog"]), name="scoring")
    worker.start()
    worker.join()
    assert len(said) == 2 and "'scoring'" in said[1]  # scoring runs the model too


def test_a_translator_built_in_its_own_thread_does_not_warn(translator):
    import threading

    said = []

    def build_and_use():
        own = Translator(translator.model, translator.tokenizer, translator.settings, "cpu", warn=said.append)
        own.translate(["Hund"])

    worker = threading.Thread(target=build_and_use)
    worker.start()
    worker.join()
    assert said == []
