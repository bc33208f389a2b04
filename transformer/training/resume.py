"""Training checkpoints: everything ``--resume`` needs besides the model (the optimizer, loss scale, moving
average, where training stands and every rank's random state), and the checks a resume passes first.
"""

from pathlib import Path

import torch

from transformer.core.checkpoint import CheckpointError, tokenizer_to_tensor
from transformer.core.tokenizer import Tokenizer
from transformer.runtime.configs import Config, with_variant_section
from transformer.training.ranks import unwrap


def load_optimizer_state(optimizer: torch.optim.Optimizer, state: dict) -> None:
    """``optimizer.load_state_dict(state)``, keeping this optimizer's kernel: a checkpoint saved with another
    one (an older version's non-fused Adam) would otherwise bring its own, and under fp16's grad scaler the
    step would then refuse the scaler's arguments."""
    own = optimizer.param_groups[0]
    kernel = {"fused": own.get("fused"), "foreach": own.get("foreach")}
    optimizer.load_state_dict({**state, "param_groups": [{**g, **kernel} for g in state["param_groups"]]})


def rng_state(device: torch.device) -> dict[str, torch.Tensor]:
    """This process's random generators: the CPU one, and its GPU's when it runs on one."""
    state = {"torch": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(state: dict[str, torch.Tensor]) -> None:
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"] if state["cuda"].dim() == 1 else state["cuda"][0])


def training_checkpoint(
    model, optimizer, scaler, ema, config, tokenizer: Tokenizer, state: dict, rng_states: list[dict]
) -> dict:
    """``model`` holds the weights to translate with (the moving average when there is one); the training
    weights, optimizer, loss scale, moving average and every rank's RNG states (``rng_states[rank]``,
    each rank draws its own dropout masks) are there to resume exactly."""
    model = unwrap(model)
    checkpoint = {
        "config": config.to_dict(),
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "scaler": scaler.state_dict(),  # fp16 loss scale; empty when the scaler is off
        "tokenizer": tokenizer_to_tensor(tokenizer),
        "state": state,
        "rng": {"ranks": rng_states},
    }
    if ema is not None:
        checkpoint["train_model"] = checkpoint["model"]
        with ema.applied(model):
            checkpoint["model"] = {k: v.clone() for k, v in model.state_dict().items()}
        checkpoint["ema"] = ema.state_dict()
    return checkpoint


RESUME_IGNORES = ("data_dir", "cache_dir", "workers")  # where the data and cache are, how many processes
# what check_resumable compares with the checkpoint (besides the precision and the number of processes)
RESUME_CHECKS = "model.*, variant.*, train.seed and data.* but " + ", ".join(
    f"data.{key}" for key in RESUME_IGNORES
)


def located(value):
    """A data value as resuming compares it: ``data.corpora``'s entries without where their data are."""
    if isinstance(value, list):
        return [{k: v for k, v in entry.items() if k not in RESUME_IGNORES} for entry in value]
    return value


def changed_settings(ckpt: dict, config: Config) -> list[str]:
    """The keys a resume changes of those it does not check (``RESUME_CHECKS``), as "key (old -> new)": the
    ``train`` and ``eval`` keys but train.seed (a new budget, another validation schedule) and where the
    data and cache are, as they decide neither the weights' shapes nor the batches."""
    saved, now, default = ckpt["config"], config.to_dict(), Config().to_dict()
    keys = [(section, key) for section in ("train", "eval") for key in now[section]]
    keys = [(section, key) for section, key in keys if (section, key) != ("train", "seed")]
    keys += [("data", key) for key in RESUME_IGNORES]
    changes = []
    for section, key in keys:
        old = saved.get(section, {}).get(key, default[section][key])  # a missing key: its default
        if old != now[section][key]:
            changes.append(f"{section}.{key} ({old!r} -> {now[section][key]!r})")
    return changes


def check_resumable(ckpt: dict, path: Path, config: Config, world_size: int, precision: str) -> None:
    """Refuse to resume from ``ckpt`` (read from ``path``), before anything is written, when it was trained
    with other model or data settings or another seed (they decide the weights' shapes and the order of the
    batches), by another number of processes, or in another precision (a checkpoint that does not say
    trained in fp32); or when it lacks the moving average ``train.ema_decay`` asks for."""
    saved, now, default = with_variant_section(ckpt["config"]), config.to_dict(), Config().to_dict()
    changed = [
        f"{section}.{k}" for section in ("model", "variant") for k in now[section]
        if saved.get(section, {}).get(k, default[section][k]) != now[section][k]  # a missing key: its default
    ]  # fmt: skip
    changed += [
        f"data.{k}" for k in now["data"]
        if k not in RESUME_IGNORES
        and located(saved["data"].get(k, default["data"][k])) != located(now["data"][k])
    ]  # fmt: skip
    changed += ["train.seed"] if saved["train"].get("seed") != now["train"]["seed"] else []
    if changed:
        raise CheckpointError(f"{path} was trained with other values of {', '.join(changed)}; cannot resume")
    state = ckpt["state"]
    if state.get("world_size", 1) != world_size:
        raise CheckpointError(
            f"{path} was trained by {state.get('world_size', 1)} processes; resume with as many"
        )
    trained_in = state.get("precision") or "fp32"  # a checkpoint that does not say trained in fp32
    if trained_in != precision:
        raise CheckpointError(
            f"{path} was trained in {trained_in}; train.precision={config.train.precision} is {precision} "
            f"here: resume with --set train.precision={trained_in}"
        )
    if config.train.ema_decay > 0 and "ema" not in ckpt:
        raise CheckpointError(f"{path} has no moving average; cannot resume with train.ema_decay > 0")


def restore_training(ckpt: dict, path: Path, model, optimizer, scaler, ema, rank: int = 0) -> dict:
    """Load what ``training_checkpoint`` saved (``ckpt``, read from ``path`` and passed by
    ``check_resumable``) back into these objects and this rank's RNG state; returns the saved ``state``."""
    unwrap(model).load_state_dict(ckpt.get("train_model", ckpt["model"]))
    load_optimizer_state(optimizer, ckpt["optimizer"])
    if ckpt.get("scaler"):
        scaler.load_state_dict(ckpt["scaler"])
    if ema is not None:
        ema.load_state_dict(ckpt["ema"])
    ranks = ckpt["rng"].get("ranks", [ckpt["rng"]])  # older checkpoints: one state for every rank
    if rank >= len(ranks):
        raise CheckpointError(f"{path} was saved by {len(ranks)} processes; cannot resume with more")
    set_rng_state(ranks[rank])
    return ckpt["state"]
