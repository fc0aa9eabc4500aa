"""The documentation site builds and its code runs.

- ``python -m sphinx -W`` builds docs/ (offline; the gallery's pages are made
  from examples/ without running them: tests/test_examples.py runs those);
- every public class and function (a public ``__all__``, and dkernel.plot)
  has an entry in the API reference;
- every Python block of README.md and of the user guide runs, on small data:
  2000 x 10 classification stores ``data/train.zarr`` / ``data/test.zarr`` and
  the names the pages assume (``client``, ``X``, ``y``, ``X_test``, ...);
- every ``dkernel`` command in their shell blocks parses with the CLI's parser.
"""

from __future__ import annotations

import importlib
import inspect
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import dask
import numpy as np
import pytest

from dkernel.cli import build_parser

ROOT = Path(__file__).resolve().parent.parent
GUIDE = sorted((ROOT / "docs" / "guide").glob("*.md"))
PAGES = [ROOT / "README.md", ROOT / "docs" / "install.md", *GUIDE]
#: modules whose names are public API; for those without ``__all__`` (dkernel.plot)
#: the functions defined in the module without a leading underscore
PUBLIC_MODULES = ["dkernel", "dkernel.data", "dkernel.data.ingest", "dkernel.datasets",
                  "dkernel.engine", "dkernel.estimators", "dkernel.kernels", "dkernel.plot"]


def fenced_blocks(path: Path, language: str) -> list[str]:
    """The bodies of the ```language fenced blocks of a Markdown file."""
    return re.findall(rf"^```{language}\n(.*?)^```", path.read_text(), re.S | re.M)


# ------------------------------------------------------------------ the site
@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """Build a copy of docs/ (and what it includes) with -W; the build's output."""
    src = tmp_path_factory.mktemp("docs-src")
    ignore = shutil.ignore_patterns("_build", "auto_examples", "sg_execution_times.rst",
                                    "__pycache__", "*.png")
    shutil.copytree(ROOT / "docs", src / "docs", ignore=ignore)
    for png in (ROOT / "docs").glob("*.png"):
        shutil.copy(png, src / "docs")
    shutil.copytree(ROOT / "examples", src / "examples", ignore=ignore)
    shutil.copytree(ROOT / "deploy", src / "deploy", ignore=ignore)
    out = src / "html"
    build = subprocess.run([sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q",
                            "-b", "html", str(src / "docs"), str(out)],
                           capture_output=True, text=True, timeout=600)
    return build, out


def test_sphinx_builds_the_site_with_warnings_as_errors(site):
    build, out = site
    assert build.returncode == 0, (f"sphinx -W failed:\n{build.stdout[-3000:]}\n"
                                   f"{build.stderr[-6000:]}")
    assert (out / "index.html").exists()
    gallery = {p.stem for p in (out / "auto_examples").glob("*.html")} - {"index"}
    scripts = {p.stem for p in (ROOT / "examples").glob("*.py") if not p.name.startswith("_")}
    assert scripts <= gallery, f"examples without a gallery page: {scripts - gallery}"


def _resolve(dotted: str):
    """The object a documented name like 'dkernel.engine.connect' refers to."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attr in parts[i:]:
            obj = getattr(obj, attr, None)
        return obj
    return None


def _public_names():
    for name in PUBLIC_MODULES:
        module = importlib.import_module(name)
        names = getattr(module, "__all__", None)
        if names is None:
            names = [n for n, obj in vars(module).items() if not n.startswith("_")
                     and inspect.isfunction(obj) and obj.__module__ == name]
        for n in names:
            obj = getattr(module, n)
            if inspect.isclass(obj) or inspect.isfunction(obj):
                yield f"{name}.{n}", obj


def test_every_public_class_and_function_is_in_the_api_reference(site):
    build, out = site
    assert build.returncode == 0, "the site did not build (see the test above)"
    ids = set()
    for page in (out / "api").glob("*.html"):
        ids |= set(re.findall(r'<dt class="sig sig-object py" id="([\w.]+)"', page.read_text()))
    documented = [_resolve(i) for i in ids]
    missing = [name for name, obj in _public_names()
               if name not in ids and not any(obj is d for d in documented)]
    assert len(ids) > 50, sorted(ids)
    assert not missing, f"public names missing from docs/api/: {missing}"


# ------------------------------------------------------------- code blocks
@pytest.fixture
def page_namespace(client, tmp_path, monkeypatch):
    """Where a page's blocks run: small stores under data/ and the arrays the pages
    assume.  A ``Client()`` in a block connects to the session's cluster (the
    configuration's scheduler address), not to a new one; it is closed after."""
    from dkernel.data import open_dataset
    from dkernel.datasets import make_store

    monkeypatch.chdir(tmp_path)
    train = make_store("data/train.zarr", 2000, 10, chunk_rows=500, kind="classification")
    test = make_store("data/test.zarr", 500, 10, chunk_rows=500, kind="classification",
                      random_state=1)
    X, y = (a.compute() for a in (open_dataset(train).X, open_dataset(train).y))
    X_test, y_test = (a.compute() for a in (open_dataset(test).X, open_dataset(test).y))
    return {"client": client, "X": X, "y": y, "X_test": X_test, "y_test": y_test,
            "np": np,
            # README's two-view and density-ratio lines name these
            "X_left": X[:, :5], "X_right": X[:, 5:],
            "X_left_test": X_test[:, :5], "X_right_test": X_test[:, 5:],
            "X_numerator": X[y == 0], "X_denominator": X}


# README's blocks fit at the sizes a real run uses (n_features 4096-8192), about
# 25 s on 2 idle cores (54 s while the 2000 rows' eigensolves took order 4096),
# so that page alone is a minute or more under load, hence slow
@pytest.mark.parametrize("page", [pytest.param(p, marks=pytest.mark.slow) if p.name == "README.md"
                                  else p for p in PAGES],
                         ids=lambda p: p.relative_to(ROOT).as_posix())
def test_python_blocks_of_the_page_run(page, page_namespace):
    blocks = fenced_blocks(page, "python")
    if page.parent.name == "guide" and page.stem != "index":
        assert blocks, f"{page.name}: a user guide page needs at least one runnable example"
    session_client = page_namespace["client"]
    try:
        with dask.config.set({"scheduler-address": session_client.scheduler.address}):
            for i, code in enumerate(blocks):
                try:
                    exec(compile(code, f"{page.name}[python block {i}]", "exec"), page_namespace)
                except Exception as exc:
                    raise AssertionError(f"{page.name}, python block {i} failed: {exc!r}\n"
                                         f"{code}") from exc
    finally:
        if page_namespace["client"] is not session_client:
            page_namespace["client"].close()


def _dkernel_commands(block: str) -> list[list[str]]:
    """The ``dkernel ...`` command lines of a shell block, as argument lists
    (continuations joined, comments dropped, ``[optional]`` brackets opened)."""
    commands = []
    for line in block.replace("\\\n", " ").splitlines():
        lexer = shlex.shlex(line.replace("[", " ").replace("]", " "), posix=True,
                            punctuation_chars=";&|")
        lexer.whitespace_split = True
        words: list[str] = []
        for word in [*lexer, ";"]:  # a command ends at ; && || | and at the line's end
            if word.strip(";&|"):
                words.append(word)
                continue
            if words and words[0] == "dkernel":
                commands.append(words[1:])
            words = []
    return commands


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_dkernel_commands_in_shell_blocks_parse(page, capsys):
    parser = build_parser()
    commands = [c for b in fenced_blocks(page, "bash") for c in _dkernel_commands(b)]
    for args in commands:
        try:
            parser.parse_args(args)
        except SystemExit as exc:
            err = capsys.readouterr().err
            raise AssertionError(f"{page.name}: 'dkernel {' '.join(args)}' does not parse: "
                                 f"{err.strip().splitlines()[-1:]}") from exc
    if page.name == "README.md":
        assert len(commands) >= 10, commands
