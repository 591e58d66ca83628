"""The exceptions beam_jax raises; each says how to fix what went wrong."""

from __future__ import annotations


class BeamJaxError(Exception):
    """Base class of every error raised by beam_jax.

    Catch it to handle any beam_jax failure; each subclass's documentation says how to fix
    the cause, and its message says what was received and what was expected.
    """


class SpecError(BeamJaxError, ValueError):
    """A configuration object (spec, bucketing, kernel options) is inconsistent.

    Raised at construction, before a pipeline runs. The message names the field, the value
    received and what would be accepted.
    """


class InvalidElementError(BeamJaxError, ValueError):
    """An input element does not match the declared element spec.

    With ``.with_exception_handling()`` the element goes to the dead letters with stage
    ``"validation"``; without it the bundle fails. Fix the data, or widen the spec (dtype,
    casting, bucket boundaries, ``oversize="truncate"``).
    """


class ElementTooLargeError(InvalidElementError):
    """A ragged axis is longer than the largest bucket boundary (with packing, the longest row).

    Add a larger boundary, or set ``Bucketing(oversize="truncate")`` to cut such elements to
    the largest bucket. With packing, add a longer row length, or cut such records first.
    """


class InputFileError(BeamJaxError, OSError):
    """An input file cannot be read: no file matches, or one is truncated, not in the
    expected format, or lacks a column read.

    The message names the file. Fix or remove it; with ``.with_exception_handling()`` on the
    reading transform, the file (or its unreadable part) becomes a dead letter instead.
    """


class InputLineError(InputFileError):
    """One line of a JSON-lines file is no row: not UTF-8, not JSON, not one object, or a
    field of another type. The rest of the file is read.

    The message names the line and the file. Fix the line; with
    ``.with_exception_handling()`` on the reading transform, it becomes that line's dead
    letter (``error_type`` ``"InputLineError"``) instead.
    """


class KernelError(BeamJaxError, RuntimeError):
    """The user's kernel failed on an element, or returned something unusable.

    The message carries the original error. Bisection has already isolated the element, so
    the rest of its batch produced results.
    """


class DeadLetterThresholdError(BeamJaxError, RuntimeError):
    """More elements failed than ``with_exception_handling(threshold=...)`` allows.

    Inspect the dead letters of a smaller run, fix the data or the kernel, or raise the
    threshold.
    """


class CompileError(KernelError):
    """A batch shape failed to trace or compile.

    The failure is cached per shape, so every element of that shape is dead-lettered with
    stage ``"compile"`` and this message, without compiling again. ``__cause__`` holds
    JAX's original error. Fix the kernel for that shape (often a shape-dependent branch or
    an axis the kernel assumed), or drop the bucket that triggers it.
    """


class DeviceUnavailableError(BeamJaxError, RuntimeError):
    """JAX opened only the CPU in a process that may open TPU chips: most often another
    process holds them (one process per TPU), else JAX's TPU backend failed to start.
    Raised where a worker would otherwise run its kernel on the CPU without a word.
    """


class InferenceBatchError(BeamJaxError, RuntimeError):
    """Elements of one ``RunInference`` batch failed in a beam_jax model handler.

    RunInference dead-letters whole batches: with its ``.with_exception_handling()`` the
    batch and this error go to ``failed_inferences``; without it the bundle fails. The
    error's ``failures`` holds one ``FailedElement`` per failing element (its ``key`` is the
    element's index in the batch), so the bad rows can be told from the good ones. For
    per-element dead letters with every good result kept, use ``RunKernel``.
    """

    def __init__(self, message: str, failures: tuple = (), batch_size: int = 0):
        super().__init__(message)
        self.failures = tuple(failures)
        self.batch_size = batch_size

    def __reduce__(self):
        return type(self), (str(self), self.failures, self.batch_size)
