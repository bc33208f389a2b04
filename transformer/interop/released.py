"""Released translation models for ``translate.py`` and the ``Translator``: a Hugging Face Marian folder
(e.g. an opus-mt model, or one exported by ``python -m transformer.interop.marian export``: a Pegasus
folder for a pre-norm model) or a model of the hub (``hf:NAME``, read by ``interop/formats.py``).

The weights go through ``marian.from_marian`` into our own Transformer, so decoding, scoring and every
attention view run on our code; the text goes through the model's own ``MarianTokenizer``, wrapped in
``marian_text.MarianText`` to look like ``tokenizer.Tokenizer`` (ids without EOS, pieces, decode). Source
sentences are encoded with the source SentencePiece model, references (``score``, teacher-forced
attention) with the target one (``target_side``).
"""

import os
import socket
from pathlib import Path
from urllib.parse import urlparse

from transformer.core.checkpoint import CheckpointError
from transformer.core.config import EvalConfig
from transformer.core.model import Transformer
from transformer.interop.marian import MarianError, _transformers, from_marian, model_class
from transformer.interop.marian_text import MarianText
from transformer.interop.variant import variant_of
from transformer.runtime.configs import Config, DataConfig
from transformer.runtime.quiet import quiet_libraries


def hub_reachable(timeout: float = 3.0) -> bool:
    """Whether the Hugging Face Hub answers at all (``from_pretrained`` retries for ~40 s before failing)."""
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE or os.environ.get("HF_HUB_OFFLINE"):
        return False
    host = urlparse(constants.ENDPOINT).hostname or "huggingface.co"
    try:
        socket.create_connection((host, 443), timeout=timeout).close()
    except OSError:
        return False
    return True


def _model_and_tokenizer(name: str, **options):
    """(the model of the class its config.json names: Marian, or Pegasus for pre-norm; MarianTokenizer).
    config.json is read as plain JSON first: no other model class is ever built, no remote code run."""
    transformers = _transformers()
    config = transformers.PretrainedConfig.get_config_dict(name, **options)[0]
    with quiet_libraries():  # no progress bar while the weights load
        model = model_class(config.get("model_type", "marian")).from_pretrained(name, **options)
    try:
        with quiet_libraries():  # nor the advice to install sacremoses
            tokenizer = transformers.MarianTokenizer.from_pretrained(name, **options)
    except (TypeError, KeyError, AssertionError, RuntimeError) as error:  # files missing or unreadable
        raise MarianError(
            f"no readable Marian tokenizer files (source.spm, target.spm, vocab.json): {type(error).__name__}"
        ) from None
    return model, tokenizer


def load_pretrained(path: str | Path, from_hub: bool = False):
    """(MarianMTModel or PegasusForConditionalGeneration, MarianTokenizer) of a folder, or of the hub's model
    ``path`` (the local cache first); one-line CheckpointError when it cannot be had (also without the
    ``hf`` extra, or when config.json names another model type)."""
    name, is_hub = str(path), from_hub
    try:
        try:
            loaded = _model_and_tokenizer(name, local_files_only=True)
        except OSError:
            if not is_hub or not hub_reachable():
                raise
            loaded = _model_and_tokenizer(name)
    except MarianError as error:
        raise CheckpointError(f"{path}: {error}") from None
    except (OSError, ValueError) as error:
        if is_hub:
            raise CheckpointError(
                f"cannot load {name} from the Hugging Face Hub: not in the local cache and the hub cannot be "
                "reached; download it where there is network and pass its folder (--checkpoint PATH)"
            ) from None
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise CheckpointError(f"{path} is not a Marian model folder: {first}") from None
    return loaded


def load_released(
    path: str | Path, device="cpu", from_hub: bool = False
) -> tuple[Transformer, MarianText, Config]:
    """(our model in eval mode, its tokenizer, a Config with this model and default eval settings) of a
    folder, or of the hub's model ``path``."""
    hf_model, hf_tokenizer = load_pretrained(path, from_hub)
    try:
        model = from_marian(hf_model.float())
    except MarianError as error:
        raise CheckpointError(f"{path}: {error}") from None
    start = hf_model.config.decoder_start_token_id
    tokenizer = MarianText(hf_tokenizer, start if start is not None else hf_tokenizer.pad_token_id)
    positions = model.config.max_positions  # the default eval / data settings, within the position table
    data = DataConfig(max_len=min(128, positions))
    config = Config(model=model.config, variant=variant_of(model), data=data, eval=EvalConfig())
    return model.to(device).eval(), tokenizer, config
