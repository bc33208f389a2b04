"""Sampling (transformer/inference/sampling.py) and prefix-constrained decoding (decoding.py), through the
decoding
functions, the Translator and translate.py: never a token outside the top k or the nucleus, temperature 0 is
greedy, seeds reproduce, every output starts with its prefix and its score counts the whole sequence."""

import math

import pytest
import torch
from helpers import random_model, random_sources, run_translate

import transformer.inference.translator as translator_module
from transformer.core.decoding import beam_search, greedy_decode, max_lengths
from transformer.inference.prefix import Prefix
from transformer.inference.sampling import Sampling, allowed_tokens, sample_tokens
from transformer.inference.translator import Translator

SENTENCES = ["Ein Hund rennt durch den Schnee.", "Zwei Männer spielen Fußball im Park.",
             "Eine Frau mit einem roten Hut sitzt am Tisch.", "Ein kleines Mädchen lacht.",
             "Drei Kinder springen in einen See.", "Ein Mann fährt Fahrrad."]  # fmt: skip


@pytest.fixture(scope="module")
def translator(tiny_checkpoint) -> Translator:
    return Translator.from_checkpoint(tiny_checkpoint, "cpu")


# ---------------------------------------------------------------- the sampling distribution


def nucleus_by_hand(probs: list[float], top_p: float) -> set[int]:
    """The fewest most probable tokens whose probabilities sum to at least top_p."""
    chosen, total = set(), 0.0
    for token in sorted(range(len(probs)), key=lambda t: -probs[t]):
        if total >= top_p:
            break
        chosen.add(token)
        total += probs[token]
    return chosen


def test_allowed_tokens_are_the_top_k_then_the_nucleus():
    logits = torch.randn(16, 40, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    allowed = allowed_tokens(logits, 5, 1.0)
    assert torch.equal(allowed.sum(-1), torch.full((16,), 5))
    assert all(set(allowed[i].nonzero().flatten().tolist()) == set(logits[i].topk(5).indices.tolist())
               for i in range(16))  # fmt: skip
    for top_p in (0.3, 0.75, 0.95):
        allowed = allowed_tokens(logits, 0, top_p)
        for i in range(16):
            want = nucleus_by_hand(torch.softmax(logits[i], -1).tolist(), top_p)
            assert set(allowed[i].nonzero().flatten().tolist()) == want


def test_samples_never_leave_the_top_k_or_the_nucleus_and_follow_the_probabilities():
    logits = torch.randn(4, 30, generator=torch.Generator().manual_seed(1)).repeat(2000, 1)  # (8000, 30)
    generator = torch.Generator().manual_seed(0)
    for sampling in (Sampling(top_k=3), Sampling(top_p=0.6), Sampling(top_k=8, top_p=0.9, temperature=0.7)):
        drawn = sample_tokens(logits, sampling, generator)  # (8000,)
        tempered = logits / sampling.temperature
        allowed = allowed_tokens(tempered, sampling.top_k, sampling.top_p)
        assert allowed.gather(1, drawn[:, None]).all(), sampling
    drawn = sample_tokens(logits[0::4], Sampling(temperature=2.0), generator)  # 2000 draws of row 0
    frequencies = torch.bincount(drawn, minlength=30).double() / drawn.numel()
    want = torch.softmax(logits[0].double() / 2.0, -1)
    assert (frequencies - want).abs().max() < 0.035  # ~4 standard errors of 2000 draws


def test_temperature_zero_is_the_argmax_and_bad_settings_are_refused():
    logits = torch.randn(50, 20)
    assert torch.equal(sample_tokens(logits, Sampling(temperature=0.0), None), logits.argmax(-1))
    for bad, word in ((dict(top_k=-1), "top_k"), (dict(top_p=0.0), "top_p"), (dict(top_p=1.5), "top_p"),
                      (dict(temperature=-1.0), "temperature")):  # fmt: skip
        with pytest.raises(ValueError, match=word):
            Sampling(**bad)


# ---------------------------------------------------------------- prefixes, on random models


def prefixes_for(src: torch.Tensor, seed: int) -> tuple[torch.Tensor, list[list[int]]]:
    """Random prefixes of 0 to 3 ordinary tokens per sentence -> ((B, P) with -1 padding, the lists)."""
    g = torch.Generator().manual_seed(seed)
    lists = [torch.randint(4, 20, (int(torch.randint(0, 4, (1,), generator=g)),), generator=g).tolist()
             for _ in range(src.size(0))]  # fmt: skip
    P = max(len(p) for p in lists)
    return torch.tensor([p + [-1] * (P - len(p)) for p in lists]), lists


def test_greedy_with_a_prefix_starts_with_it_and_continues_greedily():
    model, src = random_model(4, eos_bias=1.0), random_sources(4)
    prefix, lists = prefixes_for(src, 0)
    outputs = greedy_decode(model, src, 5, steering=Prefix(prefix, 64))
    assert outputs == greedy_decode(model, src, 5, use_cache=False, steering=Prefix(prefix, 64))
    limits = max_lengths(model, src, 5).tolist()
    for b, (out, wanted) in enumerate(zip(outputs, lists)):
        assert out[: len(wanted)] == wanted
        logits = model(src[b : b + 1], torch.tensor([[model.start_id] + out]))[0]  # (1 + len(out), V)
        logits[:, model.never_produced] = float("-inf")
        best = logits.argmax(-1).tolist()  # best[t]: the most probable token after out[:t]
        assert out[len(wanted) :] == best[len(wanted) : len(out)]
        if len(out) < max(limits[b], len(wanted) + 1):  # it ended: EOS was the most probable next
            assert best[len(out)] == model.eos_id


def test_forcing_the_greedy_outputs_own_start_changes_nothing_but_the_room_left():
    model, src = random_model(5, eos_bias=1.0), random_sources(5)
    plain, limits = greedy_decode(model, src, 5), max_lengths(model, src, 5).tolist()
    lists = [out[:2] for out in plain]
    P = max(len(p) for p in lists)
    prefix = torch.tensor([p + [-1] * (P - len(p)) for p in lists])
    for search in (greedy_decode(model, src, 5, steering=Prefix(prefix, 64)),
                   beam_search(model, src, 1, 0.6, 5, steering=Prefix(prefix, 64))):  # fmt: skip
        for out, before, limit, forced in zip(search, plain, limits, lists):
            if len(before) < limit:  # it ended with EOS: the same translation
                assert out == before
            else:  # cut at its limit, which the prefix's tokens now extend
                assert out[: len(before)] == before and len(out) <= limit + len(forced)
    assert any(len(before) == limit for before, limit in zip(plain, limits))  # both cases are met


def test_beam_with_a_prefix_starts_with_it_and_an_empty_prefix_changes_nothing():
    model, src = random_model(6, eos_bias=1.0), random_sources(6)
    prefix, lists = prefixes_for(src, 1)
    for out, wanted in zip(beam_search(model, src, 4, 0.6, 5, steering=Prefix(prefix, 64)), lists):
        assert out[: len(wanted)] == wanted
    empty = torch.full((src.size(0), 2), -1)
    assert beam_search(model, src, 4, 0.6, 5, steering=Prefix(empty, 64)) == beam_search(
        model, src, 4, 0.6, 5
    )


def test_a_prefix_longer_than_the_length_limit_leaves_the_translation_its_room():
    model, src = random_model(7), random_sources(7, batch=2, max_len=2)  # 1 source token: limit 2 + 1
    prefix = torch.tensor([[5, 6, 7, 8, 9], [5, 6, -1, -1, -1]])
    limits = Prefix(prefix, 64).limits(max_lengths(model, src, 1))
    assert limits.tolist() == [3 + 5, 3 + 2]  # the source-based limit, then the prefix's tokens
    outputs = greedy_decode(model, src, 1, steering=Prefix(prefix, 64))
    assert outputs[0][:5] == [5, 6, 7, 8, 9] and outputs[1][:2] == [5, 6]
    assert Prefix(prefix, 6).limits(max_lengths(model, src, 1)).tolist() == [6, 5]  # never past the table


# ---------------------------------------------------------------- through the Translator


def test_translator_prefix_greedy_and_beam_scores_count_the_whole_sequence(translator):
    prefix = ["Ein Mann", "", "Eine Frau", "Zwei", "", "Ein Junge"]
    wanted = translator.encode_targets(prefix)
    sources = translator.encode(SENTENCES)
    for beam in (1, 3):
        found = translator.translate_ids(sources, beam, None, True, wanted)
        for hyps, ids in zip(found, wanted):
            h = hyps[0]
            assert h.ids[: len(ids)] == ids
            source = sources[found.index(hyps)]
            forced = translator.score_ids([source], [h.ids], [h.ended])[0]
            assert math.isclose(h.log_prob, forced, abs_tol=1e-4), (beam, h.log_prob, forced)
    texts = translator.translate(SENTENCES, prefix=prefix)
    assert texts[0].startswith("Ein Mann") and texts[2].startswith("Eine Frau")
    assert translator.translate(SENTENCES, prefix=[""] * 6) == translator.translate(SENTENCES)


def test_translator_sampling_seeds_and_temperature(translator, monkeypatch):
    greedy = translator.translate(SENTENCES, beam=1)
    assert translator.translate(SENTENCES, sampling=Sampling(temperature=0.0)) == greedy
    assert translator.translate(SENTENCES, sampling=Sampling(temperature=1e-4, seed=3)) == greedy
    hot = Sampling(temperature=1.5, seed=1)
    first = translator.translate(SENTENCES, sampling=hot)
    assert translator.translate(SENTENCES, sampling=hot) == first
    assert translator.translate(SENTENCES, sampling=Sampling(temperature=1.5, seed=2)) != first
    with pytest.raises(ValueError, match="beam 1"):
        translator.translate(SENTENCES, beam=4, sampling=hot)


def test_translator_samples_only_from_the_top_k(translator, monkeypatch):
    seen = []

    def recording(logits, sampling, generator, unk_id):
        drawn = sample_tokens(logits, sampling, generator, unk_id)
        seen.append((logits.clone(), drawn))
        return drawn

    monkeypatch.setattr(translator_module, "sample_tokens", recording)
    translator.translate(SENTENCES, sampling=Sampling(top_k=2, temperature=2.0, seed=5))
    assert seen
    for logits, drawn in seen:
        top2 = logits.topk(2, dim=-1).indices  # (N, 2)
        assert (top2 == drawn[:, None]).any(-1).all()


# ---------------------------------------------------------------- translate.py


def test_cli_prefix_and_sampling(tiny_checkpoint, tmp_path, capsys):
    inputs, prefixes = tmp_path / "in.de", tmp_path / "prefix.en"
    inputs.write_text("\n".join(SENTENCES[:3]) + "\n", encoding="utf-8")
    prefixes.write_text("A man\n\nA woman\n", encoding="utf-8")
    base = ["--checkpoint", str(tiny_checkpoint), "--input", str(inputs)]
    code, lines, _ = run_translate(base + ["--prefix", str(prefixes)], capsys)
    assert code == 0 and len(lines) == 3 and lines[0].startswith("A man") and lines[2].startswith("A woman")
    code, beam_lines, _ = run_translate(base + ["--prefix", str(prefixes), "--beam", "3"], capsys)
    assert code == 0 and beam_lines[0].startswith("A man")
    sampled = [
        run_translate(base + ["--sample", "--temperature", "1.5", "--seed", "4"], capsys) for _ in range(2)
    ]
    assert sampled[0][0] == 0 and sampled[0][1] == sampled[1][1] and len(sampled[0][1]) == 3
    prefixes.write_text("A man\n", encoding="utf-8")
    code, _, err = run_translate(base + ["--prefix", str(prefixes)], capsys)
    assert code == 1 and "has 1 lines but the input has 3" in err
    usage = [(["--top-k", "5"], "only apply with --sample"), (["--sample", "--beam", "4"], "no --beam 4"),
             (["--sample", "--top-p", "0"], "--top-p in (0, 1]")]  # fmt: skip
    for bad, says in usage:
        code, _, err = run_translate(base + bad, capsys)
        assert code == 2 and says in err, err


def test_sampling_with_a_prefix_the_vocabulary_does_not_know_forces_it_before_the_unk_ban(
    tiny_checkpoint, capsys
):
    """The prefix's pieces are forced before any ban: "☃" is UNK, which sampling never draws by itself."""
    for seed in ("1", "2"):
        code, lines, err = run_translate(["--checkpoint", str(tiny_checkpoint), "--sample", "--seed", seed,
                                "--prefix-text", "☃", "Ein Hund läuft."], capsys)  # fmt: skip
        assert code == 0 and len(lines) == 1 and lines[0].strip().startswith("⁇"), (lines, err)
        assert "Traceback" not in err
    logits = torch.tensor([[0.0, 1.0, float("-inf")], [float("-inf"), float("-inf"), 2.0]])  # row 1: forced
    picks = sample_tokens(logits, Sampling(seed=0), Sampling(seed=0).generator(torch.device("cpu")), unk_id=2)
    assert picks[1].item() == 2 and picks[0].item() in (0, 1)  # row 0 still never draws UNK


def test_a_failure_while_decoding_is_one_line_not_a_traceback(tiny_checkpoint, capsys, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("probability tensor contains either `inf`, `nan` or element < 0\nmore")

    monkeypatch.setattr(Translator, "translate_ids", broken)
    code, lines, err = run_translate(["--checkpoint", str(tiny_checkpoint), "Ein Hund."], capsys)
    assert (
        code == 1
        and lines == []
        and err.strip().splitlines()
        == ["error: translating failed: probability tensor contains either `inf`, `nan` or element < 0"]
    )
