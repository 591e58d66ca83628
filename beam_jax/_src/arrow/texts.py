"""A column of texts, whatever Arrow type holds them: ``string``, ``large_string``,
``binary`` or ``large_binary`` holding UTF-8, read alike as ``large_string``.

A Parquet writer may store texts as ``binary`` (no logical UTF-8 type); the jobs embed
them as they embed strings, so whatever measures texts (a launch plan's sample,
``beam-jax plan``) reads them the same way.

Example:
    >>> texts, invalid = utf8_texts(pa.array([b"caf\\xc3\\xa9", None, b"\\xff"], pa.binary()))
    >>> texts.to_pylist(), invalid
    (['café'], 1)
"""

from __future__ import annotations

import pyarrow as pa

__all__ = ["is_text_type", "utf8_texts"]


def is_text_type(kind: pa.DataType) -> bool:
    """Whether a column of ``kind`` can hold texts: a string or a binary type, or a
    dictionary of one (a pandas categorical written to Parquet)."""
    if pa.types.is_dictionary(kind):
        kind = kind.value_type
    return any(
        check(kind)
        for check in (
            pa.types.is_string,
            pa.types.is_large_string,
            pa.types.is_binary,
            pa.types.is_large_binary,
        )
    )


def utf8_texts(column: pa.Array | pa.ChunkedArray) -> tuple[pa.Array, int]:
    """The column's non-null values as a ``large_string`` array, and how many were left
    out for not being valid UTF-8 (a row the job dead-letters). Whole when every value is
    valid (Arrow checks the bytes, no Python string per value).

    Raises:
        TypeError: If the column holds neither strings nor bytes; the message names its type.
    """
    if not is_text_type(column.type):
        raise TypeError(f"expected a string or binary column of texts, got {column.type}")
    if pa.types.is_dictionary(column.type):
        column = column.cast(column.type.value_type)
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks() if column.num_chunks else pa.array([], column.type)
    values = column.drop_null()
    try:
        if pa.types.is_string(values.type) or pa.types.is_large_string(values.type):
            values = values.cast(pa.large_string())
            values.validate(full=True)  # pyarrow may have copied the bytes unchecked
            return values, 0
        return values.cast(pa.large_string()), 0  # the cast checks the UTF-8
    except pa.ArrowInvalid:
        pass
    raw = values.view(pa.large_binary() if _large(values.type) else pa.binary())
    texts = []
    for value in raw.to_pylist():
        try:
            texts.append(value.decode("utf-8"))
        except UnicodeDecodeError:
            continue
    return pa.array(texts, pa.large_string()), len(values) - len(texts)


def _large(kind: pa.DataType) -> bool:
    return pa.types.is_large_string(kind) or pa.types.is_large_binary(kind)
