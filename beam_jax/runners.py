"""Runners for beam_jax's transforms and jobs where Beam's own lack something they need.

``DaskRunner`` runs a pipeline on a ``dask.distributed`` cluster: Beam's DaskRunner with the
gaps docs/runners.md lists filled (every sink computed, multi-output steps, metrics, DoFns
set up once per worker process) and what it cannot run refused at launch
(``UnsupportedOnDaskError``). It needs the ``[dask]`` extra: ``pip install 'beam_jax[dask]'``.

Example:
    >>> options = PipelineOptions([  # doctest: +SKIP
    ...     "--runner=beam_jax.runners.DaskRunner",
    ...     "--dask_client_address=tcp://127.0.0.1:8786"])
"""

try:
    from dask import distributed as _distributed  # noqa: F401
except ImportError as e:  # pragma: no cover - the [dask] extra is part of the dev install
    raise ImportError(
        f"beam_jax.runners needs Dask ({e}); install it with: pip install 'beam_jax[dask]'"
    ) from e

from beam_jax._src.runners.dask_refusals import UnsupportedOnDaskError as UnsupportedOnDaskError
from beam_jax._src.runners.dask_runner import DaskJobResult as DaskJobResult
from beam_jax._src.runners.dask_runner import DaskRunner as DaskRunner

__all__ = [
    "DaskJobResult",
    "DaskRunner",
    "UnsupportedOnDaskError",
]
