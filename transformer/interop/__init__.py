"""Other people's models and formats, out of the reading path of the model itself:

- ``formats.py``: the door the other tiers use, which imports the rest only when a released model is met;

- ``marian.py``: Hugging Face Marian (opus-mt) models in (``from_marian``) and ours out (``to_marian``,
  ``export``: a transformers folder and a CTranslate2 model); pre-norm ones as Pegasus, Marian's pre-norm
  twin;
- ``variant.py``: where a Marian model differs from the paper (activation, sinusoid layout, embedding
  scale, output bias, start token): the core's model with those parts swapped in;
- ``released.py``: a released Marian folder or ``hf:NAME`` run by our code with its own tokenizer;
- ``slim.py``: an inference-only checkpoint (config, weights, tokenizer), optionally in bf16.
"""
