"""translate.py: one output line per input line whatever the input, scores on stderr, alignment pictures,
and one-line errors for bad checkpoints. Runs the tiny checkpoint trained once per session."""

import gzip
import os
import subprocess
import sys

import pytest
import torch
from helpers import DATA_DIR, ROOT, run_translate

import transformer.inference.translator as translator_module
from transformer.commands import translate
from transformer.core.decoding import beam_search, greedy_decode
from transformer.inference.translator import encode_lines
from transformer.runtime.checkpoints import load_for_inference
from transformer.training.corpus import read_lines

SENTENCES = [
    "Ein Hund rennt durch den Schnee.",
    "Zwei Männer.",
    "Eine Frau mit einem roten Hut sitzt am Tisch.",
]


def expected(checkpoint, sentences, beam_size=1, alpha=0.6) -> list[str]:
    """Each sentence decoded alone, straight from the decoding functions."""
    model, tokenizer, config = load_for_inference(checkpoint)
    offset = config.eval.max_len_offset
    lines = []
    for sentence in sentences:
        src = torch.tensor([tokenizer.encode(sentence) + [tokenizer.eos_id]])  # (1, S)
        if beam_size == 1:
            ids = greedy_decode(model, src, offset)[0]
        else:
            ids = beam_search(model, src, beam_size, alpha, offset)[0]
        lines.append(tokenizer.decode(ids))
    return lines


def test_arguments_stdin_and_file_give_the_same_lines_in_input_order(
    tiny_checkpoint, tmp_path, capsys, monkeypatch
):
    want = expected(tiny_checkpoint, SENTENCES)
    base = ["--checkpoint", str(tiny_checkpoint), "--device", "cpu", "--max-tokens", "30"]
    assert run_translate(base + SENTENCES, capsys) == (0, want, "")
    stdin = "".join(s + "\n" for s in SENTENCES).encode()
    assert run_translate(base, capsys, stdin, monkeypatch) == (0, want, "")
    path = tmp_path / "input.de"
    path.write_bytes(stdin.replace(b"\n", b"\r\n")[:-2])  # CRLF endings, no newline at the end
    out_path = tmp_path / "out.en"
    assert run_translate(base + ["--input", str(path), "--output", str(out_path)], capsys) == (0, [], "")
    assert out_path.read_text(encoding="utf-8") == "".join(line + "\n" for line in want)
    gz = tmp_path / "input.de.gz"  # a gzip file is read decompressed, as the data files are
    gz.write_bytes(gzip.compress(stdin))
    assert run_translate(base + ["--input", str(gz)], capsys) == (0, want, "")


def test_blank_lines_give_empty_lines_without_running_the_model(tiny_checkpoint, capsys, monkeypatch):
    seen = []
    real = translator_module.Translator.search
    monkeypatch.setattr(
        translator_module.Translator,
        "search",
        lambda self, src_ids, *a, **k: seen.extend(src_ids) or real(self, src_ids, *a, **k),
    )
    stdin = f"{SENTENCES[0]}\n\n   \n{SENTENCES[1]}\n".encode()
    code, lines, err = run_translate(
        ["--checkpoint", str(tiny_checkpoint), "--device", "cpu"], capsys, stdin, monkeypatch
    )
    assert code == 0 and err == ""
    assert len(lines) == 4 and lines[1] == lines[2] == "" and lines[0] and lines[3]
    assert len(seen) == 2


def test_invalid_utf8_is_replaced_with_a_warning_naming_the_line(tiny_checkpoint, capsys, monkeypatch):
    stdin = f"{SENTENCES[0]}\n".encode() + b"Ein \xff\xfe Hund\n" + f"{SENTENCES[1]}\n".encode()
    code, lines, err = run_translate(["--checkpoint", str(tiny_checkpoint)], capsys, stdin, monkeypatch)
    assert code == 0 and len(lines) == 3
    assert "<stdin> line 2: invalid UTF-8" in err and "U+FFFD" in err
    assert "line 1" not in err and "line 3" not in err


def test_long_lines_are_truncated_with_a_warning_naming_the_line(tiny_checkpoint, capsys):
    _, tokenizer, _ = load_for_inference(tiny_checkpoint)
    sources = encode_lines(["Hund " * 40, "", "Hund"], tokenizer, 10, "in.de line {n}")
    assert [None if s is None else len(s) for s in sources] == [10, None, len(tokenizer.encode("Hund"))]
    err = capsys.readouterr().err
    assert err.startswith("warning: in.de line 1:") and "truncated to the model's limit of 10" in err
    assert err.count("\n") == 1


def test_beam_search_option(tiny_checkpoint, capsys):
    argv = ["--checkpoint", str(tiny_checkpoint), "--device", "cpu", "--beam", "4", "--length-penalty", "1.0"]
    assert run_translate(argv + SENTENCES, capsys) == (0, expected(tiny_checkpoint, SENTENCES, 4, 1.0), "")
    code, lines, err = run_translate(["--checkpoint", str(tiny_checkpoint), "--beam", "0", "x"], capsys)
    assert code == 2 and lines == [] and "--beam must be >= 1" in err


def test_reference_scores_go_to_stderr(tiny_checkpoint, tmp_path, capsys):
    ref = tmp_path / "ref.en"
    ref.write_text("A dog runs through the snow.\nTwo men.\nA woman in a red hat sits at the table.\n")
    argv = ["--checkpoint", str(tiny_checkpoint), "--reference", str(ref)] + SENTENCES
    code, lines, err = run_translate(argv, capsys)
    assert code == 0 and lines == expected(tiny_checkpoint, SENTENCES)
    assert err.startswith("BLEU ") and " chrF " in err and "nrefs:1|case:mixed" in err
    ref.write_text("A dog.\nTwo men.\n")
    code, lines, err = run_translate(argv, capsys)
    assert code == 1 and lines == []
    assert err == f"error: --reference {ref} has 2 lines but the input has 3\n"


class Settings:
    """A custom class: pickled by reference, so loading it would import and build arbitrary objects."""

    def __init__(self):
        self.d_model = 32


class Payload:
    """Unpickling this would run code: it creates the file ``marker``."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_bad_checkpoints_are_one_line_errors(tiny_checkpoint, tmp_path, capsys):
    good = torch.load(tiny_checkpoint, weights_only=True)
    corrupted = tmp_path / "corrupted.pt"
    corrupted.write_bytes(os.urandom(2000))
    truncated = tmp_path / "truncated.pt"
    truncated.write_bytes(tiny_checkpoint.read_bytes()[:5000])
    incompatible = tmp_path / "incompatible.pt"
    torch.save(
        good | {"config": good["config"] | {"model": good["config"]["model"] | {"d_model": 64}}}, incompatible
    )
    unknown_key = tmp_path / "unknown_key.pt"
    torch.save(good | {"config": good["config"] | {"model": {"n_layers": 2}}}, unknown_key)
    custom = tmp_path / "custom.pt"
    torch.save(good | {"settings": Settings()}, custom)
    marker = tmp_path / "pwned"
    payload = tmp_path / "payload.pt"
    torch.save(good | {"config": Payload(str(marker))}, payload)
    cases = {
        tmp_path / "missing.pt": "does not exist",
        corrupted: "corrupted",
        truncated: "corrupted",
        incompatible: "does not match its config",
        unknown_key: "does not match its config",
        custom: "refused",
        payload: "refused",
    }
    for path, message in cases.items():
        code, lines, err = run_translate(["--checkpoint", str(path), "Ein Hund."], capsys)
        assert code == 1 and lines == [], path
        assert err.startswith("error: checkpoint") and message in err and err.count("\n") == 1, err
    assert not marker.exists()


def test_attention_pictures_for_every_translated_line(tiny_checkpoint, tmp_path, capsys, monkeypatch):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = tmp_path / "attention"
    stdin = f"{SENTENCES[0]}\n\n{SENTENCES[1]}\n".encode()
    argv = ["--checkpoint", str(tiny_checkpoint), "--attention", str(out)]
    code, lines, _ = run_translate(argv, capsys, stdin, monkeypatch)
    assert code == 0 and len(lines) == 3
    pngs = sorted(p.name for p in out.glob("*.png"))  # the tiny model has one decoder layer
    assert pngs == [
        f"line_{n}_cross_{kind}.png" for n in ("00001", "00003") for kind in ("heads_layer_0", "layer_0")
    ]
    assert all((out / name).read_bytes()[:4] == b"\x89PNG" for name in pngs)
    events = EventAccumulator(str(out), size_guidance={"images": 0})
    events.Reload()
    assert sorted(events.Tags()["images"]) == [
        f"line_{n}/cross/{kind}" for n in ("00001", "00003") for kind in ("heads_layer_0", "layer_0")
    ]


def test_help_says_where_things_go(capsys):
    assert translate.main(["--help"]) == 0
    text = capsys.readouterr().out
    assert "stderr" in text and "U+FFFD" in text and "truncated" in text


def test_cli_end_to_end_keeps_every_line(tiny_checkpoint):
    """The real command: stdin with an empty line and a line too long for the model."""
    _, tokenizer, config = load_for_inference(tiny_checkpoint)
    limit = config.model.max_positions - config.eval.max_len_offset - 1
    too_long = "Hund " * (limit + 10)
    assert len(tokenizer.encode(too_long)) > limit
    stdin = f"{SENTENCES[0]}\n\n{too_long}\n{SENTENCES[1]}\n"
    done = subprocess.run(
        [sys.executable, str(ROOT / "translate.py"), "--checkpoint", str(tiny_checkpoint), "--device", "cpu"],
        input=stdin.encode(),
        capture_output=True,
        cwd=ROOT,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr.decode()
    lines = done.stdout.decode("utf-8").split("\n")
    assert len(lines) == 5 and lines[-1] == ""  # 4 lines, each ending with "\n"
    assert lines[1] == "" and lines[0] and lines[2] and lines[3]
    assert lines[0] == expected(tiny_checkpoint, SENTENCES[:1])[0]
    err = done.stderr.decode()
    assert "<stdin> line 3:" in err and f"truncated to the model's limit of {limit}" in err
    assert "Traceback" not in err and err.count("\n") == 1


def test_input_errors_are_one_line_errors(tiny_checkpoint, tmp_path, capsys):
    base = ["--checkpoint", str(tiny_checkpoint)]
    broken_gz = tmp_path / "broken.de.gz"
    broken_gz.write_bytes(gzip.compress(b"Ein Hund.\n")[:-6])  # cut short
    cases = {
        ("--input", str(tmp_path / "missing.de")): "cannot read --input",
        ("--input", str(broken_gz)): "corrupted gzip file",
        ("--reference", "-"): "cannot both come from stdin",
        ("--output", str(tmp_path / "no" / "such" / "out.en"), "x"): "cannot write --output",
        ("--device", "tpu", "x"): "--device tpu",
        ("--input", "x.de", "x"): None,  # a usage error, exit status 2
    }
    for extra, message in cases.items():
        code, lines, err = run_translate(base + list(extra), capsys)
        assert lines == []
        if message is None:
            assert code == 2 and "SENTENCEs or --input" in err
        else:
            assert code == 1 and err.startswith("error: ") and message in err and err.count("\n") == 1, err


# ------------------------------------------------------------------ scores, n-best, alignments


def fields(lines: list[str]) -> list[list[str]]:
    return [line.split("\t") for line in lines]


def api(checkpoint, **settings):
    from transformer.inference.translator import Translator

    return Translator.from_checkpoint(checkpoint, "cpu", **settings)


def test_nbest_gives_n_ranked_lines_whose_first_is_the_plain_output(tiny_checkpoint, capsys):
    base = ["--checkpoint", str(tiny_checkpoint), "--beam", "4"]
    _, plain, _ = run_translate(base + SENTENCES, capsys)
    code, lines, err = run_translate(base + ["--nbest", "3"] + SENTENCES, capsys)
    assert code == 0 and err == "" and len(lines) == 3 * len(SENTENCES)
    rows = fields(lines)
    assert [(r[0], r[1]) for r in rows] == [(str(n), str(k)) for n in (1, 2, 3) for k in (1, 2, 3)]
    assert [r[4] for r in rows if r[1] == "1"] == plain
    assert all(float(r[2]) < 0 and float(r[3]) < 0 for r in rows)
    code, with_scores, _ = run_translate(base + ["--with-scores"] + SENTENCES, capsys)
    assert code == 0 and [line.split("\t") for line in with_scores] == [
        [r[3], r[4]] for r in rows if r[1] == "1"
    ]


def test_nbest_prints_the_score_it_ranks_by(tiny_checkpoint, tmp_path, capsys):
    """SCORE (the third column) never increases within an input's list and is LOG_PROB / lp(tokens + EOS);
    the raw LOG_PROB beside it need not decrease (it did not, in this set, when only it was printed)."""
    sources = read_lines(DATA_DIR / "val.de.gz")[:40]
    (tmp_path / "val.de").write_text("".join(s + "\n" for s in sources), encoding="utf-8")
    base = ["--checkpoint", str(tiny_checkpoint), "--beam", "4", "--nbest", "4", "--length-penalty", "2.0"]
    code, lines, _ = run_translate(base + ["--input", str(tmp_path / "val.de")], capsys)
    rows = fields(lines)
    translator = api(tiny_checkpoint, length_penalty=2.0)
    found = [h for hyps in translator.translate_ids(translator.encode(sources), 4, 4) for h in hyps]
    assert code == 0 and len(rows) == len(found) == 4 * len(sources)
    by_line = {}
    for row, hyp in zip(rows, found, strict=True):
        score, log_prob = float(row[2]), float(row[3])
        assert score == pytest.approx(log_prob / ((5 + len(hyp.ids) + hyp.ended) / 6) ** 2.0, abs=2e-6)
        by_line.setdefault(row[0], []).append((score, log_prob))
    assert all(
        [s for s, _ in ranked] == sorted((s for s, _ in ranked), reverse=True) for ranked in by_line.values()
    )
    raw_not_monotone = [
        r for r in by_line.values() if [p for _, p in r] != sorted((p for _, p in r), reverse=True)
    ]
    assert raw_not_monotone, "no list here where the length penalty reorders: the test would not tell"


def test_score_reference_of_the_nbest_gives_the_same_numbers(tiny_checkpoint, tmp_path, capsys):
    """Every n-best hypothesis that ends with EOS and whose text encodes back to its ids, scored by
    --score-reference given its source: the same log-prob to 1e-4."""
    sources = read_lines(DATA_DIR / "val.de.gz")[:40]  # the tiny model's outputs often end at the limit
    (tmp_path / "val.de").write_text("".join(s + "\n" for s in sources), encoding="utf-8")
    base = ["--checkpoint", str(tiny_checkpoint), "--device", "cpu"]
    code, lines, _ = run_translate(
        base + ["--beam", "4", "--nbest", "4", "--input", str(tmp_path / "val.de")], capsys
    )
    translator = api(tiny_checkpoint)
    found = translator.translate_ids(translator.encode(sources), beam=4, nbest=4)
    checked = [
        (row, sources[int(row[0]) - 1])
        for row, hyp in zip(fields(lines), [h for hyps in found for h in hyps])
        if hyp.ended and translator.tokenizer.encode(row[4]) == hyp.ids
    ]
    assert code == 0 and len(checked) >= 10, "too few hypotheses to compare"
    (tmp_path / "src.de").write_text("".join(src + "\n" for _, src in checked), encoding="utf-8")
    (tmp_path / "hyp.en").write_text("".join(row[4] + "\n" for row, _ in checked), encoding="utf-8")
    code, scores, err = run_translate(
        base + ["--input", str(tmp_path / "src.de"), "--score-reference", str(tmp_path / "hyp.en")], capsys
    )
    assert code == 0 and err == ""
    for (row, _), score in zip(checked, fields(scores), strict=True):
        total, n_tokens, mean = float(score[0]), int(score[1]), float(score[2])
        assert abs(total - float(row[3])) <= 1e-4
        assert (
            n_tokens == len(translator.tokenizer.encode(row[4])) + 1 and abs(mean - total / n_tokens) < 1e-5
        )


def test_score_reference_keeps_the_line_contract(tiny_checkpoint, tmp_path, capsys, monkeypatch):
    ref = tmp_path / "ref.en"
    ref.write_bytes(b"A dog runs.\nNothing here.\nTwo \xff men.\n\n")
    stdin = f"{SENTENCES[0]}\n\n{SENTENCES[1]}\n{SENTENCES[2]}\n".encode()
    code, lines, err = run_translate(
        ["--checkpoint", str(tiny_checkpoint), "--score-reference", str(ref)], capsys, stdin, monkeypatch
    )
    assert code == 0 and len(lines) == 4
    assert lines[1] == "0.000000\t0\t0.000000"  # a blank input line: nothing scored
    assert fields(lines)[3][1] == "1"  # a blank reference: its EOS alone
    assert all("nan" not in line for line in lines)
    assert f"{ref} line 3: invalid UTF-8" in err and err.count("\n") == 1
    ref.write_text("one\ntwo\n")
    monkeypatch.setattr(translator_module.Translator, "score_ids", lambda *a: pytest.fail("work was done"))
    code, lines, err = run_translate(
        ["--checkpoint", str(tiny_checkpoint), "--score-reference", str(ref)] + SENTENCES, capsys
    )
    assert (code, lines) == (1, [])
    assert err == f"error: --score-reference {ref} has 2 lines but the input has 3\n"


def test_nbest_larger_than_the_beam_is_a_one_line_error_before_any_work(tiny_checkpoint, capsys, monkeypatch):
    monkeypatch.setattr(translator_module.Translator, "translate_ids", lambda *a, **k: pytest.fail("work"))
    code, lines, err = run_translate(
        ["--checkpoint", str(tiny_checkpoint), "--beam", "2", "--nbest", "3", "x"], capsys
    )
    assert (code, lines) == (2, []) and err.startswith("error: --nbest 3 is more than the beam size 2")
    assert err.count("\n") == 1
    code, lines, err = run_translate(["--checkpoint", str(tiny_checkpoint), "--nbest", "2", "x"], capsys)
    assert code == 2 and "beam size 1" in err  # the checkpoint's beam
    code, _, err = run_translate(
        ["--checkpoint", str(tiny_checkpoint), "--score-reference", "r", "--nbest", "2", "x"], capsys
    )
    assert code == 2 and "no --nbest" in err


def test_alignments_are_pharaoh_pairs_within_the_word_counts(tiny_checkpoint, tmp_path, capsys, monkeypatch):
    align = tmp_path / "out.align"
    stdin = f"{SENTENCES[0]}\n\n{SENTENCES[2]}\n".encode()
    base = ["--checkpoint", str(tiny_checkpoint), "--beam", "2", "--alignments", str(align)]
    code, hyps, _ = run_translate(base, capsys, stdin, monkeypatch)
    sources = [SENTENCES[0], "", SENTENCES[2]]
    assert code == 0
    pairs = align.read_text(encoding="utf-8").split("\n")
    assert len(pairs) == 4 and pairs[1] == "" and pairs[3] == ""
    for line, src, hyp in zip(pairs, sources, hyps):
        links = [tuple(map(int, link.split("-"))) for link in line.split()]
        assert all(0 <= i < len(src.split()) and 0 <= j < len(hyp.split()) for i, j in links)
        assert {j for _, j in links} == set(range(len(hyp.split())))  # every target word is linked
    translator = api(tiny_checkpoint, beam_size=2)
    assert pairs[0] == " ".join(f"{i}-{j}" for i, j in translator.alignments(SENTENCES[0], hyps[0]))
    ref = tmp_path / "ref.en"
    ref.write_text("A dog runs through the snow .\n\nA woman in a red hat sits at the table.\n")
    argv = ["--checkpoint", str(tiny_checkpoint), "--score-reference", str(ref), "--alignments", str(align)]
    code, _, _ = run_translate(argv + ["--align-layer", "-1"], capsys, stdin, monkeypatch)
    lines = align.read_text(encoding="utf-8").split("\n")
    assert code == 0 and max(int(link.split("-")[1]) for link in lines[0].split()) == 6  # 7 reference words
    assert lines[0] == " ".join(
        f"{i}-{j}" for i, j in translator.alignments(SENTENCES[0], "A dog runs through the snow .")
    )
    code, _, err = run_translate(argv + ["--align-layer", "1"], capsys, stdin, monkeypatch)
    assert code == 2 and "--align-layer 1: the decoder has 1 layers" in err


def test_attention_out_holds_every_layer_and_head_with_labels(tiny_checkpoint, tmp_path, capsys):
    import numpy as np

    out = tmp_path / "attention.npz"
    code, hyps, _ = run_translate(
        ["--checkpoint", str(tiny_checkpoint), "--attention-out", str(out)] + SENTENCES[:2], capsys
    )
    assert code == 0
    arrays = np.load(out, allow_pickle=False)
    attention = api(tiny_checkpoint).attention(SENTENCES[1])  # the greedy translation, as the CLI
    for n in (1, 2):
        S, T = len(arrays[f"line_0000{n}/source_pieces"]), len(arrays[f"line_0000{n}/target_pieces"])
        assert arrays[f"line_0000{n}/cross"].shape == (1, 2, T, S)  # (L, H, T, S) of the tiny model
        assert arrays[f"line_0000{n}/encoder_self"].shape == (1, 2, S, S)
        assert arrays[f"line_0000{n}/decoder_self"].shape == (1, 2, T, T)
        assert np.allclose(arrays[f"line_0000{n}/cross"].sum(-1), 1.0, atol=1e-5)
    assert list(arrays["line_00002/source_pieces"]) == attention.source_pieces
    assert np.allclose(arrays["line_00002/cross"][0], attention.cross[0].numpy(), atol=1e-6)


def test_attention_with_score_reference_draws_the_reference(tiny_checkpoint, tmp_path, capsys):
    out, ref = tmp_path / "attention", tmp_path / "ref.en"
    ref.write_text("A dog runs through the snow.\n")
    argv = ["--checkpoint", str(tiny_checkpoint), "--attention", str(out), "--score-reference", str(ref)]
    code, _, _ = run_translate(argv + SENTENCES[:1], capsys)
    assert code == 0 and (out / "line_00001_cross_layer_0.png").is_file()
    table = (out / "line_00001_cross_top_sources.md").read_text(encoding="utf-8")
    tokenizer = api(tiny_checkpoint).tokenizer
    pieces = tokenizer.id_to_piece(tokenizer.encode("A dog runs through the snow."))
    rows = [line.split(" | ")[0].removeprefix("| ") for line in table.split("\n") if line.startswith("| ")]
    assert rows[2:] == pieces + ["</s>"]  # after the header rows: the reference's pieces, teacher-forced


def test_stream_answers_each_line_before_stdin_is_closed(tiny_checkpoint):
    import select

    command = [sys.executable, str(ROOT / "translate.py"), "--checkpoint", str(tiny_checkpoint), "--stream"]
    process = subprocess.Popen(
        command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT
    )
    try:
        answers = []
        for sentence in SENTENCES[:2]:
            process.stdin.write(sentence.encode() + b"\n")
            process.stdin.flush()
            ready, _, _ = select.select([process.stdout], [], [], 120)
            assert ready, "no answer within 120 s while stdin is still open"
            answers.append(process.stdout.readline().decode().rstrip("\n"))
        process.stdin.write(b"\n")
        process.stdin.close()
        rest = process.stdout.read().decode()
        assert process.wait(timeout=60) == 0
    finally:
        process.kill()
    assert answers == expected(tiny_checkpoint, SENTENCES[:2]) and rest == "\n"


def test_precision_fp32_is_the_cpu_default_and_others_run(tiny_checkpoint, capsys):
    base = ["--checkpoint", str(tiny_checkpoint), "--device", "cpu"]
    _, plain, _ = run_translate(base + SENTENCES, capsys)
    assert run_translate(base + ["--precision", "fp32"] + SENTENCES, capsys) == (0, plain, "")
    code, lines, _ = run_translate(base + ["--precision", "bf16"] + SENTENCES, capsys)
    assert code == 0 and len(lines) == 3
    code, _, err = run_translate(base + ["--precision", "fp8", "x"], capsys)
    assert code == 2 and "--precision" in err


def test_api_and_cli_give_identical_outputs(tiny_checkpoint, tmp_path, capsys):
    translator = api(tiny_checkpoint, beam_size=3)
    base = ["--checkpoint", str(tiny_checkpoint), "--beam", "3"]
    assert run_translate(base + SENTENCES, capsys)[1] == translator.translate(SENTENCES)
    nbest = translator.translate_ids(translator.encode(SENTENCES), nbest=2)
    want = [f"{n}\t{k}\t{h.score:.6f}\t{h.log_prob:.6f}\t{translator.decode(h.ids)}"
            for n, hyps in enumerate(nbest, 1) for k, h in enumerate(hyps, 1)]  # fmt: skip
    assert run_translate(base + ["--nbest", "2"] + SENTENCES, capsys)[1] == want
    ref = tmp_path / "ref.en"
    refs = ["A dog runs.", "Two men.", "A woman sits."]
    ref.write_text("".join(r + "\n" for r in refs))
    code, lines, _ = run_translate(
        ["--checkpoint", str(tiny_checkpoint), "--score-reference", str(ref)] + SENTENCES, capsys
    )
    assert [float(f[0]) for f in fields(lines)] == pytest.approx(translator.score(SENTENCES, refs), abs=1e-6)


def test_scores_of_a_translation_cut_at_the_position_table_limit(tiny_checkpoint):
    """A source at the truncation limit whose translation never ends fills every position of the model:
    its score is of exactly the tokens the search produced (it used to need max_positions + 1 positions,
    and PositionalEncoding raised, losing the whole file's output)."""
    from transformer.inference.nbest import beam_search_nbest

    translator = api(tiny_checkpoint)
    model = translator.model
    model.output_proj.register_forward_hook(
        lambda m, i, out: out.index_fill(-1, torch.tensor(model.eos_id), -1e4)
    )
    warned = []
    translator.warn = warned.append
    long = " ".join(SENTENCES * 100)  # truncated to max_source_tokens, with a warning
    [hyp] = translator.translate_ids(translator.encode([long]), beam=1, with_scores=True)[0]
    assert warned and not hyp.ended and len(hyp.ids) == model.config.max_positions
    src = torch.tensor([translator.encode([long])[0] + [model.eos_id]])  # (1, S)
    [[(ids, log_prob)]] = beam_search_nbest(model, src, 1, 0.6, translator.settings.max_len_offset, 1)
    assert ids == hyp.ids and hyp.log_prob == pytest.approx(log_prob, rel=1e-5)  # float32 over ~1000 tokens
    text, score = translator.translate([long, SENTENCES[0]], with_scores=True)[0]  # batched with another
    assert text == translator.decode(ids) and score == pytest.approx(hyp.log_prob, rel=1e-5)


def test_a_released_model_without_the_hf_extra_is_a_one_line_error(tmp_path, capsys, monkeypatch):
    """Without transformers, --checkpoint FOLDER (or hf:NAME) is the one-line error --help promises."""
    import builtins

    real_import = builtins.__import__

    def no_transformers(name, *args, **kwargs):
        if name == "transformers" or name.startswith("transformers."):
            raise ImportError("No module named 'transformers'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_transformers)
    for checkpoint in (str(tmp_path), "hf:Helsinki-NLP/opus-mt-en-de"):
        code, lines, err = run_translate(["--checkpoint", checkpoint, "Ein Hund."], capsys)
        assert (code, lines) == (1, []) and err.count("\n") == 1, err
        assert err.startswith("error: ") and "needs transformers" in err and 'pip install -e ".[hf]"' in err
