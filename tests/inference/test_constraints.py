"""Lexical constraints (transformer/inference/constraints.py): a phrase's progress token by token, the beam
split among the levels of progress, the search equal to exhaustive search on a tiny model, every phrase in
the output, a phrase that cannot fit flagged, and through the Translator: the lines without constraints
unchanged, greedy as the small beam, bad constraints named.

Random models run in float64 (see test_decoding.py)."""

import itertools

import pytest
import torch
from helpers import BOS, EOS, UNK, random_model, random_sources, run_translate

from transformer.core.decoding import beam_search, length_normaliser, max_lengths
from transformer.inference.constraints import (
    GREEDY_BEAM,
    Constraints,
    _allocate,
    constrained_beam_search,
    constrained_nbest,
)
from transformer.inference.sampling import Sampling
from transformer.inference.translator import Translator
from transformer.interop.formats import target_tokenizer

SENTENCES = ["Ein Hund rennt durch den Schnee.", "Zwei Männer sitzen auf einer Bank.", "Eine Frau liest."]


def contains(ids: list[int], phrase: list[int]) -> bool:
    return any(ids[i : i + len(phrase)] == phrase for i in range(len(ids) - len(phrase) + 1))


def test_a_phrase_counts_token_by_token_and_falls_back_when_left_half_way():
    wanted = Constraints.of([[[5, 6, 7], [9]]], EOS, max_positions=64, device="cpu")
    progress, advancing = [], []
    for token in [5, 6, 8, 9, 5, 6, 7]:
        advancing.append(wanted.advancing_tokens()[0].tolist())
        rows = torch.tensor([0])
        wanted.met, wanted.partial, wanted.depth = wanted.advanced(rows, torch.tensor([token]))
        progress.append(int(wanted.progress(wanted.met, wanted.depth, wanted.sentence)[0]))
    assert progress == [1, 2, 0, 1, 2, 3, 4]  # 8 leaves "5 6 7" half-way: its two tokens no longer count
    assert advancing == [[5, 9], [6, -1], [7, -1], [5, 9], [5, -1], [6, -1], [7, -1]]
    assert wanted.met.all() and int(wanted.partial[0]) == -1


def test_eos_waits_for_every_phrase_and_the_limit_leaves_room_for_them():
    wanted = Constraints.of([[[5, 6]], []], EOS, max_positions=10, device="cpu")
    scores = torch.zeros(2, 12)
    wanted.restrict(scores, 0, torch.tensor([0, 1]))
    assert scores[0, EOS] == float("-inf") and scores[1, EOS] == 0  # the second sentence has no constraint
    assert wanted.limits(torch.tensor([4, 9])).tolist() == [6, 9]  # + the phrase's 2 tokens, at most 10


def test_the_beam_is_split_among_the_levels_of_progress_in_rounds():
    inf = float("-inf")
    scores = torch.tensor([[-1.0, -2.0, -3.0, -4.0, -5.0, -9.0, -0.5, -6.0, inf]])
    progress = torch.tensor([[0, 0, 0, 1, 1, 2, 0, 1, 2]])
    # banks: 2: [5]; 1: [3, 4, 7]; 0: [6, 0, 1, 2]; the -inf candidate comes last
    assert _allocate(scores, progress, 5).tolist() == [[5, 3, 6, 4, 0]]
    assert _allocate(scores, progress, 9).tolist()[0][-1] == 8
    assert _allocate(scores, torch.zeros_like(progress), 3).tolist() == [[6, 0, 1]]  # one bank: by score


def sequence_log_prob(model, src: torch.Tensor, ids: list[int], ended: bool) -> float:
    """log P(ids [+ EOS] | src) by one full forward pass, PAD and BOS ruled out as the searches do."""
    target = ids + [EOS] if ended else ids
    with torch.no_grad():
        logits = model(src, torch.tensor([[BOS] + target[:-1]]))[0]  # (T, V)
    logits[:, model.never_produced] = float("-inf")
    return float(torch.log_softmax(logits, dim=-1)[torch.arange(len(target)), target].sum())


@pytest.mark.parametrize("seed,phrases", [(0, [[5]]), (1, [[6, 4]]), (2, [[4], [6]]), (3, [[5, 5]])])
def test_with_a_beam_that_prunes_nothing_the_search_is_exhaustive_search(seed, phrases):
    V, offset = 7, 1  # UNK and 4, 5, 6 may be produced: every sequence within the limit can be scored
    model = random_model(seed, vocab_size=V)
    src = random_sources(seed, batch=1, max_len=2, vocab_size=V)  # (1, 2): one token and EOS
    limit = int(max_lengths(model, src, offset)[0]) + sum(map(len, phrases))
    outputs, met = constrained_beam_search(model, src, 4**limit, 0.6, offset, [phrases])
    best, best_ids = float("-inf"), None
    for length in range(limit + 1):
        for ids in map(list, itertools.product([UNK, *range(4, V)], repeat=length)):
            ended = length < limit  # at the limit a hypothesis is cut, without EOS
            if all(contains(ids, p) for p in phrases):
                score = sequence_log_prob(model, src, ids, ended) / length_normaliser(length + ended, 0.6)
                best, best_ids = max((best, best_ids), (score, ids), key=lambda pair: pair[0])
    assert met == [True] and outputs[0] == best_ids


@pytest.mark.parametrize("seed", range(4))
def test_every_phrase_is_in_the_output_and_sentences_without_phrases_are_searched_too(seed):
    model = random_model(seed, eos_bias=2.0)  # EOS likely: the phrases must be forced in
    src = random_sources(seed, batch=6)
    g = torch.Generator().manual_seed(seed)
    draw = lambda n: torch.randint(EOS + 1, 20, (n,), generator=g).tolist()  # noqa: E731
    phrases = [[draw(1)], [draw(3)], [draw(1), draw(2)], [], [draw(2), draw(2)], [draw(1)]]
    outputs, met = constrained_beam_search(model, src, 4, 0.6, 3, phrases)
    assert met == [True] * 6
    for ids, wanted in zip(outputs, phrases):
        assert all(contains(ids, p) for p in wanted), (ids, wanted)
    plain = beam_search(model, src, 4, 0.6, 3)
    assert outputs[3] == plain[3]  # one level of progress: plain beam search's choices


def test_a_phrase_the_length_limit_cannot_hold_is_flagged_with_the_best_of_the_rest():
    model = random_model(0, max_positions=3)
    src = random_sources(0, batch=2, max_len=3)  # (2, 2 | 3): the sources fit the 3 positions too
    outputs, met = constrained_beam_search(model, src, 4, 0.6, 3, [[[5, 6, 7, 8]], [[5]]])
    assert met == [False, True]
    assert 0 < len(outputs[0]) <= 3 and contains(outputs[1], [5])


@pytest.mark.parametrize("seed", range(3))
def test_the_n_best_list_starts_with_the_search_s_output_and_puts_the_hypotheses_that_hold_every_phrase_first(
    seed,
):
    model, src = random_model(seed), random_sources(seed, batch=5)
    phrases = [[[5]], [[7, 8]], [], [[9], [4]], [[6]]]
    outputs, met = constrained_beam_search(model, src, 4, 0.6, 3, phrases)
    lists = constrained_nbest(model, src, 4, 0.6, 3, phrases, 4)
    assert [hyps[0][0] for hyps in lists] == outputs and [hyps[0][2] for hyps in lists] == met
    for hyps in lists:
        flags = [ok for _, _, ok in hyps]
        assert flags == sorted(flags, reverse=True) and len({tuple(ids) for ids, _, _ in hyps}) == len(hyps)


# -------- through the Translator ------------------------------------------------------------------


@pytest.fixture(scope="module")
def translator(tiny_checkpoint) -> Translator:
    return Translator.from_checkpoint(tiny_checkpoint, device="cpu")


def test_lines_without_constraints_are_translated_as_without_and_the_others_hold_theirs(translator):
    plain = translator.translate(SENTENCES, beam=4)
    constrained = translator.translate(SENTENCES, beam=4, constraints=[["dog"], [], ["red hat", "man"]])
    assert constrained[1] == plain[1]
    assert "dog" in constrained[0] and "red hat" in constrained[2] and "man" in constrained[2]
    phrases = translator.encode_constraints([["dog"], [], ["man"]])
    found = translator.translate_ids(
        translator.encode(SENTENCES), beam=4, with_scores=True, constraints=phrases
    )
    assert [hyps[0].met for hyps in found] == [True, True, True]


def test_n_best_scores_are_the_log_probs_of_their_translations(translator):
    sources = translator.encode(SENTENCES)
    phrases = translator.encode_constraints([["dog"], [], ["red hat"]])
    found = translator.translate_ids(sources, beam=4, nbest=3, constraints=phrases)
    for src, hyps, wanted in zip(sources, found, phrases):
        assert len(hyps) == 3 and all(contains(h.ids, p) for h in hyps if h.met for p in wanted)
        scored = translator.score_ids([src] * 3, [h.ids for h in hyps], [h.ended for h in hyps])
        assert scored == pytest.approx([h.log_prob for h in hyps], abs=1e-4)


def test_a_constraint_the_plain_translation_holds_already_is_held(translator):
    plain = translator.translate(SENTENCES, beam=4)
    words = [line.split()[-1] for line in plain]  # a word of each plain translation
    phrases = translator.encode_constraints([[word] for word in words])
    found = translator.translate_ids(translator.encode(SENTENCES), beam=4, constraints=phrases)
    for (hyp,), word in zip(found, words):
        assert hyp.met and word in translator.decode(hyp.ids)


def test_a_constraint_is_its_own_pieces_even_where_a_word_would_split_otherwise(translator):
    pieces = target_tokenizer(translator.tokenizer).encode("ing")  # "▁ing", not the "ing" ending a word
    (found,) = translator.translate_ids(translator.encode(SENTENCES[:1]), beam=4,
                                        constraints=translator.encode_constraints([["ing"]]))  # fmt: skip
    assert contains(found[0].ids, pieces) and " ing" in translator.decode(found[0].ids)


def test_greedy_with_constraints_is_the_constrained_search_with_the_small_beam(translator):
    constraints = [["dog"], ["woman"], []]
    greedy = translator.translate(SENTENCES, beam=1, constraints=constraints)
    assert greedy[:2] == translator.translate(SENTENCES[:2], beam=GREEDY_BEAM, constraints=constraints[:2])
    assert greedy[2] == translator.translate(SENTENCES[2:], beam=1)[0]


def test_bad_constraints_are_named(translator):
    with pytest.raises(ValueError, match=r"sentence 2: constraint 1 \(' '\) tokenizes to nothing"):
        translator.translate(SENTENCES[:2], constraints=[["dog"], [" "]])
    with pytest.raises(ValueError, match="sentence 1: its constraints hold .* tokens, more than"):
        translator.translate(SENTENCES[:1], constraints=[["dog " * 600, "dog " * 600]])
    with pytest.raises(ValueError, match="3 sources but 1 constraints"):
        translator.translate_ids(translator.encode(SENTENCES), constraints=[[[5]]])
    with pytest.raises(ValueError, match="not with sampling"):
        translator.translate(SENTENCES, beam=1, sampling=Sampling(), constraints=[["dog"], [], []])


# -------- translate.py ----------------------------------------------------------------------------


def test_translate_py_holds_the_constraints_of_every_line_and_of_each_line(tiny_checkpoint, tmp_path, capsys):
    (tmp_path / "in.de").write_text("".join(s + "\n" for s in SENTENCES), encoding="utf-8")
    (tmp_path / "terms.txt").write_text("red hat\tman\n\nbench\n", encoding="utf-8")
    base = ["--checkpoint", str(tiny_checkpoint), "--input", str(tmp_path / "in.de"), "--beam", "4"]
    flags = ["--constraints", str(tmp_path / "terms.txt"), "--constraint", "dog"]
    code, lines, _ = run_translate(base + flags, capsys)
    assert code == 0 and len(lines) == 3 and all("dog" in line for line in lines)
    assert "red hat" in lines[0] and "man" in lines[0] and "bench" in lines[2]
    translator = Translator.from_checkpoint(tiny_checkpoint, device="cpu")
    assert lines == translator.translate(SENTENCES, beam=4, constraints=[["dog", "red hat", "man"], ["dog"],
                                                                         ["dog", "bench"]])  # fmt: skip


def test_translate_py_names_a_bad_constraints_file_in_one_line_and_exits_2(tiny_checkpoint, tmp_path, capsys):
    (tmp_path / "in.de").write_text("".join(s + "\n" for s in SENTENCES), encoding="utf-8")
    base = ["--checkpoint", str(tiny_checkpoint), "--input", str(tmp_path / "in.de")]
    for text, message in (
        ("dog\n", f"--constraints {tmp_path / 'terms.txt'} has 1 lines but the input has 3"),
        (
            "dog\n\ncat\t \n",
            f"--constraints {tmp_path / 'terms.txt'} line 3: constraint 2 (' ') tokenizes to nothing",
        ),
    ):
        (tmp_path / "terms.txt").write_text(text, encoding="utf-8")
        code, lines, err = run_translate(base + ["--constraints", str(tmp_path / "terms.txt")], capsys)
        assert (code, lines) == (2, []) and err.count("\n") == 1 and err.startswith(f"error: {message}"), err
    code, _, err = run_translate(base + ["--constraint", "dog", "--sample"], capsys)
    assert code == 2 and "--constraint steers the constrained beam search" in err


def test_translate_py_warns_of_a_line_whose_translation_misses_a_constraint(
    tiny_checkpoint, capsys, monkeypatch
):
    def nothing_met(self, src_ids, settings, constraints, prefixes=None, nbest=1):
        return [[([5], -1.0, False)] for _ in src_ids]

    monkeypatch.setattr(Translator, "search_constrained", nothing_met)
    argv = ["--checkpoint", str(tiny_checkpoint), "--constraint", "dog", *SENTENCES[:2]]
    code, lines, err = run_translate(argv, capsys)
    assert code == 0 and len(lines) == 2
    assert "argument 2: no translation within the length limit holds every constraint" in err
