"""Train a Transformer translation model and report BLEU: the checkout's script for ``transformer-mt train``.

    python train.py --config multi30k_de_en [--run-dir DIR] [--set train.max_steps=200 ...]
                    [--resume | --overwrite] [--data-dir DIR]
    torchrun --nproc_per_node=N train.py ...        # data-parallel on N GPUs (NCCL) or CPU processes (gloo)

The training story, top to bottom, is transformer/commands/train.py.
"""

import sys

from transformer.commands import run

if __name__ == "__main__":
    sys.exit(run("train"))
