"""``python -m transformer train | translate | serve``: the same as the installed ``transformer-mt``."""

import sys

from transformer.commands import main

sys.exit(main())
