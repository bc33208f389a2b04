"""Decoding a list of sentences: token ids in, token ids out, batched by length, in input order.

Validation, the final test and the ``Translator`` all decode through ``decode_in_batches``; ``search`` is
its plain use (greedy search for beam 1, else beam search), the one validation and the final test run.
``search`` passes beam search's ``kernels`` (``core.decoding.PLAIN``, or ``fast.search.FAST``: chosen with the
model by ``kernels_for``).
"""

from collections.abc import Callable

import torch

from transformer.core.batches import iter_batches, make_batches, restore_order
from transformer.core.config import EvalConfig
from transformer.core.decoding import PLAIN, Kernels, Steering, beam_search, greedy_decode, max_lengths
from transformer.core.model import Transformer
from transformer.fast.prepacked import WORTH_PACKING, packed_decoder
from transformer.fast.search import FAST
from transformer.fast.twins import speed_up


def kernels_for(model: Transformer, fast: bool) -> tuple[Transformer, Kernels]:
    """(``model``, sped up in place when ``fast``; beam search's kernels that go with it)."""
    return (speed_up(model), FAST) if fast else (model, PLAIN)


def ended_with_eos(
    model: Transformer, src: list[int], hyp: list[int], max_len_offset: int, steering: Steering | None = None
) -> bool:
    """THE test of whether ``hyp``, a translation of ``src`` (ids without EOS), ended with EOS rather than at
    its length limit (as ``steering`` set it): the searches output a translation shorter than its limit
    only when EOS ended it."""
    limit = max_lengths(model, torch.tensor([src + [model.eos_id]]), max_len_offset)  # (1,)
    return len(hyp) < int(limit[0] if steering is None else steering.limits(limit)[0])


def decode_in_batches(
    model: Transformer,
    src_ids: list[list[int]],
    max_tokens: int,
    decode: Callable[[torch.Tensor, list[int]], list],
    on_batch: Callable[[int], None] | None = None,
    pack: bool = False,
) -> list:
    """``decode`` (src (B, S) on the model's device, the batch's input rows -> B results) over batches of
    sources of similar length (at most ``max_tokens`` padded tokens, the source length standing in for the
    output's); the results in input order. ``on_batch``: told each batch's number of sentences. ``pack``:
    decode on prepacked weights (``fast/prepacked.py``: beam search in fp32 on a CPU) when there are enough
    sentences to be worth it."""
    device = next(model.parameters()).device
    lengths = [len(s) for s in src_ids]
    batches = make_batches(lengths, lengths, max_tokens, shuffle=False)
    no_targets = [[] for _ in src_ids]
    outputs, order = [], []
    with packed_decoder(model, enabled=pack and len(src_ids) >= WORTH_PACKING):
        for batch in iter_batches(list(src_ids), no_targets, batches, *model.pad_start_eos):
            rows = batch.indices.tolist()
            if on_batch is not None:
                on_batch(len(rows))
            outputs += decode(batch.src.to(device), rows)
            order += rows
    return restore_order(outputs, order, len(src_ids))


@torch.no_grad()
def search(
    model: Transformer,
    src_ids: list[list[int]],
    settings: EvalConfig,
    on_batch: Callable[[int], None] | None = None,
    kernels: Kernels = PLAIN,
) -> list[list[int]]:
    """Every source (ids without EOS) -> its translation's ids, in input order: greedy search for
    ``settings.beam_size`` 1, else beam search with ``settings.length_penalty``. A source without tokens (a
    blank line) is not run through the model: its translation is empty, as ``translate.py``'s."""
    beam, penalty, offset = settings.beam_size, settings.length_penalty, settings.max_len_offset

    def decode(src: torch.Tensor, rows: list[int]) -> list[list[int]]:
        if beam > 1:
            return beam_search(model, src, beam, penalty, offset, kernels=kernels)
        return greedy_decode(model, src, offset)

    model.eval()
    device = next(model.parameters()).device
    # prepacked weights are fp32 and a fast-tier choice
    pack = kernels is FAST and beam > 1 and not torch.is_autocast_enabled(device.type)
    todo = [i for i, src in enumerate(src_ids) if src]
    found = decode_in_batches(model, [src_ids[i] for i in todo], settings.max_tokens, decode, on_batch, pack)
    outputs: list[list[int]] = [[] for _ in src_ids]
    for i, ids in zip(todo, found):
        outputs[i] = ids
    return outputs
