"""The scripts' argument parser: a usage error is one line on stderr and exit status 2, whichever check
finds it (argparse's own, or a conflict between flags found later)."""

import argparse
import sys
from pathlib import Path

USAGE_ERROR = 2  # the exit status of every usage error (argparse's)


class UsageError(ValueError):
    """Flags that cannot be used together, or a value out of range; the message names the flags."""


class UsageParser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` whose errors print one line, ``error: MESSAGE (see --help)``."""

    def error(self, message: str):
        print(f"error: {message} (see {self.prog} --help)", file=sys.stderr)
        sys.exit(USAGE_ERROR)


def command_name(command: str) -> str:
    """What the user typed to run ``command``: ``transformer-mt translate`` (the installed command, or
    ``python -m transformer translate``), else the checkout's script, ``translate.py``."""
    called_as = Path(sys.argv[0])
    package_main = called_as.name == "__main__.py" and called_as.parent.name == "transformer"
    installed = called_as.name == "transformer-mt" or package_main
    return f"transformer-mt {command}" if installed else f"{command}.py"
