"""JSON from outside the program (data files, request bodies): every failure is a `ValueError`.

`json.loads` raises `RecursionError` on deeply nested input (`[` x 100,000) and a plain
`ValueError` on an integer of more than 4,300 digits; callers that report bad input by catching
`ValueError` (and name the file and line, or answer 400) get both through `loads` below.
"""

from __future__ import annotations

import json
from typing import Any


class JSONInputError(ValueError):
    """Text that is not JSON this program can read, with a short reason."""


def loads(text: str | bytes) -> Any:
    """`json.loads`, with nesting too deep and numbers too long raised as `JSONInputError`."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        where = f"column {err.colno}" if err.lineno == 1 else f"line {err.lineno} column {err.colno}"
        raise JSONInputError(f"{err.msg} at {where}") from None
    except RecursionError:
        raise JSONInputError("nested too deeply") from None
    except ValueError as err:  # e.g. an integer longer than sys.get_int_max_str_digits()
        raise JSONInputError(str(err).split(";")[0]) from None
