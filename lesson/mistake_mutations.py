"""Patch each classic attention mistake into a copy of the package and list the tests that catch it.

    python lesson/mistake_mutations.py [--tests tests/core/test_attention.py ...] [--only no_scale ...]

A test suite that still passes with a mistake patched in is a defect. For each mistake, this script copies
the checkout (its tracked and new files) into a temporary folder, rewrites one line of ``transformer/`` there,
runs pytest on the attention, stack and lesson tests of that copy, and prints which tests failed. The
unpatched copy is run first: it must pass. Exit status 1 if any mistake is caught by no test.
"""

import argparse
import contextlib
import multiprocessing
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# the tests of the attention code itself
TESTS = ["tests/core/test_attention.py", "tests/core/test_stacks.py"]
CAUSAL_ENCODER = (
    "        src_mask = torch.ones(x.size(1), x.size(1), dtype=torch.bool, device=x.device).tril() & (\n"
    "            True if src_mask is None else src_mask)  # MISTAKE: a causal encoder\n"
)
CAUSAL_CROSS = (
    "        src_mask = torch.ones(x.size(1), memory.size(1), dtype=torch.bool, device=x.device).tril() & (\n"
    "            True if src_mask is None else src_mask)  # MISTAKE: causal cross-attention\n"
)
# name -> (file, the line(s) as they are, the same with the mistake)
MUTATIONS = {
    "no_scale": ("transformer/core/attention.py",
                 "scores = torch.matmul(query, key.transpose(-2, -1)) * scale",
                 "scores = torch.matmul(query, key.transpose(-2, -1))"),
    "sqrt_d_model": ("transformer/core/attention.py",
                     "        out, weights = self.attend(q, k, v, mask)",
                     "        q = q / math.sqrt(H)\n"
                     "        out, weights = self.attend(q, k, v, mask)"),
    "mask_after_softmax": ("transformer/core/attention.py",
                           "    scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)\n"
                           "    weights = torch.softmax(scores, dim=-1)  # (..., Tq, Tk)\n",
                           "    weights = torch.softmax(scores, dim=-1).masked_fill(~mask, 0.0)\n"),
    "mask_with_zero": ("transformer/core/attention.py",
                       "scores.masked_fill(~mask, torch.finfo(scores.dtype).min)",
                       "scores.masked_fill(~mask, 0.0)"),
    "split_no_transpose": ("transformer/core/attention.py",
                           "return x.view(B, T, n_heads, D // n_heads).transpose(1, 2)",
                           "return x.reshape(B, n_heads, T, D // n_heads)"),
    "merge_no_transpose": ("transformer/core/attention.py",
                           "return x.transpose(1, 2).reshape(B, T, H * Dh)",
                           "return x.reshape(B, T, H * Dh)"),
    "flipped_mask": ("transformer/core/attention.py",
                     "scores.masked_fill(~mask, torch.finfo(scores.dtype).min)",
                     "scores.masked_fill(mask, torch.finfo(scores.dtype).min)"),
    "causal_in_encoder": ("transformer/core/layers.py",
                          '        """x (B, S, D), src_mask (B, 1, 1, S) -> (B, S, D), self-attention weights'
                          ' (B, H, S, S)."""\n',
                          '        """x (B, S, D), src_mask (B, 1, 1, S) -> (B, S, D), self-attention weights'
                          ' (B, H, S, S)."""\n' + CAUSAL_ENCODER),
    "causal_in_cross_attention": ("transformer/core/layers.py",
                                  '        cross_cache = cache["cross"] if cache is not None else None\n',
                                  '        cross_cache = cache["cross"] if cache is not None else None\n'
                                  + CAUSAL_CROSS),
}  # fmt: skip


def copy_checkout(destination: Path) -> None:
    """The checkout's tracked and new (not ignored) files, as they are now, into ``destination``."""
    command = ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"]
    listed = subprocess.run(command, cwd=ROOT, capture_output=True, check=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        if (ROOT / name).is_file():
            (destination / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, destination / name)


class _Failures:
    """A pytest plugin that keeps the ids of the tests that failed, and counts the rest."""

    def __init__(self):
        self.failed, self.passed = [], 0

    def pytest_runtest_logreport(self, report):
        if report.failed and report.nodeid not in self.failed:
            self.failed.append(report.nodeid)
        elif report.passed and report.when == "call":
            self.passed += 1


def failing_tests(copy: Path, tests: list[str]) -> tuple[list[str], str]:
    """Run pytest on ``tests`` in the copy (its package first on the path) -> (failed test ids, a summary
    line). Meant for a fresh process that has not imported the package (``run_mutations``' workers)."""
    import pytest
    import torch

    torch.set_num_threads(1)  # the copies share the cores
    sys.path.insert(0, str(copy))
    failures, home = _Failures(), os.getcwd()
    # pytest's plugins from other packages (schemathesis, hypothesis, ...) are not needed by these tests
    os.environ["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    args = ["-q", "-p", "no:cacheprovider", "-k", "not validation_set", *tests]  # the one test that trains
    try:
        os.chdir(copy)
        with open(os.devnull, "w") as quiet, contextlib.redirect_stdout(quiet):
            pytest.main(args, plugins=[failures])
    finally:
        os.chdir(home)
    return failures.failed, f"{len(failures.failed)} failed, {failures.passed} passed"


def mutate(copy: Path, name: str) -> None:
    path, old, new = MUTATIONS[name]
    text = (copy / path).read_text(encoding="utf-8")
    if text.count(old) != 1:
        raise SystemExit(f"error: {name}: {path} holds {text.count(old)} copies of the line to patch")
    (copy / path).write_text(text.replace(old, new), encoding="utf-8")


def run_in_copy(name: str | None, tests: list[str]) -> tuple[list[str], str, float]:
    """Patch the mistake ``name`` (None: none) into a fresh copy of the checkout and run ``tests`` there ->
    (failed test ids, the summary line, seconds)."""
    with tempfile.TemporaryDirectory() as folder:
        copy = Path(folder)
        copy_checkout(copy)
        if name:
            mutate(copy, name)
        start = time.perf_counter()
        failed, summary = failing_tests(copy, tests)
    return failed, summary, time.perf_counter() - start


def run_mutations(tests: list[str], only: list[str] | None = None) -> dict[str, list[str]]:
    """Each mistake's failing tests (test ids), after a run with no mistake that must pass; printed. The
    copies are tested side by side, one per CPU core (at most 4), each in a process forked from a server
    that has imported PyTorch and pytest once (and never the package: each copy imports its own)."""
    names = [None, *(only or MUTATIONS)]
    context = multiprocessing.get_context("forkserver" if sys.platform == "linux" else "spawn")
    context.set_forkserver_preload(["torch", "torch._dynamo", "pytest"])
    workers = min(os.cpu_count() or 1, 4)
    with context.Pool(workers, maxtasksperchild=1) as pool:  # a fresh process for each copy
        runs = pool.starmap(run_in_copy, [(name, tests) for name in names], chunksize=1)
    results = {}
    for name, (failed, summary, seconds) in zip(names, runs):
        label = name or "(no mistake)"
        print(f"{label:<26} {len(failed):3d} tests fail  [{summary}]  {seconds:.0f} s")
        for test in failed[:4]:
            print(f"{'':<26}   {test}")
        if name is None and failed:
            raise SystemExit("error: the tests fail without any mistake patched in")
        if name:
            results[name] = failed
    return results


DOC_BLOCK = re.compile(r"(<!-- mutations -->\n```text\n)(.*?)(```\n<!-- /mutations -->)", re.S)


def doc_block(results: dict[str, list[str]], tests: list[str]) -> str:
    """The doc's table of which test files catch each mistake, from ``run_mutations``."""
    lines = [f"mistake patched in            test files that fail (of {', '.join(tests)})"]
    for name, failed in results.items():
        files = sorted({test.split("::")[0] for test in failed})
        counts = ", ".join(f"{f} ({sum(t.startswith(f + '::') for t in failed)})" for f in files)
        lines.append(f"{name:<29} {counts or 'NONE: not caught'}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tests", nargs="+", default=TESTS, help="the test files to run on each copy")
    parser.add_argument("--only", nargs="+", choices=list(MUTATIONS), help="only these mistakes")
    parser.add_argument(
        "--write-doc", metavar="MD", help="write the table of the catching tests into this doc"
    )
    args = parser.parse_args(argv)
    results = run_mutations(args.tests, args.only)
    if args.write_doc:
        doc = Path(args.write_doc)
        text = DOC_BLOCK.sub(
            lambda m: m.group(1) + doc_block(results, args.tests) + m.group(3), doc.read_text()
        )
        doc.write_text(text, encoding="utf-8")
    uncaught = [name for name, failed in results.items() if not failed]
    if uncaught:
        print(f"NOT CAUGHT: {', '.join(uncaught)}")
    return int(bool(uncaught))


if __name__ == "__main__":
    sys.exit(main())
