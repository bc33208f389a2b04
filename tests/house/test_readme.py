"""The README and docs speak to users, and their figures cannot drift from their sources.

The README's results table is generated from docs/figures.json and the configs (bench/readme_figures.py);
a config's header names the budget its train.max_minutes sets.
"""

import json
import re

import pytest
import readme_figures
import yaml
from helpers import CONFIGS, ROOT

from transformer.runtime.configs import config_from_dict, load_config

USER_DOCS = [ROOT / "README.md", ROOT / "data" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_the_readme_results_table_is_the_generated_one():
    figures = json.loads(readme_figures.FIGURES.read_text(encoding="utf-8"))
    readme = readme_figures.README.read_text(encoding="utf-8")
    assert readme_figures.readme_table(readme) == readme_figures.results_table(figures), (
        "README.md's results table differs from docs/figures.json: run python bench/readme_figures.py --table"
    )


def test_the_results_table_is_short_current_and_links_each_figure_to_its_section():
    table = readme_figures.results_table(json.loads(readme_figures.FIGURES.read_text(encoding="utf-8")))
    rows = table.splitlines()[2:]
    assert 1 <= len(rows) <= 6
    history = r"\b20\d\d-[01]\d-[0-3]\d\b|\b(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}\b"
    assert re.findall(history, table) == [], "no dates or commit ids in the README's table"
    page = (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    sections = {readme_figures.anchor(h) for h in re.findall(r"^#{1,6} (.+)$", page, re.M)}
    for row in rows:
        anchors = re.findall(r"\]\(docs/benchmarks\.md#([^)]+)\)", row)
        assert anchors, f"a row without a link to docs/benchmarks.md: {row}"
        assert set(anchors) <= sections, f"no such heading in docs/benchmarks.md: {anchors}"


def test_anchors_are_githubs():
    heading = "Main job: Multi30k de→en in a 27-minute budget (CPU)"
    assert readme_figures.anchor(heading) == "main-job-multi30k-deen-in-a-27-minute-budget-cpu"
    assert readme_figures.anchor("Training throughput against nn.Transformer") == (
        "training-throughput-against-nntransformer"
    )


def test_the_readmes_own_data_example_trains_the_model_its_comment_names():
    """No model section: the defaults, which are the paper's base model with the sizes the comment gives;
    the model it suggests for a CPU is the main config's, with the sizes it gives."""
    section = (ROOT / "README.md").read_text(encoding="utf-8").split("## Your own data", 1)[1]
    block = re.search(r"```yaml\n(.*?)```", section, re.S).group(1)
    sizes = r"\((\d+) \+ (\d+) layers, d_model (\d+)\)"
    default = config_from_dict(yaml.safe_load(block)).model
    main = load_config(CONFIGS / "multi30k_de_en.yaml").model
    for model, said in ((default, r"base model "), (main, r"multi30k_de_en\.yaml ")):
        stated = re.search(said + sizes, block)
        assert stated, f"the example's comment no longer gives the sizes after {said!r}"
        layers_and_width = (model.n_encoder_layers, model.n_decoder_layers, model.d_model)
        assert layers_and_width == tuple(map(int, stated.groups()))


@pytest.mark.parametrize("path", sorted(CONFIGS.glob("*.yaml")), ids=lambda p: p.name)
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
