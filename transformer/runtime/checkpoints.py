"""A checkpoint of ours as a model to translate with: its config, weights and tokenizer, checked against
each other."""

from pathlib import Path

from transformer.core.checkpoint import CheckpointError, load_checkpoint, tokenizer_from_tensor
from transformer.core.config import ConfigError
from transformer.core.model import build_model
from transformer.core.tokenizer import Tokenizer
from transformer.runtime.configs import config_from_dict


def load_for_inference(path: str | Path, device="cpu", read_tokenizer=Tokenizer.from_bytes):
    """A checkpoint of ours -> (model in eval mode on ``device``, tokenizer, config). ``read_tokenizer``:
    ``interop.formats.read_tokenizer`` also reads a released Marian model's (a fine-tuned model's)."""
    state = load_checkpoint(path)
    tokenizer = tokenizer_from_tensor(state["tokenizer"], f"checkpoint {path}", read_tokenizer)
    try:
        config = config_from_dict(state["config"])
        model = build_model(config.model, tokenizer)
        model.load_state_dict(state["model"])
    except (ConfigError, RuntimeError, KeyError, ValueError, TypeError) as error:
        first = str(error).strip().splitlines()[0]
        raise CheckpointError(f"checkpoint {path} does not match its config: {first}") from None
    return model.to(device).eval(), tokenizer, config
