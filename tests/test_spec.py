"""The parameter spec (dkernel.estimators.spec) is the one declaration of every
public parameter: the signatures match it, the docstrings and the CLI's
flags come from it, and a bad value is refused before any cluster starts."""

from __future__ import annotations

import inspect
import subprocess
import sys

import pytest

import dkernel
from dkernel.cli import build_parser
from dkernel.estimators.spec import ESTIMATORS


def test_every_public_estimator_is_declared():
    assert set(ESTIMATORS) == set(dkernel.estimators.__all__)


@pytest.mark.parametrize("name", sorted(ESTIMATORS))
def test_signature_matches_the_spec(name):
    sig = inspect.signature(getattr(dkernel, name))
    assert [(n, p.default) for n, p in sig.parameters.items()] == \
        [(p.name, p.default) for p in ESTIMATORS[name]]


@pytest.mark.parametrize("name", sorted(ESTIMATORS))
def test_docstring_documents_every_parameter_with_its_default(name):
    doc = getattr(dkernel, name).__doc__
    for p in ESTIMATORS[name]:
        assert f"\n    {p.name} : " in doc and f"default={p.shown_default()}" in doc, p.name


def test_kernel_cca_declares_its_own_widths():
    cca = {p.name: p.default for p in ESTIMATORS["KernelCCA"]}
    assert cca["lanes"] == 4 and cca["batch_size"] == 512


@pytest.mark.parametrize("name", ["EigenProRegressor", "EigenProClassifier"])
def test_eigenpro_automatic_settings_are_auto_and_none_is_still_accepted(name):
    # the settings that took None for "automatic" before "auto": old scripts keep working
    before = ("n_centers", "alpha", "q", "subsample_size", "damping", "batch_size",
              "step_size", "max_batch")
    defaults = {p.name: p.default for p in ESTIMATORS[name]}
    assert all(defaults[k] == "auto" for k in before)
    getattr(dkernel, name)(**dict.fromkeys(before))._check_params()


def test_every_option_of_every_command_shows_its_default():
    for name, command in build_parser()._subparsers._group_actions[0].choices.items():
        for action in command._actions:
            if action.option_strings and action.dest != "help" and not action.required:
                text = command.formatter_class(prog="x")._get_help_string(action)
                assert "default" in text, (name, action.option_strings)


def test_old_flag_spellings_still_parse():
    args = build_parser().parse_args(["fit", "s.zarr", "--out", "m.npz", "--epochs", "3",
                                      "--seed", "7", "--features", "64", "--centers", "5",
                                      "--components", "2"])
    assert (args.n_epochs, args.random_state, args.n_features, args.n_centers,
            args.n_components) == (3, 7, 64, 5, 2)


def test_bad_parameter_is_refused_in_under_two_seconds_without_a_cluster(tmp_path):
    # the process's CPU seconds, not the wall clock: on a loaded CI machine (two busy
    # processes beside the suite) the wall clock measured the neighbours
    code = ("import sys, time; from dkernel.cli import main; "
            "rc = main(['fit', 'STORE.zarr', '--solver', 'dsg', '--epochs', '-3', '--out', "
            "'m.npz']); print(rc, time.process_time(), 'distributed' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=tmp_path, timeout=60)
    rc, seconds, dask_loaded = out.stdout.split()
    err = out.stderr.strip().splitlines()
    assert rc == "1" and err == ["dkernel: error: n_epochs must be > 0, got -3; pass an "
                                 "integer n_epochs >= 1"]
    assert dask_loaded == "False"  # no cluster: distributed was not even imported
    assert float(seconds) < 2.0, seconds  # the interpreter's start and imports included


def test_the_command_lines_random_state_takes_none_as_the_help_says():
    """--random-state's help says anything but an int becomes a seed at fit,
    but "none" was refused as not an int."""
    from dkernel.estimators.spec import RANDOM_STATE

    assert RANDOM_STATE.check.parse("none") is None and RANDOM_STATE.check.parse("7") == 7
    with pytest.raises(ValueError):
        RANDOM_STATE.check.parse("seven")
