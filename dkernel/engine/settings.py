"""dkernel's own keys in the Dask configuration (``dkernel.progress-heartbeat``,
``dkernel.cache-fraction``, ``dkernel.cache-live-seconds``), read and checked:
a value out of range or not a number stops with one line naming the key and
where it is set, instead of a heartbeat of 60,000 lines (0), a traceback in a
background thread ("abc") or a cache of 5x the worker's memory."""

from __future__ import annotations

import math

import dask


def number(key: str, default: float, low: float = 0.0, high: float = math.inf) -> float:
    """The configured value of ``key`` (``default`` when unset), a number in
    [``low``, ``high``]; anything else raises ValueError."""
    raw = dask.config.get(key, default)
    try:
        value = float(raw)
    except (TypeError, ValueError):
        value = math.nan
    if not low <= value <= high:
        span = f"at least {low:g}" if high == math.inf else f"in [{low:g}, {high:g}]"
        variable = "DASK_" + key.upper().replace(".", "__").replace("-", "_")
        raise ValueError(f"the Dask configuration's {key} is {raw!r}, not a number {span}: fix "
                         f"it where it is set (a YAML file in ~/.config/dask, or {variable}) "
                         f"or remove it for the default, {default:g}")
    return value
