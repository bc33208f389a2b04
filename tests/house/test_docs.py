"""The user guide stays short and current: the README in five minutes, benchmarks.md a reference, and the
docs' reference tables (every config key, every translate.py flag) generated from the code."""

import json
import re

import generate
import pytest
from helpers import CONFIGS, ROOT

from transformer.inference.cli_options import build_parser
from transformer.runtime.configs import Config


def test_the_readme_and_the_benchmarks_page_stay_short():
    assert len((ROOT / "README.md").read_text("utf-8").splitlines()) <= 200
    assert len((ROOT / "docs" / "benchmarks.md").read_text("utf-8").splitlines()) <= 400


def test_the_generated_reference_tables_are_current():
    assert generate.main(["--check"]) == 0, "run: python docs/generate.py"


def test_every_config_key_and_every_flag_is_documented():
    training = (ROOT / "docs" / "training.md").read_text("utf-8")
    for section, values in Config().to_dict().items():
        for key in values:
            assert f"| `{section}.{key}` |" in training, f"{section}.{key}"
    translate = (ROOT / "docs" / "translate.md").read_text("utf-8")
    flags = [flag for action in build_parser()._actions for flag in action.option_strings if flag != "-h"]
    missing = [flag for flag in flags if f"`{flag}`" not in translate and flag != "--help"]
    assert not missing and "--prefix-text" in flags
    from transformer.commands import serve

    serving = (ROOT / "docs" / "serving.md").read_text("utf-8")
    flags = [flag for action in serve.build_parser()._actions for flag in action.option_strings]
    missing = [flag for flag in flags if f"`{flag}`" not in serving and flag not in ("-h", "--help")]
    assert not missing and "--max-queue" in flags


SOURCE = """
class Demo:
    first: int = 1  # its own comment
    second: int = 2  # a comment that goes on
    # on the next line
    # -- a group heading, nobody's comment
    third: int = 3  # third's
    # a block above a field without a comment of its own
    fourth: dict = None
    fifth: int = 5
"""


def test_comments_are_read_as_the_config_file_writes_them():
    found = generate.field_comments(SOURCE, "Demo")
    assert found == {
        "first": "its own comment",
        "second": "a comment that goes on on the next line",
        "third": "third's",
        "fourth": "a block above a field without a comment of its own",
        "fifth": "",
    }


def test_a_key_without_a_comment_stops_the_generator(monkeypatch):
    real = generate.field_comments
    monkeypatch.setattr(generate, "field_comments", lambda *a: {**real(*a), "beam_size": ""})
    with pytest.raises(generate.UndocumentedKey, match="eval.beam_size has no comment"):
        generate.config_tables()


NUMBERS = {"seven": 7, "eight": 8, "nine": 9, "ten": 10, "eleven": 11}


def test_the_attention_page_counts_its_mistakes_as_its_tables_do():
    text = (ROOT / "docs" / "attention.md").read_text("utf-8")
    said = re.search(r"### (\w+) classic mistakes", text).group(1).lower()
    lesson = text.split("<!-- lesson:eight_mistakes -->")[1].split("<!-- /lesson -->")[0]
    sizes = re.compile(r"\d\.\de[+-]\d\d")  # a size of error, 1.8e-01
    measured = [line for line in lesson.splitlines() if len(sizes.findall(line)) == 3 and line[:4] != "none"]
    table = text.split("<!-- mutations -->")[1].split("<!-- /mutations -->")[0]
    patches = [line for line in table.splitlines() if re.match(r"[a-z_]+\s+tests/", line)]
    assert NUMBERS[said] == len(measured)
    patched = next(word for word, n in NUMBERS.items() if n == len(patches))
    assert f"{patched} patches for {said} mistakes" in " ".join(text.split())


def test_the_main_configs_step_counts_are_the_measured_runs():
    """The step counts in multi30k_de_en.yaml's comments: the range of the runs docs/figures.json
    holds, to the hundred below."""
    runs = json.loads((ROOT / "docs" / "figures.json").read_text("utf-8"))["main_job"]["runs"]
    steps = [run["steps"] for run in runs]
    expected = f"{min(steps) // 100 * 100:,}-{max(steps) // 100 * 100:,}"
    found = re.findall(r"\d,\d{3}-\d,\d{3}", (CONFIGS / "multi30k_de_en.yaml").read_text("utf-8"))
    assert found and set(found) == {expected}
