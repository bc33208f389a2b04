"""The benchmark scripts the GPU run relies on: train_throughput refuses to time made-up batches and honours
--max-tokens; decode_speed never trains behind the user's back and decodes an inference-only checkpoint made
beforehand (``python -m transformer.interop.slim``) exactly as the training checkpoint it came from."""

import dataclasses
import sys

import beam_sweep
import decode_speed
import int8_linear
import pytest
import sacrebleu
import torch
import train_throughput
from helpers import DATA_DIR, needs_data

from transformer.core.checkpoint import CheckpointError, load_checkpoint
from transformer.inference.translator import Translator
from transformer.interop.slim import main as slim_main
from transformer.interop.slim import slim_checkpoint
from transformer.runtime.checkpoints import load_for_inference
from transformer.training.multi30k import load_multi30k


def test_throughput_refuses_without_data(tmp_path, monkeypatch, capsys):
    """Before: one random batch, --max-tokens ignored, an MFU of nothing. After: exit 1 and why."""
    monkeypatch.setattr(sys, "argv", ["train_throughput.py", "--data-dir", str(tmp_path), "--steps", "1"])
    assert train_throughput.main() == 1
    err = capsys.readouterr().err
    assert "no Multi30k data" in err and "file not found" in err


@needs_data
def test_throughput_batches_are_real_and_honour_max_tokens():
    batches, vocab = train_throughput.real_batches(str(DATA_DIR), 600, 5, vocab_size=300)
    assert len(batches) == 5 and vocab == 300
    for batch in batches:
        B, S, T = batch.src.size(0), batch.src.size(1), batch.tgt_in.size(1)
        assert B * (S + T) <= 600 or B == 1
        assert batch.n_tgt_tokens == int((batch.tgt_out != 0).sum())  # real sentences, padded at the end


@needs_data
def test_the_profile_gives_each_models_share_in_matmuls_and_its_top_operators(capsys):
    batches, vocab = train_throughput.real_batches(str(DATA_DIR), 600, 3, vocab_size=300)
    sizes = train_throughput.ModelConfig(
        d_model=32, n_heads=2, d_ff=64, n_encoder_layers=1, n_decoder_layers=1
    )
    train_throughput.profile(sizes, batches, vocab, None, steps=2)
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in lines] == ["profile ours", "profile torch"]
    for line in lines:
        share = float(line.split("matmuls ")[1].split("%")[0])
        assert 0 < share < 100 and "aten::" in line.split("top: ")[1], line


@needs_data
def test_throughput_times_no_batch_before_every_model_has_run_it_once(monkeypatch):
    """bf16 matmuls on the CPU compile a oneDNN kernel per shape, which training compiles once (its first
    epoch) and then keeps: a step timed on a shape its model has never run would time the compiler. Each
    timed step's batch must have gone through that model before, untimed."""
    batches, vocab = train_throughput.real_batches(str(DATA_DIR), 600, 3, vocab_size=300)
    shapes = [(b.src.size(0), b.src.size(1), b.tgt_in.size(1)) for b in batches]
    assert len(set(shapes)) == 3  # distinct shapes: a shape seen twice is the same batch seen twice
    seen = []  # (model, (B, S, T)) of every forward of either model, timed or not

    def recording(name, output):
        def forward(self, src, tgt_in, **kwargs):
            seen.append((name(self), (src.size(0), src.size(1), tgt_in.size(1))))
            width = output(self) if kwargs.get("project", True) else self.config.d_model  # features: D
            return torch.zeros(*tgt_in.shape, width, requires_grad=True)  # (B, T, D) | (B, T, V)

        return forward

    def ours_or_plain(model) -> str:  # ours: the fast tier's twins in it
        return "ours" if type(model.decoder.layers[0].self_attn).__name__.startswith("Fast") else "plain"

    monkeypatch.setattr(
        train_throughput.Transformer,
        "forward",
        recording(ours_or_plain, lambda m: m.output_proj.out_features),
    )
    monkeypatch.setattr(
        train_throughput.TorchTransformerMT,
        "forward",
        recording(lambda m: "torch", lambda m: m.output_proj.out_features),
    )
    timed = []  # (model, shape, how many times that model has run that shape, this step included)

    def flops(sizes, B, S, T, V):  # called right after each timed step, whose forward is seen[-1]
        timed.append((*seen[-1], seen.count(seen[-1])))
        return 1.0

    monkeypatch.setattr(train_throughput, "step_flops", flops)
    sizes = train_throughput.ModelConfig(
        d_model=16, n_heads=2, d_ff=32, n_encoder_layers=1, n_decoder_layers=1
    )
    result = train_throughput.measure(sizes, batches, vocab, 3, "cpu", {"fp32": None})
    assert [model for model, _, _ in timed] == ["ours", "plain", "torch"] * 3  # 3 timed steps of each
    assert {shape for _, shape, _ in timed} == set(shapes)
    assert all(runs >= 2 for _, _, runs in timed), timed  # its warm-up run, then the timed one
    assert set(result) == {("ours", "fp32"), ("plain", "fp32"), ("torch", "fp32")}


def test_decode_speed_without_checkpoint_refuses_instead_of_training(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(decode_speed, "DEFAULT_RUN", tmp_path / "none")
    monkeypatch.setattr(decode_speed, "train_checkpoint", lambda *a: pytest.fail("trained a checkpoint"))
    assert decode_speed.main(["--data-dir", str(tmp_path)]) == 1
    assert "--train-minutes" in capsys.readouterr().err


def test_slim_keeps_config_model_and_tokenizer_only(tiny_checkpoint, tmp_path):
    full = load_checkpoint(tiny_checkpoint)
    slim = tmp_path / "slim.pt"
    assert slim_main([str(tiny_checkpoint), str(slim)]) == 0
    state = torch.load(slim, weights_only=True)
    assert set(state) == {"config", "model", "tokenizer"}
    assert all(torch.equal(state["model"][k], v) for k, v in full["model"].items())
    assert {"optimizer", "state", "rng"} <= set(full)  # what the slim one leaves out
    (model_a, tok_a, config_a), (model_b, tok_b, config_b) = map(load_for_inference, (tiny_checkpoint, slim))
    assert config_a == config_b and tok_a.to_bytes() == tok_b.to_bytes()
    src = torch.tensor([tok_a.encode("Ein Hund rennt durch den Schnee.") + [tok_a.eos_id]])  # (1, S)
    tgt_in = torch.tensor([[tok_a.bos_id, 5, 6]])  # (1, T)
    assert torch.equal(model_a(src, tgt_in), model_b(src, tgt_in))


def test_slim_bf16_halves_the_weights_and_still_loads(tiny_checkpoint, tmp_path):
    fp32, bf16 = tmp_path / "fp32.pt", tmp_path / "bf16.pt"
    slim_checkpoint(tiny_checkpoint, fp32)
    slim_checkpoint(tiny_checkpoint, bf16, "bf16")
    weights = [torch.load(p, weights_only=True)["model"].values() for p in (fp32, bf16)]
    n_bytes = [sum(t.numel() * t.element_size() for t in w if t.is_floating_point()) for w in weights]
    assert n_bytes[1] * 2 == n_bytes[0]
    model, _, _ = load_for_inference(bf16)
    assert all(p.dtype == torch.float32 for p in model.parameters())  # rounded weights, float32 model


def test_slim_refuses_a_bad_checkpoint_with_one_line(tmp_path, capsys):
    (tmp_path / "bad.pt").write_bytes(b"not a checkpoint")
    assert slim_main([str(tmp_path / "bad.pt"), str(tmp_path / "out.pt")]) == 1
    assert "truncated or corrupted" in capsys.readouterr().err and not (tmp_path / "out.pt").exists()
    with pytest.raises(CheckpointError):
        slim_checkpoint(tmp_path / "missing.pt", tmp_path / "out.pt")


def test_decode_speed_runs_on_a_slim_checkpoint(tiny_checkpoint, tmp_path, capsys):
    slim = tmp_path / "slim.pt"
    slim_checkpoint(tiny_checkpoint, slim)
    argv = ["--checkpoint", str(slim), "--data-dir", str(DATA_DIR), "--limit", "8", "--beam", "2"]
    assert decode_speed.main(argv) == 0
    out = capsys.readouterr().out
    assert "cached and uncached greedy outputs identical: yes" in out and "speedup_cache=" in out


@needs_data
def test_beam_sweep_ranks_on_validation_and_tests_only_the_choice(tiny_checkpoint, capsys, monkeypatch):
    """Rows sorted by validation BLEU, each the BLEU and length ratio that Translator.evaluate gives for that
    beam and α; the test set decoded once, for the first row; greedy decoded once whatever the α."""
    model, tokenizer, config = load_for_inference(tiny_checkpoint)
    corpus = load_multi30k(config.data.src_lang, config.data.tgt_lang, DATA_DIR)
    first_reference = {corpus[split].tgt[0]: split for split in ("validation", "test")}
    decoded, evaluate = [], Translator.evaluate  # the split of every decoding, in order

    def spy(self, src_ids, refs):
        decoded.append(first_reference[refs[0]])
        return evaluate(self, src_ids, refs)

    monkeypatch.setattr(Translator, "evaluate", spy)
    rows = beam_sweep.sweep(str(tiny_checkpoint), [1, 2], [0.0, 2.0], DATA_DIR, limit=40)
    monkeypatch.undo()
    assert decoded == ["validation"] * 3 + ["test"]  # greedy once, beam 2 twice; the choice on test
    assert [(beam, alpha) for _, beam, alpha, *_ in rows if beam == 1] == [(1, 0.0)] and len(rows) == 3
    assert len({val for val, *_ in rows}) > 1  # else the order below checks nothing
    assert [val for val, *_ in rows] == sorted((val for val, *_ in rows), reverse=True)
    assert rows[0][4] is not None and all(test is None for *_, test in rows[1:])
    for val, beam, alpha, ratio, test in rows:
        settings = dataclasses.replace(config.eval, beam_size=beam, length_penalty=alpha)
        translator = Translator(model, tokenizer, settings, "cpu", "fp32")
        for split, expected in (("validation", val), ("test", test)):
            if expected is not None:
                src_ids, refs = tokenizer.encode_batch(corpus[split].src[:40]), corpus[split].tgt[:40]
                _, hyps, scores = translator.evaluate(src_ids, refs)
                assert scores["bleu"] == expected
                if split == "validation":
                    assert sacrebleu.corpus_bleu(hyps, [refs]).ratio == ratio
    assert beam_sweep.main([str(tiny_checkpoint), "--beams", "2", "--alphas", "0", "1", "--data-dir",
                            str(DATA_DIR), "--limit", "8"]) == 0  # fmt: skip
    table = capsys.readouterr().out
    assert table.count("| 2 |") + table.count("| **2** |") == 2 and table.count("**") == 6


def test_int8_linear_times_the_three_precisions_of_each_shape(capsys):
    """One line per layer shape and row count, with int8's error against fp32: close, not equal."""
    pytest.importorskip("torchao")
    assert int8_linear.main(["--rows", "3", "--calls", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1 + len(int8_linear.SHAPES) and lines[-1].startswith("256->8000 rows 3: fp32 ")
    errors = [float(line.rsplit("int8 error ", 1)[1]) for line in lines[1:]]
    assert all(0 < error < 0.03 for error in errors), errors


@pytest.mark.parametrize("client", ["asyncio", "threads"])
def test_serve_load_gets_every_line_back_in_its_place(tiny_checkpoint, capsys, client):
    pytest.importorskip("uvicorn", reason='the serve extra: pip install -e ".[serve]"')
    import serve_load

    argv = ["--checkpoint", str(tiny_checkpoint), "--data-dir", str(DATA_DIR), "--sentences", "40",
            "--clients", "8", "--client", client, "--max-seconds", "120"]  # fmt: skip
    assert serve_load.main(argv) == 0  # nothing lost, duplicated or different from the Translator
    out = capsys.readouterr().out
    assert f"8 {client} clients" in out and "lost=0 duplicated=0 different=0" in out


def test_serve_abuse_answers_every_polite_line_and_refuses_each_abuse_with_its_status(
    tiny_checkpoint, capsys
):
    pytest.importorskip("uvicorn", reason='the serve extra: pip install -e ".[serve]"')
    import serve_abuse

    argv = ["--checkpoint", str(tiny_checkpoint), "--data-dir", str(DATA_DIR), "--sentences", "48",
            "--clients", "8", "--max-seconds", "120"]  # fmt: skip
    assert serve_abuse.main(argv) == 0  # nothing lost or wrong, no abusive request with a wrong status
    out = capsys.readouterr().out
    assert out.count("lost 0, duplicated 0, different 0") == 2 and "UNEXPECTED" not in out
    for kind in ("bad Unicode: {422:", "huge body: {413:", "attention, too big: {422:"):
        assert kind in out


def test_serve_latency_compares_the_service_with_the_translator_line_by_line(tiny_checkpoint, capsys):
    pytest.importorskip("uvicorn", reason='the serve extra: pip install -e ".[serve]"')
    import serve_latency

    argv = ["--checkpoint", str(tiny_checkpoint), "--data-dir", str(DATA_DIR), "--sentences", "30"]
    assert serve_latency.main(argv) == 0
    out = capsys.readouterr().out
    assert "beam 1: Translator p50" in out and "beam 4:" in out and out.count("30/30 equal") == 2
