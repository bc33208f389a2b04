"""Serve a trained model over HTTP: the checkout's script for ``transformer-mt serve``.

    python serve.py --checkpoint runs/multi30k_de_en        # http://127.0.0.1:8000

``--help`` gives every flag; the code is transformer/commands/serve.py.
"""

import sys

from transformer.commands import run

if __name__ == "__main__":
    sys.exit(run("serve"))
