"""The validation errors, worded once for the three validators (an element, a batch, columns).

Each builder takes ``where``: the place in the element the check failed, e.g.
``"at ['x']"`` for a pytree leaf or ``"row 3 (id 7), column 'x'"`` for a columnar row, and
returns the exception to raise or dead-letter.
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np

from beam_jax._src.errors import ElementTooLargeError, InvalidElementError


def cannot_cast(where: str, got: Any, want: Any, casting: str) -> InvalidElementError:
    got = np.dtype(got)
    if got.names is not None:
        fix = (
            f"It is a structured (record) array with fields {list(got.names)}: give each "
            "field its own leaf in the spec."
        )
    elif got.kind == "O":
        fix = (
            "It is an object array (e.g. of arrays or Python objects): stack its entries into "
            "one numeric array, e.g. np.stack(list(x))."
        )
    else:
        fix = "Convert the data, or loosen Validation(casting=...)."
    return InvalidElementError(
        f"{where}: dtype {got} cannot be cast to {want} under casting={casting!r}. {fix}"
    )


def axis_mismatch(
    axis: str, first_where: str, first_length: int, where: str, length: int
) -> InvalidElementError:
    return InvalidElementError(
        f"ragged axis {axis!r} has length {first_length} at {first_where} but {length} at "
        f"{where}; leaves that share an axis name must share its length."
    )


def empty_axis(axis: str, where: str) -> InvalidElementError:
    return InvalidElementError(
        f"ragged axis {axis!r} has length 0 at {where}; empty elements are rejected. Filter "
        "them out, or set Validation(allow_empty=True)."
    )


def too_long(axis: str, length: int, where: str, largest: int) -> ElementTooLargeError:
    return ElementTooLargeError(
        f"ragged axis {axis!r} has length {length} at {where}, which exceeds the largest "
        f"bucket ({largest}); add a larger boundary or set Bucketing(oversize='truncate')."
    )


def too_long_to_pack(axis: str, length: int, where: str, largest: int) -> ElementTooLargeError:
    """``too_long`` under packing, which has no buckets and never truncates."""
    return ElementTooLargeError(
        f"ragged axis {axis!r} has length {length} at {where}, which exceeds the longest "
        f"packed row ({largest}); add a row length of at least {length} to "
        "Packing(row_lengths=...) (with plan_packing, raise max_size), or cut such records "
        "before the transform: packing does not truncate."
    )


def nonfinite(where: str) -> InvalidElementError:
    return InvalidElementError(
        f"{where}: received NaN or Inf values; expected finite inputs because "
        "Validation(nonfinite='reject'). Clean the data or set nonfinite='pass'."
    )


def does_not_fit(where: str, lost: np.ndarray | None, want: Any) -> InvalidElementError:
    """Values (``lost``, when known) that casting to ``want`` would wrap or overflow."""
    want = np.dtype(want)
    info = np.iinfo(want) if want.kind in "iu" else ml_dtypes.finfo(want)
    number = str if want.kind in "iu" else "{:g}".format
    if lost is None or lost.min() != lost.max():
        # str, as f"{x}" prints a float32 3.4e+38 as 3.3999999521443642e+38
        shown = "" if lost is None else f" from {lost.min()!s} to {lost.max()!s}"
        received, them = f"values{shown}", "them"
    else:
        received, them = f"the value {lost.min()!s}", "it"
    if want.kind in "iu":
        effect = f"wrap {them} around"
    else:
        with np.errstate(all="ignore"):  # float8_e4m3fn has no infinity: it overflows to NaN
            infinite = np.isinf(np.array(np.inf).astype(want).astype(np.float32))
        effect = f"make {them} {'infinite' if infinite else 'NaN'}"
    return InvalidElementError(
        f"{where}: received {received}, outside {want}'s range ({number(info.min)} to "
        f"{number(info.max)}); a cast to {want} would {effect}. Fix the data, or give the "
        "spec a wider dtype."
    )


def out_of_range(where: str, low: Any, high: Any, seen: tuple | None = None) -> InvalidElementError:
    received = f", received values from {seen[0]} to {seen[1]}" if seen else ""
    return InvalidElementError(
        f"{where}: values must lie in [{low}, {high}){received}; clip or fix them (e.g. map "
        "unknown token ids to the [UNK] id) before the kernel."
    )


def too_many_bytes(where: str, nbytes: int, limit: int) -> InvalidElementError:
    return InvalidElementError(
        f"{where}: element is {nbytes} bytes, more than max_element_bytes={limit}; split the "
        "record or raise the limit."
    )


def hidden_semantics(where: str, value: Any, why: str, fix: str) -> InvalidElementError:
    return InvalidElementError(
        f"{where}: received a {type(value).__module__}.{type(value).__qualname__}, {why}; "
        f"beam_jax does not guess what it means. {fix}"
    )
