"""Every Multi30k config's learning-rate schedule fits its run: warmup (§5.3) ends well before the run can
end, with the steps per epoch measured from the real token-bucket batches of the mirror."""

import tempfile
from pathlib import Path

import pytest
from helpers import CONFIGS, DATA_DIR, ROOT, needs_data

from transformer.core.batches import make_batches
from transformer.runtime.configs import Config, load_config
from transformer.training.multi30k import load_multi30k
from transformer.training.splits import clean_pairs, encode_split
from transformer.training.tokenizer_job import train_tokenizer

CONFIG_FILES = sorted(CONFIGS.glob("*.yaml"))
WARMUP_SHARE = 0.5  # warmup may take at most this share of the shortest possible run
TIME_ONLY_EPOCHS = 2  # a run bounded only by max_minutes: warmup within this many epochs


def steps_per_epoch(config: Config) -> float:
    """Optimizer updates in one epoch of this config's training batches (one process)."""
    data = config.data
    train = load_multi30k(data.src_lang, data.tgt_lang, DATA_DIR)["train"].head(data.train_limit)
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer = train_tokenizer(
            train.src + train.tgt, Path(tmp) / "sp", data.vocab_size, data.tokenizer_type
        )
    src, tgt = encode_split(train, tokenizer)
    src_lengths, tgt_lengths = [len(s) for s in src], [len(t) for t in tgt]
    keep, _ = clean_pairs(src_lengths, tgt_lengths, None, data)
    batches = make_batches(src_lengths, tgt_lengths, data.max_tokens, True, config.train.seed, indices=keep)
    return len(batches) / config.train.accum_steps


def run_steps(config: Config, per_epoch: float) -> float | None:
    """The fewest updates the run can end after (max_steps, max_epochs); None if only the clock bounds it."""
    bounds = [config.train.max_steps] if config.train.max_steps else []
    bounds += [config.train.max_epochs * per_epoch] if config.train.max_epochs else []
    return min(bounds) if bounds else None


@needs_data
@pytest.mark.parametrize("path", CONFIG_FILES, ids=lambda p: p.name)
def test_warmup_ends_well_before_the_run_can_end(path):
    config = load_config(path)
    if config.data.dataset != "multi30k":  # epochs unknown here: the step budget bounds it
        assert config.train.max_steps and config.train.warmup_steps <= WARMUP_SHARE * config.train.max_steps
        return
    per_epoch = steps_per_epoch(config)
    warmup, steps = config.train.warmup_steps, run_steps(config, per_epoch)
    if steps is None:
        assert warmup <= TIME_ONLY_EPOCHS * per_epoch, (
            f"{path.name}: warmup {warmup} steps is {warmup / per_epoch:.1f} epochs of {per_epoch:.0f} steps"
        )
    else:
        assert warmup <= WARMUP_SHARE * steps, (
            f"{path.name}: warmup {warmup} steps but the run can end after {steps:.0f} "
            f"({per_epoch:.0f} steps per epoch)"
        )


@needs_data
def test_the_old_base_schedule_is_caught():
    """Before the fix base.yaml had warmup 4000 and 100 epochs of 50000-token batches: it fails."""
    old = load_config(
        ROOT / "transformer/configs/base.yaml", ["train.warmup_steps=4000", "train.max_steps=100000"]
    )
    per_epoch = steps_per_epoch(old)
    assert 20 <= per_epoch <= 30  # 24 on the mirror: the paper's warmup would be 170 epochs
    assert old.train.warmup_steps > WARMUP_SHARE * run_steps(old, per_epoch)
