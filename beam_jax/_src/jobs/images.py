"""The worker image's Beam against the launching SDK's: a mismatch refused before staging.

Beam runs a job only when the SDK that builds it and the SDK in the workers' image are the
same version; a mismatch shows only once workers start (or as wrong behaviour), after they
are paid for. :func:`beam_version_mismatch` reads the image's Beam from what names it (a
Beam SDK image's tag, a tag that says ``beam2.78.0``, or the project's own image, built from
``docker/Dockerfile`` on the Beam that ``requirements/lock.txt`` locks) and says what is
wrong, before anything is staged.

Example:
    >>> image_beam_version("apache/beam_python3.11_sdk:2.77.0")
    '2.77.0'
    >>> image_beam_version("europe-docker.pkg.dev/p/r/my-worker:1.4-beam2.78.0")
    '2.78.0'
    >>> image_beam_version("gcr.io/p/something-else:latest") is None
    True
"""

from __future__ import annotations

import re

import apache_beam
from apache_beam.options.pipeline_options import PipelineOptions, PortableOptions, WorkerOptions

__all__ = [
    "ALLOW_MISMATCH_FLAG",
    "WORKER_IMAGE_BEAM",
    "beam_version_mismatch",
    "image_beam_version",
    "worker_image",
]

WORKER_IMAGE_BEAM = "2.78.0"
"""The Beam of the project's worker images (docker/Dockerfile*): the lock's, written here by
``tools/lock.py``; a test checks that the three agree."""

ALLOW_MISMATCH_FLAG = "--allow_beam_version_mismatch"
_SDK_IMAGE = re.compile(r"(?:^|/)beam_python\d+\.\d+_sdk$")
_TAGGED = re.compile(r"beam[-_]?v?(\d+\.\d+\.\d+)")
_PROJECT_IMAGE = re.compile(r"beam[-_]jax")


def image_beam_version(image: str) -> str | None:
    """The Beam version of the SDK in ``image``, where its name says it; else ``None``.

    A Beam SDK image (``.../beam_python3.11_sdk:2.78.0``) says it in its tag; any image may
    say it in its tag as ``beam2.78.0`` (``beam-2.78.0``, ``beam_2.78.0``); an image named
    ``beam-jax...`` (or ``beam_jax...``) without it is the project's, built from this tree's
    ``docker/Dockerfile``, on :data:`WORKER_IMAGE_BEAM`.
    """
    name, tag = image, ""
    last = image.rsplit("/", 1)[-1]
    if "@" in last:  # a digest names no version
        name, last = image.split("@", 1)[0], last.split("@", 1)[0]
    if ":" in last:
        name, tag = image[: image.rindex(":")], last.rsplit(":", 1)[1]
    if _SDK_IMAGE.search(name) and re.fullmatch(r"\d+\.\d+\.\d+", tag):
        return tag
    tagged = _TAGGED.search(tag)
    if tagged:
        return tagged[1]
    if _PROJECT_IMAGE.search(name.rsplit("/", 1)[-1]):
        return WORKER_IMAGE_BEAM
    return None


def worker_image(options: PipelineOptions) -> str | None:
    """The container image a job's workers run, as its options name it (``None``: the
    runner's default, which matches the SDK)."""
    image = options.view_as(WorkerOptions).sdk_container_image
    portable = options.view_as(PortableOptions)
    if image is None and (portable.environment_type or "").upper() == "DOCKER":
        image = portable.environment_config or portable.lookup_environment_option(
            "docker_container_image"
        )
    return image or None


def beam_version_mismatch(
    options: PipelineOptions, sdk_version: str = apache_beam.__version__
) -> str | None:
    """Why the job's workers would run another Beam than ``sdk_version``, or ``None``.

    Returns:
        A message naming both versions and the fixes, where the image's Beam is known and
        differs; ``None`` otherwise (no image given, the same version, or a name that says
        no version).
    """
    image = worker_image(options)
    if image is None:
        return None
    theirs = image_beam_version(image)
    if theirs is None or theirs == sdk_version:
        return None
    return (
        f"the job would be built with Beam {sdk_version} (the apache-beam installed here) and "
        f"run on workers whose image {image!r} holds Beam {theirs}; Beam needs the two to be "
        f"the same version. Install apache-beam=={theirs} here, or build the image on Beam "
        f"{sdk_version} (docker/Dockerfile installs what requirements/lock.txt locks; `make "
        f"upgrade` moves both), or pass {ALLOW_MISMATCH_FLAG} if the image holds another SDK "
        "than its name says"
    )
