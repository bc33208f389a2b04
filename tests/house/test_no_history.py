"""The code and its ``--help`` say what the code does and why, never when, where or how fast it was
measured: no dates, commit ids, CPU model names or speed figures. Those live in docs/benchmarks.md, with the
machine, date and command of each current figure; the code links to its section."""

import re

import pytest
from helpers import ROOT, run_command

from transformer.commands import serve, train, translate
from transformer.training import averaging, multi30k

SCRIPTS = [ROOT / "train.py", ROOT / "translate.py", ROOT / "serve.py"]
SOURCES = sorted((ROOT / "transformer").rglob("*.py")) + SCRIPTS
HISTORY = {
    "a date": r"\b20\d\d-[01]\d-[0-3]\d\b",
    "a commit id": r"\b(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}\b",
    "a CPU model": r"\b(EPYC|Xeon|Ryzen|Threadripper|Graviton|Sapphire Rapids|Ice Lake|Cascade Lake|"
    r"Zen ?[1-5]|Core i[3579]|Apple M[1-4])\b",
    "a speed figure": r"\b\d+(\.\d+)?(-\d+(\.\d+)?)?x (faster|slower|the speed)|"
    r"\b\d+(\.\d+)? ?(ns|us|µs|ms) (an?|per)\b|steps a second",
}
COMMANDS = {  # each one's main, run in this process with --help
    "train.py --help": train.main,
    "translate.py --help": translate.main,
    "averaging --help": averaging.main,
    "multi30k --help": multi30k.main,
    "serve.py --help": serve.main,
}


# what a user reads first says no more of the machines than "a 2-core CPU": not even their instruction sets
FOR_USERS = {**HISTORY, "a CPU's instruction set": r"\b(AMX|AVX-?512[-\w]*|VNNI)\b"}


def hits(text: str, patterns: dict[str, str] = HISTORY) -> list[str]:
    found = []
    for n, line in enumerate(text.splitlines(), 1):
        found += [
            f"line {n}, {what}: {line.strip()}"
            for what, pattern in patterns.items()
            if re.search(pattern, line)
        ]
    return found


def test_the_patterns_find_history():
    assert len(hits("measured 2026-12-03 at a1b2c3d on an AMD EPYC: 1.15x faster, 338 us a call")) == 4
    assert hits("PAD_ID = 0; sha256 over 8000 tokens; 0x1F; beam 4; 64 rows; d_model^-0.5") == []


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_history_in_the_code(path):
    assert hits(path.read_text("utf-8")) == []


@pytest.mark.parametrize("name", COMMANDS)
def test_no_history_in_help(name):
    done = run_command(COMMANDS[name], ["--help"])
    assert done.stdout.startswith("usage:"), done.stdout[:200]
    assert done.returncode == 0, done.stderr
    assert hits(done.stdout, FOR_USERS) == []


def test_no_history_in_the_readme():
    assert hits((ROOT / "README.md").read_text("utf-8"), FOR_USERS) == []


def test_the_users_patterns_also_find_instruction_sets():
    assert len(hits("bf16 on a CPU with AVX512-BF16 or AMX; VNNI", FOR_USERS)) == 1  # one line
    assert hits("bf16 on a CPU with bf16 instructions", FOR_USERS) == []
