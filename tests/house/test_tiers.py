"""The package's tiers, read from every module's imports: core, reference, fast, runtime, interop,
training, inference, serving, commands; each module imports only from its own tier and the ones before it,
``interop/`` only through its one door (``interop/formats.py``, which imports the rest of ``interop/``, and
so ``transformers``, only inside a function, when a released model is met), and no modules import each
other in a loop. The core is the paper in plain PyTorch: no hand-written gradient, no private API, no
patched method."""

import ast
import subprocess
import sys
from pathlib import Path

from helpers import ROOT

PACKAGE = ROOT / "transformer"
TIERS = ("core", "reference", "fast", "runtime", "interop", "training", "inference", "serving", "commands")
DOOR = "transformer.interop.formats"  # the module of interop/ others import; it imports the rest lazily
CORE_LINES = 1600


def module_of(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_of(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def tier(module: str) -> int | None:
    """The tier of a module of the package (None: the package's faces, ``transformer/__init__.py`` and
    ``__main__.py``)."""
    parts = module.split(".")
    return TIERS.index(parts[1]) if len(parts) > 1 and parts[1] != "__main__" else None


def imports(source: str) -> list[tuple[str, bool, int]]:
    """(module of the package imported, whether the import runs only when a function is called, line)."""
    found = []

    def visit(node: ast.AST, lazy: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inner = lazy or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.Import):
                found.extend(
                    (a.name, lazy, child.lineno) for a in child.names if a.name.startswith("transformer.")
                )
            elif isinstance(child, ast.ImportFrom) and child.level == 0 and child.module:
                if child.module == "transformer" or child.module.startswith("transformer."):
                    for a in child.names:  # `from transformer.training import reporting`: the submodule
                        sub = f"{child.module}.{a.name}"
                        found.append((sub if sub in MODULES else child.module, lazy, child.lineno))
            visit(child, inner)

    visit(ast.parse(source), False)
    return found


def violations(module: str, source: str) -> list[str]:
    """Each import of ``module``'s source that breaks the tier rules, as a line of text."""
    found = []
    here = tier(module)
    for imported, lazy, line in imports(source):
        there = tier(imported)
        if here is None or there is None:
            continue
        where = f"{module} line {line} imports {imported}"
        if TIERS[there] == "interop" and TIERS[here] != "interop" and imported != DOOR:
            found.append(f"{where}: only {DOOR} is imported from interop/")
        elif module == DOOR and TIERS[there] == "interop" and not lazy:
            found.append(f"{where}: {DOOR} imports the rest of interop/ inside a function only")
        elif there > here:
            found.append(f"{where}: a later tier ({TIERS[there]} after {TIERS[here]})")
    return found


def test_every_module_imports_only_its_tier_and_the_ones_before():
    found = [v for module, path in MODULES.items() for v in violations(module, path.read_text("utf-8"))]
    assert found == []


def test_the_rule_catches_a_later_tier_and_a_second_door_to_interop():
    assert violations("transformer.core.model", "from transformer.training.ema import EMA\n")
    assert violations(
        "transformer.core.model", "def f():\n    from transformer.inference import translator\n"
    )
    assert violations(
        "transformer.training.cache", "from transformer.interop.marian_text import MarianText\n"
    )
    assert violations("transformer.training.cache", "def f():\n    import transformer.interop.released\n")
    assert violations(DOOR, "from transformer.interop.released import load_released\n")  # not lazily
    assert not violations(DOOR, "def f():\n    from transformer.interop.released import load_released\n")
    assert not violations("transformer.training.cache", f"from {DOOR} import read_tokenizer\n")
    assert not violations("transformer.inference.translator", "from transformer.training import reporting\n")


def test_no_modules_import_each_other_in_a_loop():
    graph = {
        m: {i for i, _, _ in imports(p.read_text("utf-8")) if i in MODULES and i != m}
        for m, p in MODULES.items()
    }
    graph = {m: {i for i in targets if tier(i) is not None} for m, targets in graph.items()}  # not the face
    state: dict[str, str] = {}
    loops = []

    def walk(module: str, path: list[str]) -> None:
        state[module] = "open"
        for imported in sorted(graph[module]):
            if state.get(imported) == "open":
                loops.append(path[path.index(imported) :] + [imported])
            elif imported not in state:
                walk(imported, path + [imported])
        state[module] = "done"

    for module in sorted(graph):
        if module not in state:
            walk(module, [module])
    assert loops == []


def test_the_core_is_at_most_1600_lines_and_is_a_folder_a_reader_can_stop_at():
    core = sorted((PACKAGE / "core").glob("*.py"))
    lines = sum(len(path.read_text("utf-8").splitlines()) for path in core)
    assert lines <= CORE_LINES, f"transformer/core/*.py has {lines} lines"
    reading_order = (PACKAGE / "core" / "__init__.py").read_text("utf-8")
    missing = [p.name for p in core if p.name != "__init__.py" and p.name not in reading_order]
    assert missing == [], "core/__init__.py's reading order leaves out these files"


def test_the_names_users_import_come_from_the_top_level():
    import transformer
    from transformer import (  # noqa: F401 -- the README's Python API
        MultiHeadAttention,
        Transformer,
        Translator,
        from_marian,
        load_config,
        scaled_dot_product_attention,
        to_marian,
    )

    for name in transformer.__all__:
        module = transformer.EXPORTS[name]
        assert getattr(transformer, name) is getattr(
            __import__(f"transformer.{module}", fromlist=[name]), name
        )


def test_the_core_imports_without_the_other_tiers_and_their_extras():
    code = (
        "import sys, transformer.core.decoding, transformer.core.checkpoint, transformer.core.loss\n"
        "later = ('transformer.fast', 'transformer.runtime', 'transformer.training',\n"
        "         'transformer.inference', 'transformer.interop', 'transformers',\n"
        "         'ctranslate2', 'torchao', 'datasets', 'sacrebleu')\n"
        "others = [m for m in sys.modules if m.startswith(later)]\n"
        "assert not others, others\n"
    )
    assert_runs(code)


def test_bench_holds_only_scripts_whose_figures_the_benchmarks_page_names():
    page = (ROOT / "docs" / "benchmarks.md").read_text("utf-8")
    unnamed = [p.name for p in sorted((ROOT / "bench").iterdir()) if p.is_file() and p.name not in page]
    assert unnamed == [], "docs/benchmarks.md names no command of these bench/ scripts"


def test_the_core_has_no_hand_written_gradient_no_private_api_and_no_patched_method():
    """What a learner reading the core never meets: ``torch.autograd.Function``, ``torch._...``, a method
    or attribute of another object replaced at run time (``obj.forward = ...``)."""
    found = []
    for path in sorted((PACKAGE / "core").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text("utf-8"))):
            if isinstance(node, ast.Attribute) and ast.unparse(node).startswith(
                ("torch.autograd.Function", "torch._")
            ):
                found.append(f"{path.name}:{node.lineno} {ast.unparse(node)}")
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                ("torch.autograd", "torch._")
            ):
                found.append(f"{path.name}:{node.lineno} from {node.module} import ...")
            if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id != "self"
                and t.attr in ("forward", "input_projection", "attend", "extend_cache")
                for t in node.targets
            ):  # fmt: skip
                found.append(f"{path.name}:{node.lineno} {ast.unparse(node)}")
    assert found == []


def test_translating_enters_no_training_module():
    code = (
        "import sys, runpy\n"
        "sys.argv = ['translate.py', '--help']\n"
        "try:\n    runpy.run_path('translate.py', run_name='__main__')\nexcept SystemExit:\n    pass\n"
        "import transformer.inference.translator, transformer.serving.app\n"
        "training = sorted(m for m in sys.modules if m.startswith('transformer.training'))\n"
        "assert not training, training\n"
    )
    assert_runs(code)


def assert_runs(code: str) -> None:
    """``code`` in a fresh interpreter (its own ``sys.modules``) exits 0."""
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


TEST_FOLDERS = {"house", "bench", "lesson"}  # the house rules, and the scripts of bench/ and lesson/


def test_the_tests_live_in_folders_that_mirror_the_tiers():
    """A test file sits in the folder of the tier it tests (the oracle's tier, ``reference``, is the core
    tests' own tool), or with the house rules, or beside the scripts it runs; none lies loose in tests/."""
    tests = ROOT / "tests"
    folders = {p.name for p in tests.iterdir() if p.is_dir() and not p.name.startswith((".", "_"))}
    assert folders == (set(TIERS) - {"reference"}) | TEST_FOLDERS
    assert sorted(p.name for p in tests.glob("*.py")) == ["conftest.py", "helpers.py", "servers.py"]
    assert all(any(folder.glob("test_*.py")) for folder in map(tests.joinpath, folders))
