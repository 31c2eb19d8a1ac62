"""The runtime/toolchain boundary: no `edgeocr` module imports `quantize`, torch or transformers, written
anywhere in its source or pulled in when it is imported; the shared fixtures and the pure unit tests run
without torch."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FORBIDDEN = ("quantize", "torch", "transformers")
# test modules that need no torch: importing them (and conftest) must not import it
TORCH_FREE_TESTS = ("conftest", "test_units", "test_structure", "test_slots", "test_errors", "test_serve",
                    "test_preprocess_fast", "test_check", "test_bench")


def _forbidden_imports(path: Path) -> list[str]:
    """`import X` / `from X import ...` of a forbidden top-level package, at any depth of the file."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        found += [f"{path}:{node.lineno} imports {n}" for n in names
                  if n.split(".")[0] in FORBIDDEN]
    return found


def test_no_edgeocr_source_imports_the_toolchain_or_torch():
    files = sorted((ROOT / "edgeocr").rglob("*.py"))
    assert len(files) > 30
    assert [f for p in files for f in _forbidden_imports(p)] == []


def test_the_checker_sees_an_import_inside_a_function(tmp_path):
    """The walk above finds lazy imports too, not only those at the top of a module."""
    p = tmp_path / "probe.py"
    p.write_text("import json\ndef f():\n    from quantize.reference import TransformersRunner\n    import torch.cuda\n"
                 "    from . import torch\n")
    assert [s.split(" imports ")[1] for s in _forbidden_imports(p)] == ["quantize.reference", "torch.cuda"]


_IMPORT_ALL = """
import importlib, json, pkgutil, sys
import edgeocr
missing = {}
for m in pkgutil.walk_packages(edgeocr.__path__, "edgeocr."):
    if m.name.endswith(".__main__"):      # runs the CLI; it imports edgeocr.cli only
        continue
    try:
        importlib.import_module(m.name)
    except ModuleNotFoundError as e:      # an optional extra (tensorrt, ...) this machine lacks
        missing[m.name] = e.name
loaded = sorted({n.split(".")[0] for n in sys.modules} & {"quantize", "torch", "transformers"})
print(json.dumps({"loaded": loaded, "missing": missing}))
"""


def test_importing_every_edgeocr_module_loads_no_toolchain_or_torch():
    r = subprocess.run([sys.executable, "-c", _IMPORT_ALL], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout.splitlines()[-1])
    assert out["loaded"] == []
    assert not [n for n in out["missing"].values() if n.split(".")[0] in FORBIDDEN + ("edgeocr",)], out["missing"]


def test_conftest_and_the_torch_free_tests_do_not_import_torch():
    code = ("import importlib, json, sys\n"
            f"for m in {TORCH_FREE_TESTS!r}: importlib.import_module(m)\n"
            "print(json.dumps(sorted({n.split('.')[0] for n in sys.modules} & {'torch', 'transformers'})))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       cwd=ROOT / "tests", env={**__import__("os").environ, "PYTHONPATH": f"{ROOT}:{ROOT / 'tests'}"})
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads(r.stdout.splitlines()[-1]) == []


def test_the_unit_tests_run_without_torch():
    """test_units.py run whole in a fresh interpreter: it passes and torch was never imported."""
    code = ("import sys, pytest\n"
            "rc = pytest.main(['-q', '-p', 'no:cacheprovider', 'tests/test_units.py'])\n"
            "sys.exit(int(rc) or (99 if 'torch' in sys.modules else 0))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert r.returncode == 0, (r.returncode, r.stdout[-2000:])


def test_architecture_doc_names_every_runtime_module_and_only_real_ones():
    """docs/architecture.md's module map: every edgeocr module is named there (by path, or by file or module name
    in the row of its package), and every `edgeocr/...py` path it names exists."""
    import re

    doc = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    unnamed = []
    for p in sorted((ROOT / "edgeocr").rglob("*.py")):
        rel = p.relative_to(ROOT).as_posix()
        if p.name == "__init__.py" and p.parent.name != "edgeocr":
            ok = f"`{p.parent.relative_to(ROOT).as_posix()}/`" in doc
        else:
            ok = rel in doc or p.name in doc or f"`{p.stem}`" in doc
        if not ok:
            unnamed.append(rel)
    assert unnamed == []
    named = set(re.findall(r"edgeocr/[\w/]+\.py", doc))
    assert named and [n for n in sorted(named) if not (ROOT / n).exists()] == []
