"""Stored records served as JSON by the control API, whatever an old row holds.

A row written before the input boundary was strict may hold what JSON cannot carry (a lone
surrogate in a task or a group, a reward of inf). Failing to serialize it would fail that read and
every later one, so such values leave as visible ``placeholders`` instead.
"""

from __future__ import annotations

import json
import math
from typing import Any

from starlette.responses import Response

from harnessrl.store.codecs import json_safe


def _non_finite_text(value: float) -> str:
    return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")


def placeholders(value: Any) -> Any:
    """``value`` with what JSON cannot carry made visible: a lone surrogate becomes U+FFFD, a
    non-finite float the string ``"NaN"``, ``"Infinity"`` or ``"-Infinity"`` (which pydantic reads
    back as the float)."""
    return json_safe(value, _non_finite_text)


def stored_json(content: Any, status_code: int = 200) -> Response:
    """Stored records as JSON, as ``JSONResponse`` writes it. A row written before the boundary was
    strict may hold a lone surrogate (a task, a group) or a reward of inf; JSON cannot carry those,
    and failing would fail this read and every later one, so they leave as ``placeholders``."""
    try:
        text = json.dumps(content, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
        body = text.encode("utf-8")
    except ValueError:  # a non-finite float; UnicodeEncodeError (a lone surrogate) is a ValueError
        body = json.dumps(placeholders(content), ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    return Response(body, status_code=status_code, media_type="application/json")
