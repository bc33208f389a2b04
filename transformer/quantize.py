"""int8 decoding: a copy of a trained model whose linear layers multiply in int8, for ``--precision int8``.

Every ``nn.Linear`` (the attention projections, the feed-forward layers and the output projection) keeps
its weight as int8 with one scale per output channel, and quantizes its input to int8 per token at run time
(dynamic quantization, what CTranslate2's int8 does); the products are summed in int32 and scaled back to
fp32. Everything else stays fp32: the embeddings, LayerNorm, softmax, and the attention's own matmuls of
activations by activations (Eq. 1), which have no weights to quantize.

It goes through ``torchao`` (``quantize_`` with ``Int8DynamicActivationInt8WeightConfig``), the maintained
successor of ``torch.ao.quantization``, whose dynamic quantization is deprecated; no matmul here is written
by hand. The optional extra ``pip install -e ".[int8]"`` installs it; the rest of the package never imports
it. Decoding only: a quantized model is never trained or saved.

Speed, measured (docs/benchmarks.md): on a CPU, torchao's int8 linear layer is written to be fused by
Inductor (``torch.compile``); run eagerly, as here, its per-token quantization costs more than the int8
matmul saves, and greedy decoding runs at about two thirds of the fp32 speed. Compiling each quantized layer
(``torch.compile(dynamic=True)``) makes a feed-forward block 2x faster than fp32 alone, but recompiles for
every layer's weight and hits Dynamo's recompile limit within one translation. ``bench/int8_linear.py``
times the same math without the tensor subclass: 2-4x faster than torchao's layer, yet still slower than
fp32 at decoding's 8-64 rows in every layer but the output layer, on a CPU with AMX. What int8 gives today
is weights four times smaller, with BLEU within noise of fp32.
"""

import copy
import logging

from transformer.model import Transformer

INT8 = "int8"  # the decoding precision that quantizes (translate.py --precision int8)


def int8_model(model: Transformer) -> Transformer:
    """A quantized copy of ``model`` (in eval mode, on the CPU); ``model`` itself is left as it is."""
    logging.getLogger("torchao").setLevel(logging.ERROR)  # its optional GPU kernels fail to load on a CPU
    try:
        from torchao.quantization import Int8DynamicActivationInt8WeightConfig, quantize_
    except ImportError:
        raise ValueError('--precision int8 needs torchao: pip install -e ".[int8]"') from None
    quantized = copy.deepcopy(model).cpu().eval()
    quantize_(quantized, Int8DynamicActivationInt8WeightConfig())  # every nn.Linear, in place
    return quantized
