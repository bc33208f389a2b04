"""Beam search's inner operation, faster on the CPU and equal in results to the plain one of
``core/decoding.py``'s ``Kernels`` (tests/fast/test_fast_search.py compares whole searches):

``row_best``: the output layer and the scoring SCORE_ROWS rows at a time on a CPU (a bounded buffer, where
an (N, V) one would be allocated at every step, its page faults costing as much as the top-k over it), the
log-softmax written over the logits (one fused pass, where ``logsumexp`` makes four and a copy), and the
two-pass top-k of ``topk.py``.

It goes with a model whose modules are the fast twins (``twins.speed_up``: the beams share a memory, the
cache is kept in fewer copies): ``runtime.search.kernels_for`` gives both. Beam search's linear layers on
prepacked weights (``prepacked.py``) are chosen by the batched search (``runtime/search.py``), around a
whole decoding job.

Why each was chosen, and what it buys: docs/benchmarks.md, "Speed choices in the code".
"""

import torch

from transformer.core.decoding import Kernels, next_token_logits
from transformer.core.model import Transformer
from transformer.fast.topk import top_k

# rows of next-token logits (·, V) made and scored at a time on a CPU (the size that scored fastest)
SCORE_ROWS = 512


class FastKernels(Kernels):
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


FAST = FastKernels()
