"""Translate text with a trained checkpoint: the checkout's script for ``transformer-mt translate``.

    python translate.py --checkpoint runs/multi30k_de_en "Ein Hund rennt im Schnee."

``--help`` gives examples and every flag; the code is transformer/commands/translate.py.
"""

import sys

from transformer.commands import run

if __name__ == "__main__":
    sys.exit(run("translate"))
