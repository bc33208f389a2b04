"""Each classic attention mistake, patched into a copy of the package, makes the attention tests fail.

lesson/mistake_mutations.py does the patching (one line of transformer/ per mistake, in a temporary copy of
the
checkout); a suite that still passed with a mistake in would be a defect of the suite.
"""

import sys

import pytest
from conftest import ROOT

sys.path.insert(0, str(ROOT / "lesson"))
import mistake_mutations  # noqa: E402


@pytest.mark.parametrize("name", list(mistake_mutations.MUTATIONS))
def test_every_patch_applies_to_exactly_one_place(name):
    path, old, _ = mistake_mutations.MUTATIONS[name]
    assert (ROOT / path).read_text(encoding="utf-8").count(old) == 1, f"{name}: the patched line moved"


def test_every_mistake_patched_in_fails_the_attention_tests(capsys):
    code = mistake_mutations.main(["--tests", "tests/test_attention.py", "tests/test_stacks.py"])
    out = capsys.readouterr().out
    assert code == 0, out
    for name in mistake_mutations.MUTATIONS:
        line = next(line for line in out.splitlines() if line.startswith(name + " "))
        assert int(line.split()[1]) > 0, line
