"""What JAX will run on in this process, known without opening a device.

Opening a TPU takes seconds, and until it is open ``jax.devices()`` blocks. A launch asks
what it runs on to choose its defaults long before it needs the device; :func:`local_platform`
answers from what is already known, while the device opens in the background:

1. JAX's backends, where they are already open (free);
2. ``JAX_PLATFORMS`` / ``jax_platforms``, where it names the platform JAX will take first;
3. the TPU chips on this machine's PCI bus (the same reading JAX's own TPU set-up makes),
   as many as libtpu's variables let this process open, where ``libtpu`` is installed;
4. otherwise JAX's backends, opened here (CPUs open in milliseconds; a GPU where the TPU
   reading found nothing).

:func:`open_local_devices` opens them on a thread of their own.
"""

from __future__ import annotations

import dataclasses
import glob
import importlib.util
import math
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from beam_jax._src.compat.jax import backends_opened
from beam_jax._src.errors import DeviceUnavailableError

__all__ = [
    "TPU_HOST_BUFFER_BYTES",
    "LocalPlatform",
    "check_no_tpu_left_behind",
    "local_platform",
    "open_local_devices",
    "size_tpu_host_buffer",
    "tpu_host_buffer_advice",
    "tpu_to_open",
]

_GOOGLE_PCI_VENDOR = "0x1ae0"
# TPU chips by PCI device id: name, JAX devices per chip (v2 and v3 show two cores a chip).
_TPU_CHIPS = {
    "0x0027": ("TPU v3", 2),
    "0x005e": ("TPU v4", 1),
    "0x0062": ("TPU v5p", 1),
    "0x0063": ("TPU v5 lite", 1),
    "0x006f": ("TPU v6 lite", 1),
    "0x0076": ("TPU7x", 1),
}
_PCI_DEVICES = "/sys/bus/pci/devices"
# What libtpu reads to open a subset of the host's chips in this process.
_CHIPS_PER_PROCESS = "TPU_CHIPS_PER_PROCESS_BOUNDS"
_VISIBLE_CHIPS = "TPU_VISIBLE_CHIPS"

# The host buffer a TPU runtime maps for its transfers as it opens: beam_jax's, libtpu's.
TPU_HOST_BUFFER_BYTES = 256 * 2**20
_LIBTPU_HOST_BUFFER_BYTES = 4 * 2**30
_HOST_BUFFER = "TPU_PREMAPPED_BUFFER_SIZE"
_HOST_BUFFER_THRESHOLD = "TPU_PREMAPPED_BUFFER_TRANSFER_THRESHOLD_BYTES"


@dataclasses.dataclass(frozen=True)
class LocalPlatform:
    """The platform JAX's default backend is (or will be) in this process.

    Attributes:
        platform: ``"cpu"``, ``"gpu"`` or ``"tpu"``.
        device_count: its local devices.
        kind: the device kind, as ``jax.Device.device_kind`` names it where known.
        opened: whether this was read from JAX's open backends (``False``: from the
            environment or the PCI bus, the device not yet opened).
    """

    platform: str
    device_count: int
    kind: str
    opened: bool

    def __post_init__(self):
        if self.platform not in ("cpu", "gpu", "tpu"):
            raise ValueError(
                f"platform must be 'cpu', 'gpu' or 'tpu', got {self.platform!r}; JAX names "
                "CUDA and ROCm devices 'gpu'."
            )
        if self.device_count < 1:
            raise ValueError(f"device_count must be >= 1, got {self.device_count}")

    @property
    def accelerator(self) -> bool:
        """Whether the default backend is an accelerator (not the CPU)."""
        return self.platform != "cpu"


def local_platform() -> LocalPlatform:
    """This process's default JAX platform, without opening a TPU that is not yet open
    (the readings: the module's description). A TPU on the PCI bus counts only where
    ``JAX_PLATFORMS`` is unset, empty or names ``tpu`` first, and ``libtpu`` is installed.
    """
    opened = _from_open_backends()
    if opened is not None:
        return opened
    tpu = tpu_to_open()
    return tpu if tpu is not None else _open()


def open_local_devices() -> threading.Thread:
    """Start opening this process's JAX devices on a thread of their own; returns it.

    A job whose workers run in its own process calls it first thing, so the devices open
    while the launch loads the model and builds its graph. An error while opening surfaces
    where the devices are used. The thread is not a daemon, so a launch that fails meanwhile
    exits after the opening ends. The TPU's host buffer is sized first
    (:func:`size_tpu_host_buffer`).

    Example:
        >>> open_local_devices().join()
    """
    size_tpu_host_buffer()  # here, not on the thread: before anything else can open them
    thread = threading.Thread(target=_open_quietly, name="beam_jax-open-devices")
    thread.start()
    return thread


def size_tpu_host_buffer(nbytes: int = TPU_HOST_BUFFER_BYTES) -> int | None:
    """Size the host buffer a TPU maps for its transfers when it opens, unless already sized.

    libtpu maps a 4 GiB host buffer for transfers as a TPU opens; without transparent
    hugepages that mapping is most of the opening and of the exit (``bench/RESULTS.md``). A
    transfer larger than the buffer runs far slower, outside it.

    This sets ``TPU_PREMAPPED_BUFFER_SIZE`` and ``TPU_PREMAPPED_BUFFER_TRANSFER_THRESHOLD_BYTES``
    to ``nbytes`` where the environment sets neither (a size already set is kept). libtpu
    reads them once, when the TPU opens: call this before (beam_jax does, where it opens
    devices itself). Other platforms ignore them.

    Args:
        nbytes: the buffer's size in bytes, at least 1 MiB.

    Returns:
        The size the environment now gives the TPU's next opening, or ``None`` where it
        leaves the size to libtpu (only a threshold was set).

    Raises:
        ValueError: ``nbytes`` is not an integer of at least 1 MiB.

    Example:
        >>> size_tpu_host_buffer() == int(os.environ["TPU_PREMAPPED_BUFFER_SIZE"])
        True
    """
    if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 2**20:
        raise ValueError(
            f"nbytes must be an integer of at least 1 MiB ({2**20}), got {nbytes!r}; the "
            f"default, {TPU_HOST_BUFFER_BYTES} (256 MiB), covers the transfers of batches "
            "up to that size."
        )
    if _HOST_BUFFER not in os.environ and _HOST_BUFFER_THRESHOLD not in os.environ:
        os.environ[_HOST_BUFFER] = os.environ[_HOST_BUFFER_THRESHOLD] = str(nbytes)
    return _host_buffer_in_env()


def _host_buffer_in_env() -> int | None:
    """The buffer size the environment gives the TPU's opening, or ``None`` (libtpu's)."""
    size = os.environ.get(_HOST_BUFFER, "").strip()
    return int(size) if size.isdigit() else None


def tpu_host_buffer_advice(largest_transfer: int) -> str | None:
    """What to do where one transfer to a TPU outgrows the host buffer it opens with.

    Args:
        largest_transfer: the bytes of the largest array moved to one device at once (one
            leaf of the largest padded batch, over the devices it is split across).

    Returns:
        ``None`` where the buffer the environment gives the TPU (else libtpu's 4 GiB) holds
        it; otherwise a message with both sizes, what it costs and how to fix it.
    """
    buffer = _host_buffer_in_env()
    buffer = _LIBTPU_HOST_BUFFER_BYTES if buffer is None else buffer
    if largest_transfer <= buffer:
        return None
    mib = 2**20
    return (
        f"one batch moves an array of {largest_transfer / mib:,.0f} MiB to a TPU, larger than "
        f"the TPU's host buffer ({_HOST_BUFFER}={buffer} bytes, {buffer / mib:,.0f} MiB): "
        "transfers larger than the buffer run about 20x slower. Set "
        f"{_HOST_BUFFER} and {_HOST_BUFFER_THRESHOLD} to at least {largest_transfer} in the "
        "worker's environment, before its TPU opens, or make the batches smaller "
        "(Bucketing(batch_size=..., max_padded_size=...))."
    )


def tpu_to_open() -> LocalPlatform | None:
    """The TPU chips this process may open where JAX would take them (``JAX_PLATFORMS``
    unset, or naming ``tpu`` first), read off the PCI bus without opening anything;
    ``None`` elsewhere."""
    if _first_platform_asked() not in (None, "tpu"):
        return None
    return _tpu_on_pci_bus()


def check_no_tpu_left_behind(devices: Sequence[Any]) -> None:
    """Raise where JAX's default backend gave ``devices`` on the CPU while this process may
    open TPU chips (``JAX_PLATFORMS`` unset, or naming ``tpu`` first).

    A TPU opens in one process at a time. Where another holds it (a second worker process
    on the host: ``multi_processing``, Dask workers), JAX warns that it is "falling back
    to cpu" and runs everything there, many times slower. A worker refuses those devices.

    Raises:
        DeviceUnavailableError: the chips, where they are and how to go on.
    """
    if any(d.platform != "cpu" for d in devices):
        return
    tpu = tpu_to_open()
    if tpu is None:
        return
    raise DeviceUnavailableError(
        f"JAX opened only the CPU, but this machine has {tpu.device_count} {tpu.kind} "
        "device(s) this process may open: another process most likely holds them (a TPU "
        "opens in one process at a time), else JAX's TPU backend failed to start (its "
        "warning above says why). Run one worker process per TPU host: on the local "
        "runners, --direct_num_workers=N without --direct_running_mode=multi_processing "
        "runs N bundles in threads that share the chips. Or give each process its own chips "
        "(TPU_VISIBLE_CHIPS and TPU_CHIPS_PER_PROCESS_BOUNDS), or set JAX_PLATFORMS=cpu "
        "(or devices='cpu') to run on the CPU on purpose."
    )


def _open_quietly() -> None:
    import jax

    try:
        jax.local_devices()
    except Exception:  # noqa: BLE001 - raised again where the devices are used
        pass


def _from_open_backends() -> LocalPlatform | None:
    # Asked while JAX opens its backends (seconds on a TPU): answered without them.
    return _open() if backends_opened() else None


def _open() -> LocalPlatform:
    import jax

    devices = jax.local_devices()
    platform = "gpu" if devices[0].platform in ("cuda", "rocm") else devices[0].platform
    return LocalPlatform(
        platform=platform,
        device_count=len(devices),
        kind=str(getattr(devices[0], "device_kind", platform)),
        opened=True,
    )


def _first_platform_asked() -> str | None:
    """The first platform ``jax.config.jax_platforms`` (``JAX_PLATFORMS``) names, or
    ``None`` where JAX chooses."""
    import jax

    return _first_of(jax.config.jax_platforms or os.environ.get("JAX_PLATFORMS") or "")


def _first_of(platforms: str) -> str | None:
    """``"tpu,cpu"`` -> ``"tpu"``; CUDA and ROCm are ``"gpu"``; ``""`` -> ``None``."""
    names = [p.strip().lower() for p in platforms.split(",") if p.strip()]
    if not names:
        return None
    return {"cuda": "gpu", "rocm": "gpu"}.get(names[0], names[0])


def _tpu_on_pci_bus(root: str = _PCI_DEVICES, dev: str = "/dev") -> LocalPlatform | None:
    """The TPU chips on the PCI bus that this process opens, where ``libtpu`` is installed;
    ``None`` where there are none.

    JAX's TPU set-up counts the chips on the bus; a host whose chips are shared out among
    processes or containers gives each only some of them to open: a chip counts where this
    process may open its device node (``/dev/vfio/GROUP`` of a v5e or later, ``/dev/accelN``
    before) or the host shows none, and ``TPU_CHIPS_PER_PROCESS_BOUNDS`` or
    ``TPU_VISIBLE_CHIPS`` limit them further.
    """
    if importlib.util.find_spec("libtpu") is None:
        return None
    chips: list[tuple[str, int]] = []
    for vendor in glob.glob(os.path.join(root, "*", "vendor")):
        try:
            if Path(vendor).read_text().strip() != _GOOGLE_PCI_VENDOR:
                continue
            device = Path(vendor).with_name("device").read_text().strip()
        except OSError:
            continue
        if device in _TPU_CHIPS and _may_open(Path(vendor).parent, Path(dev)):
            chips.append(_TPU_CHIPS[device])
    if not chips:
        return None
    kind, per_chip = chips[0]
    count = _visible_chips(len(chips))
    return LocalPlatform("tpu", device_count=per_chip * count, kind=kind, opened=False)


def _may_open(chip: Path, dev: Path) -> bool:
    """Whether this process may open the chip at PCI address ``chip``: read and write its
    accel node (a chip its accel driver holds), else its VFIO group's node; ``True`` where
    the host shows neither."""
    accel = chip / "accel"
    if accel.is_dir():
        return any(os.access(dev / name, os.R_OK | os.W_OK) for name in os.listdir(accel))
    group, vfio = chip / "iommu_group", dev / "vfio"
    if group.exists() and vfio.is_dir():
        return os.access(vfio / Path(os.path.realpath(group)).name, os.R_OK | os.W_OK)
    return True


def _visible_chips(on_bus: int) -> int:
    """Of the ``on_bus`` chips, those libtpu opens in this process: the product of
    ``TPU_CHIPS_PER_PROCESS_BOUNDS`` (``"1,1,1"``: one chip), else as many as
    ``TPU_VISIBLE_CHIPS`` lists, else all of them (a host shared by several processes
    gives each a subset so)."""
    bounds = os.environ.get(_CHIPS_PER_PROCESS, "").replace(" ", "")
    if bounds and all(b.isdigit() for b in bounds.split(",")):
        return max(1, min(on_bus, math.prod(int(b) for b in bounds.split(","))))
    visible = [c for c in os.environ.get(_VISIBLE_CHIPS, "").split(",") if c.strip()]
    return max(1, min(on_bus, len(visible))) if visible else on_bus
