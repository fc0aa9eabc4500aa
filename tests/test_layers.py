"""The package's layers point down and no module imports itself back.

``lint-imports`` checks the contracts in pyproject.toml ([tool.importlinter]):
the layers cli > plot > io > estimators > solvers | datasets > engine > data >
features > kernels | losses | linalg > backend | files, one ingest module per
format, and no cycles between the modules of any package.  Its graph (grimp's)
holds the imports inside functions too.  The second test covers what those
contracts leave out: a module that imports a package above it, such as the
package root, which imports everything."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_imports_keep_the_layers_contract():
    script = Path(sys.executable).with_name("lint-imports")
    command = str(script) if script.exists() else shutil.which("lint-imports")
    if command is None:
        pytest.fail("lint-imports is not installed: pip install -e '.[test]'")
    run = subprocess.run([command, "--no-cache", "--no-logo"], cwd=ROOT, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, f"lint-imports found broken contracts:\n{run.stdout}{run.stderr}"


def test_no_module_imports_itself_back():
    import grimp

    graph = grimp.build_graph("dkernel", cache_dir=None)
    cycles = []
    for module in sorted(graph.modules):
        for imported in sorted(graph.find_modules_directly_imported_by(module)):
            back = graph.find_shortest_chain(importer=imported, imported=module)
            if back is not None:
                cycles.append(" -> ".join((module, *back)))
    assert not cycles, "import cycles (an import inside a function counts):\n" + "\n".join(cycles)
