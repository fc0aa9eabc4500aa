"""The parameter spec's machinery: a :class:`Param` declares one public
parameter once (name, default, constraint, doc, CLI flag); the estimators'
validation, the numpydoc "Parameters" sections and the flags of
``dkernel fit`` are generated from it.  The declarations themselves are in
:mod:`dkernel.estimators.spec`.

The constraints follow scikit-learn's ``_parameter_constraints`` in spirit:
small callables ``check(name, value)`` that raise a ``ValueError`` naming the
value and the fix, and that also know how to read the value from the command
line (``parse``).  This module imports nothing heavy, so the CLI refuses a bad
parameter before Dask is even imported.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import numbers
import textwrap
from collections.abc import Callable, Sequence
from typing import Any

#: The one sentinel for "resolved at fit time" (EigenPro's settings took None
#: before; None stays accepted there, see :func:`auto_or`).
AUTO = "auto"


@dataclasses.dataclass(frozen=True)
class Check:
    """A constraint: ``rule(value)`` returns None when the value is fine, else
    what it must be; ``fix`` says what to pass instead; ``parse`` reads it from
    the command line; ``choices`` are the CLI's choices when it has a few."""

    rule: Callable[[Any], str | None]
    fix: Callable[[str], str]
    parse: Callable[[str], Any] | None = None
    choices: tuple | None = None

    def __call__(self, name: str, value: Any) -> None:
        problem = self.rule(value)
        if problem is not None:
            raise ValueError(f"{name} must be {problem}, got {value!r}; {self.fix(name)}")


def _is_int(v: Any) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def _is_real(v: Any) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, bool)


def integer(low: int = 1) -> Check:
    """An integer >= ``low`` (0 or 1)."""
    def rule(v: Any) -> str | None:
        if not _is_int(v):
            return "an integer"
        return None if v >= low else ("> 0" if low == 1 else f">= {low}")
    return Check(rule, lambda n: f"pass an integer {n} >= {low}", int)


def number(low: float = 0.0, high: float = math.inf, *, low_open: bool = True,
           high_open: bool = False, shown: str = "") -> Check:
    """A finite number in an interval; the default is "> 0"."""
    if shown:
        pass
    elif (low, high, low_open) == (0.0, math.inf, True):
        shown = "> 0"
    elif (low, high) == (0.0, math.inf):
        shown = ">= 0"
    else:
        shown = f"in {'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"

    def rule(v: Any) -> str | None:
        if not _is_real(v):
            return "a number"
        inside = ((v > low if low_open else v >= low) and (v < high if high_open else v <= high))
        return None if math.isfinite(v) and inside else shown
    return Check(rule, lambda n: f"pass a number {n} {shown}", float)


def one_of(*choices: Any) -> Check:
    """One of a few values (strings, or None read as "none" on the command line)."""
    shown = ", ".join(repr(c) for c in choices[:-1]) + f" or {choices[-1]!r}"

    def parse(text: str) -> Any:
        return None if text == "none" and None in choices else text
    return Check(lambda v: None if any(v == c and type(v) is type(c) for c in choices) else shown,
                 lambda n: f"pass one of them as {n}", parse,
                 tuple("none" if c is None else c for c in choices))


def boolean() -> Check:
    return Check(lambda v: None if isinstance(v, bool) or type(v).__name__ == "bool_"
                 else "True or False", lambda n: f"pass {n}=True or {n}=False")


def auto_or(check: Check, *, none: bool = False) -> Check:
    """"auto" or a value ``check`` accepts (``none``: None too, the sentinel of
    earlier versions, so their scripts and model files keep working)."""
    def rule(v: Any) -> str | None:
        if isinstance(v, str) and v == AUTO or (none and v is None):
            return None
        problem = check.rule(v)
        # (a number out of range: say the range; an inner auto_or said "auto" already)
        if problem is None or _is_real(v) or problem.startswith('"auto" or '):
            return problem
        return f'"auto" or {problem}'

    def fix(name: str) -> str:
        inner = check.fix(name)
        return inner if inner.endswith(", or 'auto'") else inner + ", or 'auto'"

    def parse(text: str) -> Any:
        return AUTO if text == AUTO else check.parse(text)
    return Check(rule, fix, parse)


def none_or(check: Check) -> Check:
    """None (the option is off) or a value ``check`` accepts."""
    def parse(text: str) -> Any:
        return None if text == "none" else check.parse(text)
    return Check(lambda v: None if v is None or check.rule(v) is None else
                 f"None or {check.rule(v)}", check.fix, parse, check.choices)


def custom(check: Callable[[str, Any], None], parse: Callable[[str], Any] | None = None) -> Check:
    """A constraint whose message comes from an existing checker (kernels, seeds)."""
    def rule(v: Any) -> str | None:
        check("", v)
        return None
    return Check(rule, lambda n: "", parse)


def int_sequence() -> Check:
    """A sequence of integers >= 1: a list, tuple or 1-D array, not one number
    or a string (``record_at=500`` failed deep in the fit as a TypeError)."""
    what = "a sequence of integers >= 1"

    def rule(v: Any) -> str | None:
        # (a generator would pass by being used up, and the fit then get none)
        if isinstance(v, (str, bytes)) or not hasattr(v, "__len__") \
                or getattr(v, "ndim", 1) != 1:
            return what
        return None if all(_is_int(x) and x >= 1 for x in v) else what
    return Check(rule, lambda n: f"pass e.g. {n}=[100, 1000]")


def numbers_or_number() -> Check:
    """A number > 0, or a non-empty sequence of them (one per output: a
    fitted ``step_size_`` passed back); on the command line, comma-separated."""
    what, one = "a number > 0 or a list of them, one per output", number()

    def rule(v: Any) -> str | None:
        if _is_real(v):
            return one.rule(v)
        if not isinstance(v, (list, tuple)) or not v:  # (as step_size_ holds them; JSON-able)
            return what
        return None if all(one.rule(x) is None for x in v) else what

    def parse(text: str) -> Any:
        values = [float(t) for t in text.split(",")]
        return values[0] if len(values) == 1 else values
    return Check(rule, lambda n: f"pass e.g. {n}=0.5 or {n}=[0.5, 20.0]", parse)


def anything() -> Check:
    return Check(lambda v: None, lambda n: "")


@dataclasses.dataclass(frozen=True)
class Param:
    """One public parameter.

    ``kind`` is the numpydoc type; ``doc`` is the description, whose first
    line is the one-line help of the CLI flag; ``flag`` is the CLI option
    ("" derives ``--name-with-dashes`` from the name, None keeps it off the
    CLI) and ``aliases`` the older spellings it still accepts; ``group`` is
    kernel, pool, sgd, early stopping, runtime or model.
    """

    name: str
    default: Any
    kind: str
    check: Check
    doc: str
    group: str = "model"
    flag: str | None = ""
    aliases: tuple[str, ...] = ()

    def but(self, **changes: Any) -> Param:
        """This parameter as one estimator declares it (its own default or doc)."""
        return dataclasses.replace(self, **changes)

    @property
    def option(self) -> str | None:
        if self.flag is None:
            return None
        return self.flag or "--" + self.name.replace("_", "-")

    @property
    def summary(self) -> str:
        """The first sentence of the doc (the CLI's help line)."""
        first = textwrap.dedent(self.doc).strip().split(".  ")[0]
        return " ".join(first.split()).rstrip(".").replace("``", "")

    def validate(self, value: Any) -> None:
        self.check(self.name, value)

    def shown_default(self) -> str:
        if isinstance(self.default, str):
            return f'"{self.default}"'
        if isinstance(self.default, float) and self.default != round(self.default, 6):
            return {1 / 3: "1/3"}.get(self.default, f"{self.default:g}")
        return repr(self.default)

    def numpydoc(self) -> str:
        kind = self.kind.removesuffix(", optional")
        if kind != self.kind and " or None" not in kind:
            kind += " or None"
        head = f"{self.name} : {kind}, default={self.shown_default()}"
        body = textwrap.indent(textwrap.dedent(self.doc).strip(), " " * 4)
        return head + ("\n" + body if body.strip() else "")


#: The runtime parameters that are no hyper-parameters of the model.
RUNTIME = ("client", "verbose", "checkpoint", "checkpoint_every", "resume")


def parameters_section(params: Sequence[Param]) -> str:
    """The numpydoc "Parameters" section of ``params``, indented for a class docstring."""
    text = "Parameters\n----------\n" + "\n".join(p.numpydoc() for p in params)
    return textwrap.indent(text, "    ")


def with_parameters(doc: str, params: Sequence[Param]) -> str:
    """``doc`` (a class docstring) with its Parameters section generated from
    ``params``, before its Attributes (or Examples) section or at its end."""
    section = parameters_section(params) + "\n\n"
    for heading in ("    Attributes\n", "    Examples\n"):
        at = doc.find(heading)
        if at >= 0:
            return doc[:at] + section + doc[at:]
    return doc.rstrip() + "\n\n" + section


def check_values(params: Sequence[Param], values: dict[str, Any]) -> None:
    """Validate ``values`` (parameter name -> value) against their declarations."""
    for p in params:
        if p.name in values:
            p.validate(values[p.name])


def add_flag(group: Any, name: str, params: Sequence[Param], help_text: str) -> argparse.Action:
    """One CLI option for the parameter ``name`` as the estimators in ``params``
    declare it (they share its check and flag)."""
    p = params[0]
    names = [p.option, *p.aliases]
    if p.check.parse is None:  # a switch: --name turns on, --no-name off where it is on
        action = (argparse.BooleanOptionalAction if any(q.default for q in params)
                  else "store_true")
        return group.add_argument(*names, dest=name, action=action,
                                  default=argparse.SUPPRESS, help=help_text)
    return group.add_argument(*names, dest=name, type=_typed(p), default=argparse.SUPPRESS,
                              choices=p.check.choices and _choices(p), help=help_text,
                              metavar=None if p.check.choices else name.upper())


class _Choices(tuple):
    def __contains__(self, value: Any) -> bool:  # parsed values: "none" read as None
        return value is None or tuple.__contains__(self, value)


def _choices(p: Param) -> tuple:
    return _Choices(p.check.choices)


def _typed(p: Param) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        try:
            return p.check.parse(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{p.option} expects {p.kind}, got {text!r}") from None
    parse.__name__ = p.kind  # argparse names the type in its own messages
    return parse
