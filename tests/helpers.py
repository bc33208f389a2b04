"""What the tests share, beside conftest.py's fixtures: where the checkout and Multi30k are, small seeded
random models, sources and batches, the commands run in-process, and a CPU with chosen instructions."""

import contextlib
import io
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from transformer.commands import train, translate
from transformer.core.config import ModelConfig
from transformer.core.model import Transformer
from transformer.training import multi30k

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = ROOT / "transformer" / "configs"  # the configs the package ships
TINY = str(CONFIGS / "tiny.yaml")

# Multi30k, found by the project's one rule ($MULTI30K_DIR, else your data folder: data/README.md).
# `make test` fetches it first (`make data`); a test never skips for missing data, it fails and says how to
# get it.
DATA_DIR, _ = multi30k.locate()

needs_data = pytest.mark.usefixtures("multi30k_dir")  # a test that reads DATA_DIR: fails without it


# -------- small random models and batches --------------------------------------------------------

PAD, UNK, BOS, EOS = 0, 1, 2, 3  # the tokenizer's special ids
V = 20


def random_model(
    seed, eos_bias=0.0, norm_first=False, vocab_size=V, max_positions=64, bias=None, output_std=1.0
):
    """A random float64 model; ``eos_bias`` (or a whole (V,) ``bias``) is added to its logits."""
    torch.manual_seed(seed)
    config = ModelConfig(
        d_model=16, n_heads=2, d_ff=32, n_encoder_layers=2, n_decoder_layers=2,
        norm_first=norm_first, share_embeddings=False, max_positions=max_positions,
    )  # fmt: skip
    model = Transformer(config, vocab_size, vocab_size, pad_id=PAD, bos_id=2, eos_id=3).double().eval()
    torch.nn.init.normal_(model.output_proj.weight, std=output_std)
    if bias is None:
        bias = torch.zeros(vocab_size, dtype=torch.float64)
        bias[EOS] = eos_bias
    model.output_proj.register_forward_hook(lambda module, inputs, logits: logits + bias)
    return model


def pad_sources(sentences: list[list[int]]) -> torch.Tensor:
    """Token-id lists -> (B, S) rows of ids + EOS, padded at the end."""
    S = max(len(s) for s in sentences) + 1
    return torch.tensor([s + [EOS] + [PAD] * (S - len(s) - 1) for s in sentences])  # (B, S)


def random_sources(seed, batch=8, max_len=7, vocab_size=V) -> torch.Tensor:
    """(B, S) sources of 1 to max_len - 1 random ordinary tokens + EOS, padded."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, max_len, (batch,), generator=g).tolist()
    return pad_sources([torch.randint(EOS + 1, vocab_size, (n,), generator=g).tolist() for n in lengths])


def random_batch(seed, B=3, T=5, D=6, V=11):
    generator = torch.Generator().manual_seed(seed)
    features = torch.randn(B, T, D, generator=generator, requires_grad=True)
    proj = torch.nn.Linear(D, V)
    with torch.no_grad():
        proj.weight.copy_(torch.randn(V, D, generator=generator))
        proj.bias.copy_(torch.randn(V, generator=generator))
    tgt_out = torch.randint(3, V, (B, T), generator=generator)
    tgt_out[0, 3:] = PAD  # padding at the end of one row
    tgt_out[1, 4] = PAD
    return features, proj, tgt_out


def fake_ids(src_lengths, tgt_lengths):
    """Token ids with the right lengths, none of them special: sentence i is all (i % 50) + 4."""
    src = [[i % 50 + 4] * n for i, n in enumerate(src_lengths)]
    tgt = [[i % 50 + 4] * n for i, n in enumerate(tgt_lengths)]
    return src, tgt


def as_lists(batches):
    """make_batches' int64 arrays as lists of ints, to compare whole epochs."""
    assert all(batch.dtype == np.int64 for batch in batches)
    return [batch.tolist() for batch in batches]


def as_pre_norm(checkpoint: Path, path: Path) -> Path:
    """The checkpoint made pre-norm (``model.norm_first: true``) with seeded final LayerNorms off 1 / 0:
    the same trained layers, another function, for the exports of pre-norm models."""
    state = torch.load(checkpoint, weights_only=True)
    state["config"]["model"]["norm_first"] = True
    D = state["model"]["encoder.layers.0.ffn_norm.weight"].numel()
    g = torch.Generator().manual_seed(3)
    for stack in ("encoder", "decoder"):
        state["model"][f"{stack}.final_norm.weight"] = 1.0 + 0.2 * torch.randn(D, generator=g)  # (D,)
        state["model"][f"{stack}.final_norm.bias"] = 0.2 * torch.randn(D, generator=g)  # (D,)
    torch.save(state, path)
    return path


# -------- commands, in-process -------------------------------------------------------------------


# Drawing the validation sentences' attention takes most of a tiny run's time: the runs of the tests that do
# not look at the pictures draw none.
NO_HEATMAPS = "eval.n_alignment_sentences=0"


def run_train(
    run_dir: Path, *overrides: str, resume: bool = False, heatmaps: bool = False, flags: tuple[str, ...] = ()
) -> int:
    """train.py's main on the tiny config with these ``--set`` overrides (and ``flags``) -> its exit code;
    without ``heatmaps``, no attention pictures."""
    argv = ["--config", TINY, "--run-dir", str(run_dir), "--data-dir", str(DATA_DIR), *flags]
    overrides = overrides if heatmaps else (NO_HEATMAPS, *overrides)
    argv += [f"--set={o}" for o in overrides] + (["--resume"] if resume else [])
    return train.main(argv)


def run_translate(argv, capsys, stdin: bytes | None = None, monkeypatch=None):
    """main(argv) -> (exit code, stdout lines, stderr)."""
    if stdin is not None:
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin)))
    code = translate.main(argv)
    out, err = capsys.readouterr()
    return code, out.split("\n")[:-1] if out else [], err


def run_command(main, argv: list[str]) -> subprocess.CompletedProcess:
    """A command's ``main(argv)`` in this process, reported as ``subprocess.run`` would report the script:
    exit code, stdout, stderr (without the second's start-up: torch is imported once per test run)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exit:  # argparse's usage errors
            code = exit.code if isinstance(exit.code, int) else int(exit.code is not None)
    return subprocess.CompletedProcess(argv, code, out.getvalue(), err.getvalue())


# -------- the machine ----------------------------------------------------------------------------


def cpu_with(monkeypatch, *features: str) -> None:
    """This CPU, as PyTorch reports it, has exactly these of AVX512-BF16, AMX and VNNI."""
    for name in ("avx512_bf16", "amx_tile", "vnni"):
        monkeypatch.setattr(torch.cpu, f"_is_{name}_supported", lambda has=name in features: has)
