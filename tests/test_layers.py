"""The architecture holds by tool, not by copying: import-linter's contracts
(``[tool.importlinter]`` in pyproject.toml: the layers, the engines apart,
the backends apart, no cycle inside a package) and no first-party import
hidden inside a function, the usual way to dodge a cycle."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import require_component

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("ordeal", "invariants", "faults", "reports", "nodes", "load", "engines", "clusters",
            "runs", "fixtures")
LINT = Path(sys.executable).parent / "lint-imports"


def lint(cwd: Path) -> subprocess.CompletedProcess[str]:
    require_component("import-linter", None if LINT.exists() else
                      f"{LINT} is missing: import-linter comes with .[test] (bash .ci/setup)")
    return subprocess.run([str(LINT), "--no-cache"], cwd=cwd, capture_output=True, text=True,
                          timeout=300)


def test_import_contracts_hold() -> None:
    done = lint(REPO)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "0 broken" in done.stdout


def copy_tree(dst: Path) -> None:
    """The packages' Python files and pyproject.toml, nothing else."""
    shutil.copy(REPO / "pyproject.toml", dst / "pyproject.toml")
    for pkg in PACKAGES:
        for src in (REPO / pkg).rglob("*.py"):
            target = dst / src.relative_to(REPO)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(src, target)


@pytest.mark.parametrize("module, line, broken", [
    # the vocabulary reaching up into a run kind
    ("ordeal/topology.py", "import runs.run", "Each layer imports only the layers below it"),
    # a checker talking to a cluster backend, from inside a function
    ("invariants/usage.py", "def _hidden():\n    from clusters import local\n",
     "Each layer imports only the layers below it"),
    # two modules of one package importing each other
    ("load/sse.py", "import load.workload", "No import cycle between the modules of a package"),
    ("engines/vllm/adapter.py", "import engines.triton.models", "The vLLM engine does not know Triton"),
    # a backend reaching into a fault kind's module (issue 41)
    ("clusters/docker.py", "import faults.clock_drift",
     "Engines and load do not import faults; clusters only its public seams"),
])
def test_contracts_catch_a_planted_violation(tmp_path: Path, module: str, line: str,
                                             broken: str) -> None:
    copy_tree(tmp_path)
    target = tmp_path / module
    target.write_text(target.read_text() + "\n" + line + "\n")
    done = lint(tmp_path)
    assert done.returncode != 0, done.stdout[-3000:]
    assert f"{broken} BROKEN" in done.stdout, done.stdout[-3000:]


def first_party_imports_in_functions(root: Path) -> list[str]:
    found = []
    for pkg in PACKAGES:
        for path in sorted((root / pkg).rglob("*.py")):
            tree = ast.parse(path.read_text(), str(path))
            for fn in ast.walk(tree):
                if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    continue
                for node in ast.walk(fn):
                    if isinstance(node, ast.Import):
                        names = [a.name for a in node.names]
                    elif isinstance(node, ast.ImportFrom):
                        names = ["." if node.level else (node.module or "")]
                    else:
                        continue
                    if any(n == "." or n.split(".")[0] in PACKAGES for n in names):
                        found.append(f"{path.relative_to(root)}:{node.lineno} in {fn.name}()")
    return found


def test_no_first_party_import_inside_a_function() -> None:
    found = first_party_imports_in_functions(REPO)
    assert not found, "imports inside functions (move them to the top; break the cycle):\n" + \
        "\n".join(found)


def test_the_scan_finds_an_import_inside_a_function(tmp_path: Path) -> None:
    (tmp_path / "load").mkdir()
    (tmp_path / "load" / "x.py").write_text("def f():\n    from engines import base\n")
    assert first_party_imports_in_functions(tmp_path) == ["load/x.py:2 in f()"]
