"""translate.py: one output line per input line whatever the input, scores on stderr, alignment pictures,
and one-line errors for bad checkpoints. Runs the tiny checkpoint trained once per session."""

import io
import os
import subprocess
import sys
from pathlib import Path

import torch

import translate
from transformer.checkpoint import load_for_inference
from transformer.decoding import beam_search, greedy_decode

ROOT = Path(__file__).resolve().parent.parent
SENTENCES = [
    "Ein Hund rennt durch den Schnee.",
    "Zwei Männer.",
    "Eine Frau mit einem roten Hut sitzt am Tisch.",
]


def run(argv, capsys, stdin: bytes | None = None, monkeypatch=None):
    """main(argv) -> (exit code, stdout lines, stderr)."""
    if stdin is not None:
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin)))
    code = translate.main(argv)
    out, err = capsys.readouterr()
    return code, out.split("\n")[:-1] if out else [], err


def expected(checkpoint, sentences, beam_size=1, alpha=0.6) -> list[str]:
    """Each sentence decoded alone, straight from the decoding functions."""
    model, tokenizer, config = load_for_inference(checkpoint)
    offset = config.eval.max_len_offset
    lines = []
    for sentence in sentences:
        src = torch.tensor([tokenizer.encode(sentence) + [tokenizer.eos_id]])  # (1, S)
        if beam_size == 1:
            ids = greedy_decode(model, src, tokenizer.bos_id, tokenizer.eos_id, offset)[0]
        else:
            ids = beam_search(model, src, tokenizer.bos_id, tokenizer.eos_id, beam_size, alpha, offset)[0]
        lines.append(tokenizer.decode(ids))
    return lines


def test_arguments_stdin_and_file_give_the_same_lines_in_input_order(
    tiny_checkpoint, tmp_path, capsys, monkeypatch
):
    want = expected(tiny_checkpoint, SENTENCES)
    base = ["--checkpoint", str(tiny_checkpoint), "--device", "cpu", "--max-tokens", "30"]
    assert run(base + SENTENCES, capsys) == (0, want, "")
    stdin = "".join(s + "\n" for s in SENTENCES).encode()
    assert run(base, capsys, stdin, monkeypatch) == (0, want, "")
    path = tmp_path / "input.de"
    path.write_bytes(stdin.replace(b"\n", b"\r\n")[:-2])  # CRLF endings, no newline at the end
    out_path = tmp_path / "out.en"
    assert run(base + ["--input", str(path), "--output", str(out_path)], capsys) == (0, [], "")
    assert out_path.read_text(encoding="utf-8") == "".join(line + "\n" for line in want)


def test_blank_lines_give_empty_lines_without_running_the_model(tiny_checkpoint, capsys, monkeypatch):
    seen = []
    real = translate.translate_ids
    monkeypatch.setattr(
        translate,
        "translate_ids",
        lambda model, src_ids, *a: seen.extend(src_ids) or real(model, src_ids, *a),
    )
    stdin = f"{SENTENCES[0]}\n\n   \n{SENTENCES[1]}\n".encode()
    code, lines, err = run(
        ["--checkpoint", str(tiny_checkpoint), "--device", "cpu"], capsys, stdin, monkeypatch
    )
    assert code == 0 and err == ""
    assert len(lines) == 4 and lines[1] == lines[2] == "" and lines[0] and lines[3]
    assert len(seen) == 2


def test_invalid_utf8_is_replaced_with_a_warning_naming_the_line(tiny_checkpoint, capsys, monkeypatch):
    stdin = f"{SENTENCES[0]}\n".encode() + b"Ein \xff\xfe Hund\n" + f"{SENTENCES[1]}\n".encode()
    code, lines, err = run(["--checkpoint", str(tiny_checkpoint)], capsys, stdin, monkeypatch)
    assert code == 0 and len(lines) == 3
    assert "<stdin> line 2: invalid UTF-8" in err and "U+FFFD" in err
    assert "line 1" not in err and "line 3" not in err


def test_long_lines_are_truncated_with_a_warning_naming_the_line(tiny_checkpoint, capsys):
    _, tokenizer, _ = load_for_inference(tiny_checkpoint)
    sources = translate.encode_lines(["Hund " * 40, "", "Hund"], tokenizer, 10, "in.de line {n}")
    assert [None if s is None else len(s) for s in sources] == [10, None, len(tokenizer.encode("Hund"))]
    err = capsys.readouterr().err
    assert err.startswith("warning: in.de line 1:") and "truncated to the model's limit of 10" in err
    assert err.count("\n") == 1


def test_beam_search_option(tiny_checkpoint, capsys):
    argv = ["--checkpoint", str(tiny_checkpoint), "--device", "cpu", "--beam", "4", "--length-penalty", "1.0"]
    assert run(argv + SENTENCES, capsys) == (0, expected(tiny_checkpoint, SENTENCES, 4, 1.0), "")
    code, lines, err = run(["--checkpoint", str(tiny_checkpoint), "--beam", "0", "x"], capsys)
    assert code == 2 and lines == [] and "--beam must be >= 1" in err


def test_reference_scores_go_to_stderr(tiny_checkpoint, tmp_path, capsys):
    ref = tmp_path / "ref.en"
    ref.write_text("A dog runs through the snow.\nTwo men.\nA woman in a red hat sits at the table.\n")
    argv = ["--checkpoint", str(tiny_checkpoint), "--reference", str(ref)] + SENTENCES
    code, lines, err = run(argv, capsys)
    assert code == 0 and lines == expected(tiny_checkpoint, SENTENCES)
    assert err.startswith("BLEU ") and " chrF " in err and "nrefs:1|case:mixed" in err
    ref.write_text("A dog.\nTwo men.\n")
    code, lines, err = run(argv, capsys)
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
        code, lines, err = run(["--checkpoint", str(path), "Ein Hund."], capsys)
        assert code == 1 and lines == [], path
        assert err.startswith("error: checkpoint") and message in err and err.count("\n") == 1, err
    assert not marker.exists()


def test_attention_pictures_for_every_translated_line(tiny_checkpoint, tmp_path, capsys, monkeypatch):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = tmp_path / "attention"
    stdin = f"{SENTENCES[0]}\n\n{SENTENCES[1]}\n".encode()
    argv = ["--checkpoint", str(tiny_checkpoint), "--attention", str(out)]
    code, lines, _ = run(argv, capsys, stdin, monkeypatch)
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
    cases = {
        ("--input", str(tmp_path / "missing.de")): "cannot read --input",
        ("--reference", "-"): "cannot both come from stdin",
        ("--output", str(tmp_path / "no" / "such" / "out.en"), "x"): "cannot write --output",
        ("--device", "tpu", "x"): "--device tpu",
        ("--input", "x.de", "x"): None,  # a usage error, exit status 2
    }
    for extra, message in cases.items():
        code, lines, err = run(base + list(extra), capsys)
        assert lines == []
        if message is None:
            assert code == 2 and "SENTENCEs or --input" in err
        else:
            assert code == 1 and err.startswith("error: ") and message in err and err.count("\n") == 1, err
