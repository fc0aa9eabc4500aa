"""The quality matrix's slice (benchmarks/quality.py --quick): each estimator at
its default settings, on a few regimes, against an exact or trusted reference,
with the tolerances the benchmark states before it runs."""

from __future__ import annotations

import importlib.util
import pathlib
import sys

import pytest

_PATH = pathlib.Path(__file__).resolve().parents[1] / "benchmarks" / "quality.py"
_spec = importlib.util.spec_from_file_location("dkernel_quality_matrix", _PATH)
quality = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = quality  # dataclasses resolve annotations through it
_spec.loader.exec_module(quality)

CELLS = quality.cells([], quick=True)

#: Cells the defaults miss today, with what was measured (docs/quality.md); strict,
#: so a fix that makes one pass says so and the mark is removed.
KNOWN_MISSES = {
    ("DSGRegressor", "bw=0.25x"): "R^2 0.624 against kernel ridge's 0.766 (tolerance 0.05): a "
                                  "narrow kernel needs more than the default 4096 random "
                                  "features (16384 passed it on the data before stop 46)",
    ("DSGRegressor", "bw=4x"): "R^2 0.727 against kernel ridge's 0.943 (tolerance 0.05); the "
                               "reference's ridge is 1e-8, ridge on the fit's own features gives "
                               "0.888 at the default alpha=1e-6, and q=7 steps reach eigenvalues "
                               "near 2.6e-4 only (docs/quality.md): no default passes it",
    ("KernelPCA", "bw=0.25x"): "sin^2 0.123 at an eigengap of 0.135 (tolerance 0.05): a narrow "
                               "kernel needs more than the default 4096 random features (16384 "
                               "passed it on the data before stop 46)",
}


def _param(name, regime):
    reason = KNOWN_MISSES.get((name, regime.name))
    marks = [pytest.mark.xfail(reason=reason, strict=True)] if reason else []
    return pytest.param(name, regime, marks=marks, id=f"{name}-{regime.name}")


def test_the_slice_covers_every_estimator():
    assert {name for name, _ in CELLS} == set(quality.ESTIMATORS)


@pytest.mark.slow
@pytest.mark.parametrize("name, regime", [_param(n, r) for n, r in CELLS])
def test_default_settings_meet_the_reference(client, name, regime):
    row = quality.run_cell(name, regime, client)
    assert row["passed"] is not None, f"{name} / {regime.name} has no verdict (unchecked): {row}"
    assert row["passed"], row


def test_markdown_refuses_to_overwrite_a_file_it_did_not_write(tmp_path, capsys):
    doc = tmp_path / "quality.md"
    doc.write_text("# Quality at the defaults\n\nprose written by hand\n")
    with pytest.raises(SystemExit) as stop:  # before any cluster starts or cell runs
        quality.main(["--only", "DSGOneClassSVM", "--only", "n=300", "--markdown", str(doc)])
    assert stop.value.code == 2
    assert "is not a table this script wrote" in capsys.readouterr().err
    assert doc.read_text() == "# Quality at the defaults\n\nprose written by hand\n"
    table = tmp_path / "table.md"
    table.write_text(quality.markdown([]))
    assert quality._is_our_table(str(table)) and quality._is_our_table(str(tmp_path / "new.md"))
