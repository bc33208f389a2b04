"""The searches' inner operations, faster on the CPU and equal in results to the plain ones of
``core/decoding.py``'s ``Kernels`` (tests/fast/test_fast_search.py compares whole searches):

- ``best_token``: ``max(dim).indices``, the same index as ``argmax`` and faster on the CPU;
- ``row_best``: the output layer and the scoring SCORE_ROWS rows at a time on a CPU (a bounded buffer,
  where an (N, V) one would be allocated at every step, its page faults costing as much as the top-k over
  it), the log-softmax written over the logits (one fused pass, where ``logsumexp`` makes four and a
  copy), and the two-pass top-k of ``topk.py``;
- ``shares_memory``: a sentence's K beams attend to one copy of its memory (``FastMultiHeadAttention``),
  and the first step decodes each sentence's start token once, not K times (as CTranslate2 does);
- ``select_rows``: the past tokens' keys / values are selected when the next step appends its own (one
  copy instead of two, ``attention.append_step``); the memory's are stored contiguously after the first
  step, so that no later step copies them.

They go with a model whose modules are the fast twins (``twins.speed_up``): ``runtime.search.kernels_for``
gives both. Beam search's linear layers on prepacked weights (``prepacked.py``) are chosen by the batched
search (``runtime/search.py``), around a whole decoding job.

Why each was chosen, and what it buys: docs/benchmarks.md, "Speed choices in the code".
"""

import torch

from transformer.core.decoding import Kernels, next_token_logits
from transformer.core.model import Cache, Transformer
from transformer.fast.attention import FastMultiHeadAttention
from transformer.fast.topk import best_index, top_k

# rows of next-token logits (·, V) made and scored at a time on a CPU (the size that scored fastest)
SCORE_ROWS = 512


class FastKernels(Kernels):
    def shares_memory(self, model: Transformer) -> bool:
        return all(isinstance(layer.cross_attn, FastMultiHeadAttention) for layer in model.decoder.layers)

    def best_token(self, scores: torch.Tensor) -> torch.Tensor:
        return best_index(scores)  # (N,)

    def row_best(self, features, model: Transformer, k: int, dtype: torch.dtype, restrict=None):
        chunk = SCORE_ROWS if features.device.type == "cpu" else features.size(0)
        log_probs, tokens = [], []
        for start in range(0, features.size(0), chunk):
            rows = slice(start, start + chunk)
            logits = next_token_logits(model, features[rows]).to(dtype)  # (r, V)
            # in place: each row is read whole before it is written (tests/fast/test_fast_search.py pins it)
            scores = torch._log_softmax(logits, -1, False, out=logits)  # (r, V) log p
            if restrict is not None:
                scores = restrict(scores, rows)
            best, best_tokens = top_k(scores, k)  # (r, k) each
            log_probs.append(best)
            tokens.append(best_tokens)
        return torch.cat(log_probs), torch.cat(tokens)  # (N, k) each

    def select_rows(self, cache: Cache, rows: torch.Tensor, parts=("self", "cross")) -> None:
        for layer in cache:
            for name in parts:
                part = layer[name]
                if name == "self":  # taken by the next step's append, composed with any taken before
                    part["rows"] = rows if "rows" not in part else part["rows"][rows]
                else:
                    part["k"], part["v"] = part["k"].index_select(0, rows), part["v"].index_select(0, rows)

    def first_step_done(self, cache: Cache) -> None:
        for layer in cache:  # views of one fused projection until now
            for name, tensor in layer["cross"].items():
                layer["cross"][name] = tensor.contiguous()


FAST = FastKernels()
