"""int8 decoding: a copy of a trained model whose linear layers hold int8 weights, for ``--precision int8``
and ``--precision int8-bf16``.

Every ``nn.Linear`` (the attention projections, the feed-forward layers, and the output projection unless it
is tied to the target embedding: ``untied_linear``) keeps its weight as int8 with one scale per output
channel. The two precisions differ in what the weights are multiplied with:

- ``int8``: the input of each linear layer is quantized to int8 per token at run time (dynamic
  quantization, what CTranslate2's ``int8`` does); the products are summed in int32 and scaled back to fp32.
  Everything else stays fp32: the embeddings, LayerNorm, softmax, and the attention's own matmuls of
  activations by activations (Eq. 1), which have no weights to quantize.
- ``int8-bf16``: the whole model runs in bf16 and each linear layer multiplies its bf16 input by its int8
  weights widened to bf16 (torchao's weight-only quantization: the widened copy is made at every call, then
  one bf16 matmul and the scales): int8 storage, bf16 products. For CPUs with bf16 instructions
  (AVX512-BF16 or AMX). Not CTranslate2's ``int8_bfloat16``, which multiplies in int8 and keeps bf16 for
  the other layers.

Both go through ``torchao`` (``quantize_`` with ``Int8DynamicActivationInt8WeightConfig`` or
``Int8WeightOnlyConfig``), the maintained successor of ``torch.ao.quantization``, whose dynamic
quantization is deprecated; no matmul here is written by hand. The optional extra ``pip install -e
".[int8]"`` installs it; the rest of the package never imports it. Decoding only: a quantized model is
never trained or saved. Scores (log-probabilities, beam sums) stay fp32 in both.

Speed, measured (docs/benchmarks.md), on a CPU with AMX: ``int8-bf16`` greedy decoding runs ~1.2x our fp32
and above CTranslate2 ``int8``; ``int8`` runs at about two thirds of fp32. On a CPU, torchao's dynamic int8
linear layer is written to be fused by Inductor (``torch.compile``); run eagerly, as here, its per-token
quantization of the input costs more than the int8 matmul saves. Compiling each quantized layer
(``torch.compile(dynamic=True)``) makes a feed-forward block 2x faster than fp32 alone, but recompiles for
every layer's weight and hits Dynamo's recompile limit within one translation. ``bench/int8_linear.py``
times the same math without the tensor subclass: 2-4x faster than torchao's layer, yet still slower than
fp32 at decoding's 8-64 rows in every layer but the output layer.
The fastest on such a CPU stays ``--precision bf16`` (a bf16 copy of the model:
``translator.decoding_model``); ``int8-bf16`` trades a little of its speed for linear weights half their
bf16 size. Both gain only after their first pass over the data: oneDNN compiles a kernel for every new
bf16 matmul shape.
"""

import copy
import logging
from collections.abc import Callable

from torch import nn

from transformer.config import QUANTIZED_PRECISIONS
from transformer.model import Transformer

QUANTIZED = QUANTIZED_PRECISIONS  # the decoding precisions that quantize (config.py holds the list)
INT8, INT8_BF16 = QUANTIZED  # int8 weights with int8 inputs quantized per token | with bf16 inputs, products


def quantized_model(model: Transformer, precision: str) -> Transformer:
    """A copy of ``model`` with int8 linear layers for ``precision`` (one of ``QUANTIZED``), in eval mode,
    on the CPU; ``model`` itself is left as it is."""
    logging.getLogger("torchao").setLevel(logging.ERROR)  # its optional GPU kernels fail to load on a CPU
    try:
        from torchao.quantization import Int8DynamicActivationInt8WeightConfig as Int8Dynamic
        from torchao.quantization import Int8WeightOnlyConfig, quantize_
    except ImportError:
        raise ValueError(f'--precision {precision} needs torchao: pip install -e ".[int8]"') from None
    quantized = copy.deepcopy(model).cpu().eval()
    if precision == INT8:
        config = Int8Dynamic(set_inductor_config=False)  # nothing here is compiled
    elif precision == INT8_BF16:
        quantized, config = quantized.bfloat16(), Int8WeightOnlyConfig(set_inductor_config=False)
    else:
        raise ValueError(f"quantized precisions are {', '.join(QUANTIZED)}, got {precision!r}")
    quantize_(quantized, config, filter_fn=untied_linear(quantized))  # in place
    return quantized


def untied_linear(model: nn.Module) -> Callable[[nn.Module, str], bool]:
    """Which modules to quantize: every ``nn.Linear`` but one whose weight an embedding shares (the output
    projection tied to the target embedding, §3.4). Quantizing that one would store the vocabulary matrix
    twice, int8 for the projection and unquantized for the lookup; left as it is, it is stored once and
    the output layer multiplies in the model's dtype (fp32, or bf16 for int8-bf16)."""
    shared = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    return lambda module, name: isinstance(module, nn.Linear) and id(module.weight) not in shared
