"""Sphinx configuration: ``python -m sphinx -W docs docs/_build/html`` (the docs extra).

Offline by design: no intersphinx, no remote images.  The gallery pages are
made from ``examples/`` without running them (the test suite runs every
example in small mode, ``tests/test_examples.py``); set
``DKERNEL_DOCS_RUN_EXAMPLES=1`` to run them for their figures and output.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import dkernel

HERE = Path(__file__).resolve().parent
# the examples' shared helper (examples/_fashion.py) when sphinx-gallery runs them
sys.path.insert(0, str(HERE.parent / "examples"))

project = "dkernel"
author = "the dkernel developers"
copyright = "the dkernel developers"
release = dkernel.__version__
version = release

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.mathjax",
    "numpydoc",
    "myst_parser",
    "sphinx_gallery.gen_gallery",
]

source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
exclude_patterns = ["_build", "auto_examples/*.ipynb", "auto_examples/*.py",
                    "auto_examples/*.zip", "auto_examples/*.json"]

# numpydoc: member lists come from autodoc's :members:, not numpydoc's tables
numpydoc_show_class_members = False
numpydoc_xref_param_type = False
autodoc_member_order = "bysource"
autodoc_typehints = "none"  # numpydoc's Parameters section carries the types

# Markdown pages (README-style docs/scaling.md, quality.md, deploy/README.md)
myst_heading_anchors = 3
myst_enable_extensions = ["dollarmath"]

run_examples = os.environ.get("DKERNEL_DOCS_RUN_EXAMPLES", "") not in ("", "0")
sphinx_gallery_conf = {
    "examples_dirs": str(HERE.parent / "examples"),
    "gallery_dirs": "auto_examples",
    "filename_pattern": r".*\.py",      # every example, when they are run at all
    "ignore_pattern": r"(^|/)_",  # helpers such as examples/_fashion.py
    "plot_gallery": run_examples,
    "download_all_examples": False,
    "within_subsection_order": "FileNameSortKey",
    "remove_config_comments": True,
}

html_theme = "alabaster"
html_static_path: list[str] = []
html_theme_options = {"description": "Kernel methods at data-center scale on Dask",
                      "fixed_sidebar": True}

# autodoc: each estimator shows the methods of dkernel's base classes (fit,
# predict, save, ...); scikit-learn's own (get_params, metadata routing,
# set_output) are documented by scikit-learn.
_REQUEST = re.compile(r"set_\w+_request$")


def _skip_sklearn(app, what, name, obj, skip, options):
    module = getattr(obj, "__module__", None) or ""
    if what == "class" and (module.startswith("sklearn") or _REQUEST.match(name)):
        return True
    return None


# dkernel's docstrings are plain text first (they are read in editors and by
# help()): ``|f|^2`` is a norm and ``q_`` a fitted attribute, where reST would
# read a substitution and a link target.  Escape those two characters outside
# literals, roles and code before numpydoc and docutils see the docstring.
_LITERAL = re.compile(r"(``.+?``|:[\w:.-]+:`[^`]+`|`[^`]+`|\$[^$]+\$)")
_TARGET = re.compile(r"(?<=\w)_(?=[^\w]|$)")


def _escape_plain(text: str) -> str:
    parts = _LITERAL.split(text)
    for i in range(0, len(parts), 2):  # the even parts are outside literals
        parts[i] = _TARGET.sub(r"\\_", parts[i].replace("|", r"\|"))
    return "".join(parts)


def _escape_docstring(app, what, name, obj, options, lines: list[str]) -> None:
    literal_indent = None  # inside a literal block or directive (after "::"), indented deeper
    doctest = False  # inside a doctest block: from ">>>" to the next blank line
    for i, line in enumerate(lines):
        stripped = line.lstrip()
        indent = len(line) - len(stripped)
        if literal_indent is not None:
            if not stripped or indent > literal_indent:
                continue
            literal_indent = None
        doctest = bool(stripped) and (doctest or stripped.startswith(">>>"))
        if stripped.endswith("::"):
            literal_indent = indent
        if not (doctest or stripped.startswith(".. ")):
            lines[i] = _escape_plain(line)


def setup(app):
    # before numpydoc (priority 500) turns sections into reST
    app.connect("autodoc-process-docstring", _escape_docstring, priority=400)
    app.connect("autodoc-skip-member", _skip_sklearn)
