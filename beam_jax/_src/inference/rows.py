"""RunKernelOnRows: ``RunKernel`` on schema'd rows, configured by plain values (Beam YAML).

``RunKernelOnRows`` takes the kernel by its dotted name and the element spec as field
shapes, turns each row's fields into arrays, runs them through ``RunKernel``, and emits rows
of the key field and the output as a flat list of floats. Failed rows follow Beam YAML's
error handling: with ``error_handling: {output: NAME}`` each is one ``(element, msg, stack,
dead_letter)`` row on ``NAME`` (``dead_letter`` the ``FailedElement``'s JSON line); without
it the pipeline fails. Rows read by ``ReadRowsWithOrigin`` give their dead letters that file
and row.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import apache_beam as beam
import numpy as np
from apache_beam.typehints.row_type import RowTypeConstraint

from beam_jax._src.bucketing.buckets import Bucketing
from beam_jax._src.core.dead_letter import FailedElement
from beam_jax._src.core.spec import ArraySpec
from beam_jax._src.errors import InvalidElementError, SpecError
from beam_jax._src.kernel.params import read_params
from beam_jax._src.transforms.read_with_origin import OriginFields
from beam_jax._src.transforms.run_kernel import RunKernel


def load_callable(name: str, what: str) -> Callable[..., Any]:
    """The function ``module.attribute`` names."""
    module, _, attribute = str(name).rpartition(".")
    try:
        fn = getattr(importlib.import_module(module), attribute)
    except (ImportError, AttributeError, ValueError) as e:
        raise SpecError(
            f"{what} {name!r} is not an importable 'module.function' ({type(e).__name__}: {e});"
            " install the module where the pipeline runs, or fix the name."
        ) from e
    if not callable(fn):
        raise SpecError(f"{what} {name!r} names {fn!r}, which is not callable.")
    return fn


def _field_spec(name: str, config: Any) -> ArraySpec:
    if not isinstance(config, Mapping) or "shape" not in config:
        raise SpecError(
            f"field {name!r} needs a mapping with a shape, e.g. {{shape: [L, 64], dtype: "
            f"float32}}; got {config!r}."
        )
    return ArraySpec(tuple(config["shape"]), config.get("dtype", "float32"))


def _element(row: Any, specs: Mapping[str, ArraySpec]) -> dict[str, Any]:
    """A row's fields as arrays; a flat list (as Parquet stores ``list<float>``) is reshaped
    to the spec when it has at most one ragged axis. A field that does not convert is
    passed on as it is, for RunKernel's validation to reject with its message."""
    element = {}
    for name, spec in specs.items():
        value = getattr(row, name, None)
        try:
            array = np.asarray(value, spec.dtype)
            if array.ndim == 1 and len(spec.shape) > 1 and len(spec.ragged_axes) <= 1:
                array = array.reshape(tuple(-1 if isinstance(d, str) else d for d in spec.shape))
            value = array
        except (TypeError, ValueError):
            pass
        element[name] = value
    return element


def _keyed(
    row: Any, key_field: str, specs, origin: OriginFields | None
) -> tuple[Any, dict[str, np.ndarray]]:
    """``(key, element)``; with ``origin``, the key is ``(key, file, row in file)`` so that
    a dead letter can say where its row was read (:func:`_filed_by_origin`)."""
    key = getattr(row, key_field, None)
    if origin is not None:
        key = (key, *origin.of(row))
    return key, _element(row, specs)


def _filed_by_origin(record: FailedElement) -> FailedElement:
    """A dead letter keyed ``(key, file, row)`` by :func:`_keyed`, filed under the row's
    key, file and row. A key JSON cannot hold (bytes, say) made the triple a stand-in
    (``key_type``): the record is then kept as it is, the triple's text in its key."""
    if record.key_type is None and isinstance(record.key, tuple) and len(record.key) == 3:
        key, source, row = record.key
        return record.with_origin(key=key, source=source, row=row)
    return record


def _output_row(
    pair: tuple[Any, Any], key_field: str, output_field: str, with_origin: bool = False
) -> beam.Row:
    key, output = pair
    if with_origin:
        key = key[0]
    values = np.asarray(output, np.float64).reshape(-1).tolist()
    return beam.Row(**{key_field: key, output_field: values})


def _error_row(describe_element: Callable[[FailedElement], Any], record: FailedElement):
    return beam.Row(
        element=describe_element(record),
        msg=f"[{record.stage}] {record.error_type}: {record.message} (key {record.key!r})",
        stack=record.traceback,
        dead_letter=record.to_json(),
    )


def error_output(error_handling: Mapping[str, Any] | None) -> str | None:
    """The output a YAML transform's ``error_handling`` config names, ``None`` without one.

    Raises:
        SpecError: ``error_handling`` is given but names no output.
    """
    if error_handling is None:
        return None
    if not isinstance(error_handling, Mapping) or "output" not in error_handling:
        raise SpecError(
            f"error_handling must name an output, e.g. {{output: failed}}; got {error_handling!r}."
        )
    return error_handling["output"]


def _fail(record: FailedElement) -> None:
    raise InvalidElementError(
        f"row {record.key!r} failed at stage {record.stage!r} ({record.error_type}: "
        f"{record.message}); add `error_handling: {{output: failed}}` to the transform's "
        "config to send such rows to an output instead of failing the pipeline."
    )


def _element_text(record: FailedElement) -> str:
    return str(record.element)


class YamlErrors(beam.PTransform):
    """Beam YAML's error handling of dead letters, for every YAML transform of beam_jax
    and of pipelines built on it: without an error output, the first dead letter fails the
    pipeline (naming the row and how to route it); with one, each becomes an
    ``(element, msg, stack, dead_letter)`` row: Beam YAML's three fields, ``msg`` being
    ``"[stage] ErrorType: message (key K)"``, and the ``FailedElement`` as its dead-letter
    JSON line (``beam_jax.jobs.WriteDeadLetters`` writes such rows as dead-letter files).

    Args:
        error_output: the ``error_handling`` output's name, or ``None``.
        element: the ``element`` field of a record's row (default its bounded echo).
        element_type: that field's type, for the rows' schema.
    """

    def __init__(
        self,
        error_output: str | None,
        element: Callable[[FailedElement], Any] = _element_text,
        element_type: Any = str,
    ):
        super().__init__()
        self._error_output = error_output
        self._element = element
        self._element_type = element_type

    def expand(self, dead):
        if self._error_output is None:
            _ = dead | "FailOnError" >> beam.Map(_fail)
            return None
        schema = RowTypeConstraint.from_fields(
            [("element", self._element_type), ("msg", str), ("stack", str), ("dead_letter", str)]
        )
        return dead | "ErrorRows" >> beam.Map(
            functools.partial(_error_row, self._element)
        ).with_output_types(schema)


class RunKernelOnRows(beam.PTransform):
    """``RunKernel`` for Beam YAML: rows in, ``(key, output)`` rows out.

    Example (YAML)::

        - type: RunKernelOnRows
          config:
            kernel: mypackage.kernels.mean_pool
            fields: {x: {shape: [L, 64], dtype: float32}}
            boundaries: {L: [32, 128, 512]}
            params_path: gs://bucket/params.safetensors

    Args:
        kernel: ``module.function`` of the kernel, ``fn(params, element, lengths)`` where
            ``element`` maps each field to its padded array.
        fields: per input field, its ``shape`` (ints and ragged-axis names) and ``dtype``.
        boundaries: per ragged axis, its bucket boundaries.
        batch_size: the most elements in one batch.
        key_field: the field that identifies a row; it is copied to the output row.
        output_field: the name of the output field (the output flattened to floats).
        params_path: a ``.safetensors`` or ``.npz`` parameter file, read once per worker.
        precompile: compile every listed shape when a worker starts.
        error_handling: Beam YAML's ``{output: NAME}``.
        source_field: the field naming each row's file, as ``ReadRowsWithOrigin`` gives
            it (with ``row_field``, a dead letter's ``source`` and ``row``); ``None``: none.
        row_field: the field holding each row's index in its file.
    """

    def __init__(
        self,
        kernel: str,
        fields: Mapping[str, Mapping[str, Any]],
        boundaries: Mapping[str, Sequence[int]],
        batch_size: int = 32,
        key_field: str = "id",
        output_field: str = "output",
        params_path: str | None = None,
        precompile: bool = False,
        error_handling: Mapping[str, Any] | None = None,
        source_field: str | None = "source",
        row_field: str = "row",
    ):
        super().__init__()
        if not isinstance(fields, Mapping) or not fields:
            raise SpecError(f"fields must map field names to shapes, got {fields!r}.")
        self._specs = {name: _field_spec(name, c) for name, c in fields.items()}
        self._run = RunKernel(
            load_callable(kernel, "kernel"),
            spec=self._specs,
            keyed=True,
            bucketing=Bucketing(
                boundaries={k: tuple(v) for k, v in boundaries.items()}, batch_size=batch_size
            ),
            load_params=None
            if params_path is None
            else functools.partial(read_params, params_path),
            precompile=precompile,
        ).with_exception_handling()
        self._key_field = key_field
        self._output_field = output_field
        self._error_output = error_output(error_handling)
        self._origin = None if source_field is None else OriginFields(source_field, row_field)

    def plan(self, num_devices: int = 1):
        """The batching plan (``plan().shapes()`` lists every shape the kernel compiles)."""
        return self._run.plan(num_devices)

    def expand(self, rows):
        key_type = Any
        if isinstance(rows.element_type, RowTypeConstraint):
            key_type = dict(rows.element_type._fields).get(self._key_field, Any)
        origin = self._origin
        if origin is not None and not origin.carried_by(rows.element_type):
            origin = None
        pairs = rows | "ToArrays" >> beam.Map(_keyed, self._key_field, self._specs, origin)
        results, dead = pairs | "RunKernel" >> self._run
        schema = RowTypeConstraint.from_fields(
            [(self._key_field, key_type), (self._output_field, list[float])]
        )
        good = results | "ToRows" >> beam.Map(
            _output_row, self._key_field, self._output_field, origin is not None
        ).with_output_types(schema)
        if origin is not None:
            dead = dead | "FiledByOrigin" >> beam.Map(_filed_by_origin).with_output_types(
                FailedElement
            )
        bad = dead | "Errors" >> YamlErrors(self._error_output)
        return good if bad is None else {"output": good, self._error_output: bad}
