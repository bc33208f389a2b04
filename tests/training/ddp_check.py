"""Run under torchrun by tests/training/test_training_paths.py (2 CPU processes, gloo); writes
OUT/ddp_report.json.

Each rank takes its half of the same global batches (the halves hold different numbers of target tokens)
as two micro-batches (of different numbers of target tokens too) through ``train.accumulate_gradients`` on
a DistributedDataParallel model, while every rank also trains a single-process copy on each whole global
batch at once: the DDP run must equal it. DDP must average the gradients over the ranks once, after the
last micro-batch (``no_sync`` around the first): averaging after the first instead leaves the second's
gradients local, and the ranks drift apart and away from the single process.
"""

import copy
import json
import sys
from pathlib import Path
from types import SimpleNamespace

import torch

from transformer.commands import train
from transformer.core.batches import collate, make_batches
from transformer.core.config import ModelConfig, TrainConfig
from transformer.core.model import Transformer
from transformer.training.ranks import Runtime, setup_runtime, shard


def as_run(runtime: Runtime, model: torch.nn.Module) -> SimpleNamespace:
    """What ``train.accumulate_gradients`` reads of a Run."""
    return SimpleNamespace(
        runtime=runtime,
        config=SimpleNamespace(train=TrainConfig(label_smoothing=0.1)),
        never_produced=[0, 2],
        model=model,
        tokenizer=SimpleNamespace(pad_id=0),
        scaler=torch.amp.GradScaler("cpu", enabled=False),
        state=SimpleNamespace(train_tokens=0),
    )


def train_both(rt: Runtime) -> tuple[Transformer, Transformer, float, int]:
    """3 steps of the DDP model on this rank's halves, each as 2 micro-batches, and of a one-process copy
    on the whole batches. Also returns how many times the DDP model's ``no_sync`` was entered."""
    torch.manual_seed(0)
    config = ModelConfig(d_model=32, n_heads=4, d_ff=64, n_encoder_layers=1, n_decoder_layers=1, dropout=0.0)
    model = Transformer(config, 30, 30, pad_id=0, bos_id=2, eos_id=3)
    reference = copy.deepcopy(model)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    no_sync, entered = ddp.no_sync, []
    ddp.no_sync = lambda: entered.append(1) or no_sync()  # counted: accumulation without a sync happened
    optimizer, ref_optimizer = (torch.optim.SGD(m.parameters(), lr=0.5) for m in (ddp, reference))
    generator, worst = torch.Generator().manual_seed(1), 0.0
    for _ in range(3):
        lengths = [2, 3, 6, 7, 14, 15, 20, 21]  # rank 0 the short half, rank 1 the long; short micro first
        pairs = [(torch.randint(4, 30, (n,), generator=generator).tolist(),) * 2 for n in lengths]
        mine = pairs[4 * rt.rank : 4 * rt.rank + 4]
        micro = [collate(mine[:2], range(2), 0, 2, 3), collate(mine[2:], range(2, 4), 0, 2, 3)]
        loss = train.accumulate_gradients(as_run(rt, ddp), ddp, micro)
        optimizer.step()
        optimizer.zero_grad()
        one = Runtime(torch.device("cpu"), None)
        ref_loss = train.accumulate_gradients(
            as_run(one, reference), reference, [collate(pairs, range(8), 0, 2, 3)]
        )
        ref_optimizer.step()
        ref_optimizer.zero_grad()
        total = rt.sum_over_ranks(loss)
        worst = max(worst, abs(total.item() - ref_loss.item()) / abs(ref_loss.item()))
    return model, reference, worst, len(entered)


def shards_disjoint(rt: Runtime) -> bool:
    """Every rank's batches of an epoch: together all pairs, overlapping only in the padding batch."""
    generator = torch.Generator().manual_seed(2)
    src, tgt = (
        torch.randint(1, 30, (300,), generator=generator).tolist(),
        torch.randint(1, 30, (300,), generator=generator).tolist(),
    )
    mine = shard(make_batches(src, tgt, 400, True, seed=3, epoch=1), rt.rank, rt.world_size)
    everyone = [
        set(i for batch in batches for i in batch)
        for batch_list in [rt.gather(mine)]
        for batches in batch_list
    ]
    unsharded = make_batches(src, tgt, 400, True, seed=3, epoch=1)
    return set.union(*everyone) == set(range(300)) and set.intersection(*everyone) <= set(unsharded[0])


def main() -> None:
    out = Path(sys.argv[1])
    rt = setup_runtime("cpu", "fp32")
    model, reference, loss_diff, no_sync_entered = train_both(rt)
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    gathered = rt.gather(flat)
    report = {
        "params_identical_across_ranks": all(torch.equal(gathered[0], g) for g in gathered),
        "param_max_diff_vs_one_process": max(
            (a - b).abs().max().item()
            for a, b in zip(model.parameters(), reference.parameters(), strict=True)
        ),
        "loss_rel_diff_vs_one_process": loss_diff,
        "no_sync_entered": no_sync_entered,  # per update, once: around the first of its 2 micro-batches
        "shards_disjoint": shards_disjoint(rt),
    }
    if rt.is_main:
        (out / "ddp_report.json").write_text(json.dumps(report, indent=2))
    rt.close()


if __name__ == "__main__":
    main()
