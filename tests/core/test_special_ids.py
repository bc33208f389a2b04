"""The special ids belong to the model: batching, the losses and the searches all read them there, so a
model that starts its decoder from PAD (``Transformer(..., start_id=pad)``; a run's
``variant.decoder_start_token: pad``, as Marian) is trained, validated, scored and decoded from PAD alike; ids
that cannot work together are refused by name."""

import pytest
import torch
from helpers import CONFIGS

from transformer.commands import train
from transformer.core.batches import iter_batches, make_batches
from transformer.core.config import ModelConfig
from transformer.core.model import Transformer
from transformer.core.tokenizer import BOS_ID, EOS_ID, PAD_ID
from transformer.interop.variant import VariantTransformer
from transformer.runtime.configs import VariantConfig, load_config
from transformer.training.run import setup

TINY = CONFIGS / "tiny.yaml"


def test_a_pad_start_model_trains_from_pad(multi30k_dir, tmp_path):
    """Before: the model decoded from PAD but was trained on batches that start with the tokenizer's BOS."""
    overrides = ["variant.decoder_start_token=pad", f"data.data_dir={multi30k_dir}", "data.train_limit=200"]
    run = setup(load_config(TINY, overrides), tmp_path / "run", resume=False, overwrite=False)
    try:
        assert run.model.start_id == PAD_ID != BOS_ID
        batch = next(iter(train.epoch_batches(run)))
        assert (batch.tgt_in[:, 0] == PAD_ID).all()  # the training input starts as decoding does
        assert run.never_produced == [PAD_ID]  # BOS is a token like any other here, PAD never a target
    finally:
        run.writer.close()


def test_teacher_forced_scores_start_where_decoding_starts():
    """The Translator's scoring batches (and validation's) start from the model's start token."""
    config = ModelConfig(d_model=16, n_heads=2, d_ff=32)
    model = Transformer(config, 20, 20, PAD_ID, BOS_ID, EOS_ID, start_id=PAD_ID)
    src, tgt = [[5, 6, 7], [8, 9]], [[10, 11], [12]]
    batches = make_batches([3, 2], [2, 1], 100, shuffle=False)
    batch = next(iter(iter_batches(src, tgt, batches, *model.pad_start_eos)))
    assert batch.tgt_in[:, 0].tolist() == [PAD_ID, PAD_ID]
    assert batch.tgt_out[batch.tgt_out != PAD_ID].tolist().count(EOS_ID) == 2


@pytest.mark.parametrize(
    ("ids", "message"),
    [
        ((0, 3, 3), "the decoder starts from id 3, which is also eos_id"),  # (pad, bos, eos[, start])
        ((3, 2, 3, 3), "the decoder starts from id 3, which is also eos_id"),
        ((0, -1, 3), "bos_id=-1 is not in a vocabulary of 20 tokens"),
        ((0, 2, 20), "eos_id=20 is not in a vocabulary of 20 tokens"),
    ],
)
def test_special_ids_that_cannot_work_are_refused_by_name(ids, message):
    config = ModelConfig(d_model=16, n_heads=2, d_ff=32)
    with pytest.raises(ValueError, match=message):
        Transformer(config, 20, 20, *ids)
    if len(ids) == 4:  # a Marian variant that starts from PAD, when PAD is EOS too
        with pytest.raises(ValueError, match=message):
            VariantTransformer(config, VariantConfig(decoder_start_token="pad"), 20, 20, *ids[:3])


def test_the_searches_read_the_model_ids():
    """Greedy search starts from the model's start token and stops at its EOS: no id passed in."""
    from transformer.core.decoding import greedy_decode

    torch.manual_seed(0)
    config = ModelConfig(d_model=16, n_heads=2, d_ff=32, share_embeddings=False)
    model = VariantTransformer(config, VariantConfig(output_bias=True), 20, 20, 0, 2, 7).eval()
    with torch.no_grad():
        model.output_proj.bias[7] = 100.0  # EOS (id 7 here) first
    assert greedy_decode(model, torch.tensor([[5, 6, 3]]), 5) == [[]]
    pad_start = VariantTransformer(config, VariantConfig(decoder_start_token="pad"), 20, 20, 0, 2, 7)
    assert pad_start.start_id == 0 and model.start_id == 2
