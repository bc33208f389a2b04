"""The attention lesson, every number computed by the project's own attention, masks and multi-head attention.

    python lesson/attention_lesson.py                          # print every section (a few seconds on a CPU)
    python lesson/attention_lesson.py --write-doc docs/attention.md   # refresh the doc's printed blocks
    python lesson/attention_lesson.py --check-doc docs/attention.md   # exit 1 if the doc has drifted

Part A follows §3.2 of the paper step by step (Eq. 1, the √d_k footnote, multi-head attention, the decoder
mask, the classic mistakes); part B the properties behind it (the variance theorem, the softmax Jacobian,
masks, counting, equivariance, a worked example). Where a figure depends on a random draw that the source
text does not pin, ours is printed with the text's figure beside it. docs/attention.md explains each section;
its blocks of output are this script's, so that they cannot drift
(tests/lesson/test_lesson_numbers.py checks).
"""

import argparse
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sections import equation, heads, masking, pitfalls, properties, scaling  # noqa: E402
from sections.section import Section  # noqa: E402

PART_A = [
    equation.three_tokens, equation.numpy_reference, equation.library_check, scaling.variance_table,
    scaling.ten_keys, heads.parameters, heads.line_by_line, heads.against_library, masking.minus_infinity,
    masking.causal_table, masking.mask_mistakes, pitfalls.eight_mistakes,
]  # fmt: skip
PART_B = [
    equation.quick_checks, heads.cost, scaling.variance_seeded, scaling.saturation, scaling.saturation_bound,
    scaling.many_keys, scaling.backward, masking.fully_masked_row, masking.conventions, masking.batch_masks,
    heads.cross_shapes, heads.permutation, masking.positions, equation.worked_example, properties.low_rank,
    properties.correlated_scale, properties.rows_not_columns, properties.memory_cost,
    properties.encoder_permutation, properties.jacobian_sign, properties.recall_card,
]  # fmt: skip
PARTS = {"A. §3.2 of the paper, step by step": PART_A, "B. the properties behind it": PART_B}
BLOCK = re.compile(r"(<!-- lesson:(\w+) -->\n```text\n)(.*?)(```\n<!-- /lesson -->)", re.S)
# A link to a line of code names the code it points at: [`snippet`](../transformer/file.py#L12).
LINK = re.compile(r"\[`([^`]+)`\]\((\.\./[\w/]+\.py)#L(\d+)\)")
DOCS = Path(__file__).resolve().parent.parent / "docs"
# Float32 rounding differences (below 1e-5, or none at all) depend on the CPU's kernels: one CPU's 0.0e+00
# is another's 4.5e-08. The doc check ignores their digits.
ROUNDING = re.compile(r"\b(?:\d\.\de-(?:0[5-9]|[1-9]\d)|0\.0e\+00)(?!\d)")


def run_sections() -> list[tuple[str, int, Section]]:
    """[(part, number, section)] in the lesson's order."""
    numbered, number = [], 0
    for part, builders in PARTS.items():
        for build in builders:
            number += 1
            numbered.append((part, number, build()))
    return numbered


def section_text(number: int, section: Section) -> str:
    return f"== {number}. {section.title}\n{section.text()}\n"


def fill_doc(doc: str, sections: dict[str, str]) -> str:
    """The doc with each ``<!-- lesson:KEY -->`` block replaced by that section's output."""
    missing = sorted({m.group(2) for m in BLOCK.finditer(doc)} - sections.keys())
    if missing:
        raise SystemExit(f"error: the doc names sections this script does not print: {', '.join(missing)}")
    return BLOCK.sub(lambda m: m.group(1) + sections[m.group(2)] + m.group(4), doc)


def fix_links(doc: str) -> str:
    """Each code link's line number set to the first line of its file that holds the link's snippet."""

    def line_of(match: re.Match) -> str:
        snippet, relative = match.group(1), match.group(2)
        lines = (DOCS / relative).resolve().read_text(encoding="utf-8").splitlines()
        found = [i for i, line in enumerate(lines, start=1) if snippet in line]
        if not found:
            raise SystemExit(f"error: no line of {relative} holds `{snippet}` (a link of the doc)")
        return f"[`{snippet}`]({relative}#L{found[0]})"

    return LINK.sub(line_of, doc)


def without_rounding(text: str) -> str:
    return ROUNDING.sub("<rounding>", text)


def check_doc(path: Path, texts: dict[str, str]) -> int:
    """1 (and a line saying so) when the doc's blocks or code links are not what ``texts`` (each section's
    printed text, by key) and the code make of them, else 0."""
    doc = path.read_text(encoding="utf-8")
    drifted = without_rounding(fix_links(fill_doc(doc, texts))) != without_rounding(doc)
    print(f"{path}: {'has drifted: run --write-doc' if drifted else 'up to date'}")
    return int(drifted)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write-doc", type=Path, help="refresh the printed blocks of this Markdown file")
    parser.add_argument("--check-doc", type=Path, help="exit 1 if this Markdown file's blocks have drifted")
    args = parser.parse_args(argv)
    numbered = run_sections()
    texts = {section.key: section_text(number, section) for _, number, section in numbered}
    if args.write_doc:
        args.write_doc.write_text(
            fix_links(fill_doc(args.write_doc.read_text(encoding="utf-8"), texts)), "utf-8"
        )
        return 0
    if args.check_doc:
        return check_doc(args.check_doc, texts)
    part = None
    for section_part, _, section in numbered:
        if section_part != part:
            part = section_part
            print(f"\n#### {part}\n")
        print(texts[section.key])
    return 0


if __name__ == "__main__":
    sys.exit(main())
