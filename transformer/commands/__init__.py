"""The project's commands, one module each: ``train``, ``translate`` and ``serve``.

Installed (``pip install .``), they are ``transformer-mt train | translate | serve``, or ``python -m
transformer ...``; in a checkout, the scripts train.py, translate.py and serve.py run the same code. Each
module's ``main(argv)`` returns the exit status: 0 done, 1 an error, 2 a usage error (one line on stderr).
"""

import importlib
import sys

COMMANDS = {
    "train": "train a model on a config's corpora and report its test BLEU",
    "translate": "translate text with a trained checkpoint, or a released Marian model",
    "serve": "serve a model over HTTP (needs the serve extra)",
}
USAGE = "usage: transformer-mt {train,translate,serve} ... [--help]"


def run(command: str, argv: list[str] | None = None) -> int:
    """Run one command with its arguments (``None``: the process's own); its exit status. Output piped into a
    reader that stops early (``| head``) ends the command quietly."""
    module = importlib.import_module(f"transformer.commands.{command}")
    try:
        return module.main(argv)
    except BrokenPipeError:
        sys.stderr.close()  # nothing more can be said, and Python's own complaint at exit stays unsaid
        return 1


def describe() -> str:
    """``transformer-mt --help``: the commands, one line each."""
    lines = [USAGE, "", "commands (each has its own --help):"]
    lines += [f"  {name:<10} {what}" for name, what in COMMANDS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """``transformer-mt COMMAND ...``: the command named first, with the rest of the arguments."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] in (["-h"], ["--help"]):
        print(describe())
        return 0
    if argv[:1] == ["--version"]:
        from importlib.metadata import PackageNotFoundError, version

        try:
            print(f"transformer-mt {version('transformer-mt')}")
        except PackageNotFoundError:
            print("transformer-mt (not installed: run from a checkout)")
        return 0
    if not argv or argv[0] not in COMMANDS:
        said = f"no command {argv[0]!r}" if argv else "a command is needed"
        print(f"error: {said}: train, translate or serve (see transformer-mt --help)", file=sys.stderr)
        return 2
    return run(argv[0], argv[1:])
