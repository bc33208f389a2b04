"""A checkpoint of ours as a model to translate with: its config, weights and tokenizer, checked against
each other."""

from pathlib import Path

from transformer.core.checkpoint import CheckpointError, load_checkpoint, tokenizer_from_tensor
from transformer.core.config import ConfigError
from transformer.core.model import build_model
from transformer.core.tokenizer import Tokenizer
from transformer.runtime.configs import Config, config_from_dict


def build_paper_model(config: Config, tokenizer):
    """The core's model of ``config.model``: a run of ours (``interop.formats.build_model`` builds a
    released Marian model's variant too)."""
    return build_model(config.model, tokenizer)


def load_for_inference(
    path: str | Path, device="cpu", read_tokenizer=Tokenizer.from_bytes, build=build_paper_model
):
    """A checkpoint of ours -> (model in eval mode on ``device``, tokenizer, config). ``read_tokenizer`` and
    ``build``: ``interop.formats``' also read a released Marian model's tokenizer and build its variant of
    the model (a fine-tuned model's)."""
    state = load_checkpoint(path)
    tokenizer = tokenizer_from_tensor(state["tokenizer"], f"checkpoint {path}", read_tokenizer)
    try:
        config = config_from_dict(state["config"])
        model = build(config, tokenizer)
        model.load_state_dict(state["model"])
    except (ConfigError, RuntimeError, KeyError, ValueError, TypeError) as error:
        first = str(error).strip().splitlines()[0]
        raise CheckpointError(f"checkpoint {path} does not match its config: {first}") from None
    return model.to(device).eval(), tokenizer, config
