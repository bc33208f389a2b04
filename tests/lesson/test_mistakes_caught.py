"""Each classic attention mistake, patched into a copy of the package, makes the attention tests fail.

lesson/mistake_mutations.py does the patching (one line of transformer/ per mistake, in a temporary copy of
the
checkout); a suite that still passed with a mistake in would be a defect of the suite.
"""

import mistake_mutations
import pytest
from helpers import ROOT


@pytest.mark.parametrize("name", list(mistake_mutations.MUTATIONS))
def test_every_patch_applies_to_exactly_one_place(name):
    path, old, _ = mistake_mutations.MUTATIONS[name]
    assert (ROOT / path).read_text(encoding="utf-8").count(old) == 1, f"{name}: the patched line moved"


def test_every_mistake_patched_in_fails_the_attention_tests_named_in_the_doc(capsys):
    results = mistake_mutations.run_mutations(mistake_mutations.TESTS)
    out = capsys.readouterr().out
    assert all(results[name] for name in mistake_mutations.MUTATIONS), out  # each caught by some test
    doc = (ROOT / "docs" / "attention.md").read_text(encoding="utf-8")
    table = mistake_mutations.DOC_BLOCK.search(doc).group(2)
    assert table == mistake_mutations.doc_block(results, mistake_mutations.TESTS), (
        "docs/attention.md names other catching tests: run python lesson/mistake_mutations.py --write-doc "
        "docs/attention.md"
    )
