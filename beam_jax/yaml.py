"""What Beam YAML pipelines use: the transforms ``pipelines/beam_jax_provider.yaml`` lists,
and the pieces a YAML transform of one's own needs to read rows with their origin and to
report failed rows as Beam YAML's ``error_handling`` does.

``ReadRowsWithOrigin`` reads Parquet or JSON-lines files as rows with their file and row;
``RunKernelOnRows`` runs any kernel on rows configured by plain YAML values. A transform of
one's own reads a row's origin with ``OriginFields`` and turns its failures into Beam
YAML's error rows with ``YamlErrors`` and ``error_output`` (``pipelines/embed_yaml.py`` is
one). The listing's ``WriteDeadLetters`` is ``beam_jax.jobs.WriteDeadLetters``.

Example:
    >>> from beam_jax.yaml import RunKernelOnRows
    >>> step = RunKernelOnRows(  # doctest: +SKIP
    ...     kernel="my_package.kernels.norm",
    ...     fields={"x": {"shape": ["L"], "dtype": "float32"}},
    ...     boundaries={"L": [16, 64]})
"""

from beam_jax._src.inference.rows import RunKernelOnRows as RunKernelOnRows
from beam_jax._src.inference.rows import YamlErrors as YamlErrors
from beam_jax._src.inference.rows import error_output as error_output
from beam_jax._src.transforms.read_with_origin import OriginFields as OriginFields
from beam_jax._src.transforms.read_with_origin import ReadRowsWithOrigin as ReadRowsWithOrigin

__all__ = ["OriginFields", "ReadRowsWithOrigin", "RunKernelOnRows", "YamlErrors", "error_output"]
