"""The README's quickstart, run as written (from a fresh folder): the tiny config trains, a sentence is
translated, and TensorBoard has the cross-attention images the README points to. And its YAML example is
a config train.py accepts."""

import re
import shlex
import subprocess
import sys

import yaml
from helpers import ROOT, needs_data
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from transformer.runtime.configs import config_from_dict

README = (ROOT / "README.md").read_text(encoding="utf-8")
SETUP = "make setup && make data"  # what `make test` has done before any test runs


def quickstart_commands() -> list[str]:
    section = README.split("## Quickstart", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```bash\n(.*?)```", section, re.S).group(1)
    return [line.split("  #")[0].strip() for line in block.splitlines() if line.strip()]


@needs_data
def test_the_readmes_quickstart_runs_as_written(tmp_path):
    commands = quickstart_commands()
    assert commands[0] == SETUP and len(commands) == 4
    outputs = []
    for command in commands[1:3]:
        argv = shlex.split(command)
        assert argv[0] == ".venv/bin/python" and argv[1] in ("train.py", "translate.py"), command
        argv = [sys.executable, str(ROOT / argv[1]), *argv[2:]]
        done = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, f"{command}\n{done.stderr[-2000:]}"
        outputs.append(done.stdout)
    assert "test BLEU" in outputs[0] and len(outputs[1].splitlines()) == 1  # one sentence, one line
    assert shlex.split(commands[3]) == [".venv/bin/tensorboard", "--logdir", "runs/tiny"]
    events = EventAccumulator(str(tmp_path / "runs" / "tiny"), size_guidance={"images": 0}).Reload()
    cross = [tag for tag in events.Tags()["images"] if "/cross/" in tag]
    assert cross and "train/loss" in events.Tags()["scalars"], events.Tags()


def test_the_readmes_own_data_example_is_a_valid_config():
    section = README.split("## Your own data", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```yaml\n(.*?)```", section, re.S).group(1)
    config = config_from_dict(yaml.safe_load(block))
    assert (config.data.dataset, config.data.src_lang, config.data.tgt_lang) == ("text", "en", "fr")
    uncommented = config_from_dict(yaml.safe_load(re.sub(r"^  # (\w+_size)", r"  \1", block, flags=re.M)))
    assert (uncommented.data.valid_size, uncommented.data.test_size) == (1000, 1000)
