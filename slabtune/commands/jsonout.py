"""JSON for ``--json`` output: always valid JSON.

Python's ``json`` writes NaN and infinities as the bare words ``NaN`` and ``Infinity``,
which no strict JSON parser reads.  Every ``--json`` of the CLI goes through :func:`dumps`,
which writes a non-finite number as ``null`` (:data:`NON_FINITE_HELP` says so in --help).
"""

from __future__ import annotations

import json
import math
from typing import Any

#: The sentence every ``--json`` help text ends with.
NON_FINITE_HELP = "a number that is NaN or infinite prints as null"


def finite_or_none(obj: Any) -> Any:
    """``obj`` with every non-finite float (also numpy scalars and arrays) replaced by None,
    through dicts, lists and tuples."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite_or_none(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite_or_none(v) for v in obj]
    if hasattr(obj, "tolist") and hasattr(obj, "dtype"):   # numpy scalar or array
        return finite_or_none(obj.tolist())
    return obj


def dumps(obj: Any, **kwargs) -> str:
    """``json.dumps`` that never writes ``NaN``/``Infinity``: they become ``null``.  Objects
    json cannot encode go through ``default`` (as with ``json.dumps``) and are mapped too."""
    default = kwargs.pop("default", None)
    if default is not None:
        kwargs["default"] = lambda o: finite_or_none(default(o))
    return json.dumps(finite_or_none(obj), allow_nan=False, **kwargs)
