"""translate.py as a newcomer meets it: --help for users, a run folder as --checkpoint, one-line usage
errors with one exit status, an inline prefix exact to the sub-word, and sampling that never draws UNK."""

import subprocess
import sys

import pytest
import torch
from helpers import ROOT

from transformer.commands import translate
from transformer.inference.sampling import Sampling, sample_tokens
from transformer.inference.translator import Translator
from transformer.runtime.precision import faster_precision

SENTENCES = ["Ein Hund rennt durch den Schnee.", "Zwei Männer.", "Eine Frau sitzt am Tisch."]


def run(argv, capsys):
    code = translate.main(argv)
    out, err = capsys.readouterr()
    return code, out.splitlines(), err


def test_help_speaks_to_users_with_examples():
    done = subprocess.run(
        [sys.executable, str(ROOT / "translate.py"), "--help"], capture_output=True, text=True
    )
    assert done.returncode == 0
    intro = done.stdout.split("positional arguments")[0]
    assert "translate.py --checkpoint runs/multi30k_de_en" in intro and "--prefix-text" in intro
    assert "``" not in done.stdout and "The command line of" not in done.stdout  # no developer docstring


def test_a_run_folder_as_checkpoint_uses_its_best_pt_and_says_so(
    tiny_checkpoint, capsys, monkeypatch, tmp_path
):
    monkeypatch.chdir(tmp_path)  # from another folder
    code, from_file, _ = run(["--checkpoint", str(tiny_checkpoint), *SENTENCES], capsys)
    code_dir, from_dir, err = run(["--checkpoint", str(tiny_checkpoint.parent), *SENTENCES], capsys)
    assert code == code_dir == 0 and from_dir == from_file
    expected = "best.pt, the checkpoint its final test scored"  # results.json's "tested"
    assert err == f"translate.py: {tiny_checkpoint.parent} is a run folder: using {expected}\n"


def test_a_run_folder_resolves_to_the_checkpoint_its_final_test_scored_else_last_pt(
    tiny_checkpoint, capsys, tmp_path
):
    """eval.average_last: results.json says averaged.pt was tested; a run killed before its first
    evaluation has only last.pt, which is used with a note, never taken for a released model's folder."""
    import json
    import shutil

    import torch

    averaged = tmp_path / "averaged_run"
    averaged.mkdir()
    shutil.copyfile(tiny_checkpoint, averaged / "averaged.pt")
    beamed = torch.load(tiny_checkpoint, weights_only=True)
    beamed["config"]["eval"]["beam_size"] = 4  # best.pt decodes otherwise: which one is used shows
    torch.save(beamed, averaged / "best.pt")
    (averaged / "results.json").write_text(json.dumps({"tested": "averaged.pt"}))
    _, from_file, _ = run(["--checkpoint", str(tiny_checkpoint), *SENTENCES], capsys)
    _, from_best, _ = run(["--checkpoint", str(averaged / "best.pt"), *SENTENCES], capsys)
    code, got, err = run(["--checkpoint", str(averaged), *SENTENCES], capsys)
    assert from_best != from_file and code == 0 and got == from_file
    assert "using averaged.pt, the checkpoint its final test scored" in err
    unevaluated = tmp_path / "unevaluated_run"
    unevaluated.mkdir()
    shutil.copyfile(tiny_checkpoint, unevaluated / "last.pt")
    code, got, err = run(["--checkpoint", str(unevaluated), *SENTENCES], capsys)
    assert code == 0 and got == from_file and "using its last.pt (the run has no evaluation yet" in err


@pytest.mark.parametrize(
    "flags, says",
    [
        ([], "--checkpoint"),  # argparse's own: a missing flag
        (["--bogus"], "unrecognized arguments: --bogus"),
        (["--nbest", "2"], "--nbest 2 is more than the beam size 1"),  # found once the checkpoint is read
        (["--sample", "--beam", "4"], "--sample draws one translation token by token: no --beam 4"),
        (["--top-k", "5"], "--top-k only apply with --sample"),
        (["--sample-unk"], "--sample-unk only apply with --sample"),
        (["--prefix-text", "A", "--prefix", "p.txt"], "--prefix-text gives every search one prefix"),
        (["--align-layer", "9", "--alignments", "a.txt"], "--align-layer 9: the decoder has 1 layers"),
        (["--beam", "0"], "--beam must be >= 1"),
    ],
)
def test_every_flag_conflict_is_one_line_and_exit_status_2(
    tiny_checkpoint, capsys, tmp_path, monkeypatch, flags, says
):
    monkeypatch.chdir(tmp_path)
    checkpoint = [] if not flags else ["--checkpoint", str(tiny_checkpoint)]
    code, lines, err = run([*checkpoint, *flags, "Ein Hund."], capsys)
    assert (code, lines) == (2, []) and err.count("\n") == 1, err
    assert err.startswith("error: ") and says in err and err.endswith("(see translate.py --help)\n"), err


def test_an_inline_prefix_is_every_lines_prefix_and_exact_to_the_sub_word(tiny_checkpoint, capsys, tmp_path):
    base = ["--checkpoint", str(tiny_checkpoint), *SENTENCES]
    code, inline, _ = run([*base, "--prefix-text", "A ma"], capsys)
    (tmp_path / "p.txt").write_text("A ma\n" * len(SENTENCES), encoding="utf-8")
    code_file, from_file, _ = run([*base, "--prefix", str(tmp_path / "p.txt")], capsys)
    assert code == code_file == 0 and inline == from_file and len(inline) == 3
    assert all(line.startswith("A ma") for line in inline)  # the prefix's text, to the character
    translator = Translator.from_checkpoint(tiny_checkpoint)
    ids = translator.encode_targets(["A ma"])[0]
    assert translator.decode(ids) == "A ma"  # "ma" is forced as a piece, not as a word: the search may go on
    code_beam, beam, _ = run([*base, "--prefix-text", "A ma", "--beam", "3"], capsys)
    assert code_beam == 0 and all(line.startswith("A ma") for line in beam)


def test_sampling_never_draws_unk_unless_asked(tiny_checkpoint):
    logits = torch.zeros(4000, 10)
    logits[:, 1] = 5.0  # UNK (id 1) the most probable token by far
    generator = torch.Generator().manual_seed(0)
    drawn = sample_tokens(logits, Sampling(), generator, unk_id=1)
    assert (drawn != 1).all() and len(drawn.unique()) == 9
    allowed = sample_tokens(logits, Sampling(allow_unk=True), generator, unk_id=1)
    assert (allowed == 1).float().mean() > 0.9
    translator = Translator.from_checkpoint(tiny_checkpoint)
    flat = Sampling(temperature=100.0, seed=3)  # nearly uniform: ~2000 draws over ~300 tokens
    unk = translator.tokenizer.unk_id
    sources = translator.encode(SENTENCES * 30)
    found = translator.translate_ids(sources, 1, sampling=flat)
    assert all(unk not in hyps[0].ids for hyps in found)
    assert all(bad not in hyps[0].ids for hyps in found for bad in translator.model.never_produced)
    with_unk = translator.translate_ids(
        sources, 1, sampling=Sampling(temperature=100.0, seed=3, allow_unk=True)
    )
    assert any(unk in hyps[0].ids for hyps in with_unk)  # the same draws reach UNK once it is allowed


def test_optional_libraries_load_without_their_chatter_and_only_there(tiny_checkpoint, tmp_path):
    """The int8 path imports torchao, the export and a Marian folder transformers: nothing of theirs on
    stderr."""
    python, script = sys.executable, str(ROOT / "translate.py")
    int8 = [python, script, "--checkpoint", str(tiny_checkpoint), "--precision", "int8", "Hund"]
    int8 = subprocess.Popen(
        int8, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )  # beside the export
    export = subprocess.run([python, "-m", "transformer.interop.marian", "export", str(tiny_checkpoint),
                             str(tmp_path / "hf"), "--ct2", str(tmp_path / "ct2")],
                            capture_output=True, text=True, timeout=300, cwd=ROOT)  # fmt: skip
    int8_out, int8_err = int8.communicate(timeout=300)
    # stderr holds at most the note of our own on a CPU where bf16 is the faster choice
    note = faster_precision("int8", torch.device("cpu"))
    ours = "" if note is None else f"warning: --precision int8: {note}\n"
    assert int8.returncode == 0 and int8_err == ours, int8_err
    assert export.returncode == 0 and export.stderr == "", export.stderr
    marian = subprocess.run([python, script, "--checkpoint", str(tmp_path / "hf"), "Hund"],
                            capture_output=True, text=True, timeout=300)  # fmt: skip
    assert marian.returncode == 0 and marian.stderr == "", marian.stderr
    assert marian.stdout.strip() and int8_out.strip()  # and both translated


def test_the_quiet_block_restores_what_it_silenced():
    import logging
    import warnings

    from transformer.runtime.quiet import quiet_libraries

    logging.getLogger("torchao").setLevel(logging.INFO)
    with quiet_libraries():
        assert logging.getLogger("torchao").level == logging.ERROR
    assert logging.getLogger("torchao").level == logging.INFO
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        warnings.warn(
            "Recommended: pip install sacremoses.", UserWarning, stacklevel=1
        )  # outside the block: shown
    assert len(seen) == 1
