"""The README and docs speak to users, and their figures cannot drift from their sources.

The README's results table is generated from docs/figures.json and the configs (bench/readme_figures.py);
a config's header names the budget its train.max_minutes sets.
"""

import json
import re
import sys
from pathlib import Path

import pytest

from transformer.core.config import load_config

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
import readme_figures  # noqa: E402

USER_DOCS = [ROOT / "README.md", ROOT / "data" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_the_readme_results_table_is_the_generated_one():
    figures = json.loads(readme_figures.FIGURES.read_text(encoding="utf-8"))
    readme = readme_figures.README.read_text(encoding="utf-8")
    assert readme_figures.readme_table(readme) == readme_figures.results_table(figures), (
        "README.md's results table differs from docs/figures.json: run python bench/readme_figures.py --table"
    )


@pytest.mark.parametrize("path", sorted((ROOT / "configs").glob("*.yaml")), ids=lambda p: p.name)
def test_a_config_header_names_its_own_budget(path):
    header = "".join(line for line in path.read_text().splitlines(keepends=True) if line.startswith("#"))
    stated = [float(m) for m in re.findall(r"(\d+(?:\.\d+)?)[- ]minute", header)]
    budget = load_config(path).train.max_minutes
    assert all(minutes == budget for minutes in stated), (
        f"{path.name}: header says {stated}, max_minutes {budget}"
    )


@pytest.mark.parametrize("path", USER_DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_user_docs_name_nothing_of_the_machines_they_were_written_on(path):
    text = path.read_text(encoding="utf-8")
    pattern = (
        r"\.\./shared|device tool|\bcarry\b|timeout_s|\$OUT\b|\bsessions?\b|\blent\b|issue \d+|Issue \d+"
    )
    found = [f"line {text.count(chr(10), 0, m.start()) + 1}: {m.group()}" for m in re.finditer(pattern, text)]
    assert not found, f"{path.name}: {found}"
