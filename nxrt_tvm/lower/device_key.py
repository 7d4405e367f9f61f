"""Device keys: which folder of `tuning_logs/` holds the records for a target.

MetaSchedule's database matches on workload alone and ignores the target, so
records must be kept apart per device: the key names the target kind and the
hardware (CPU model and a digest of its ISA features; GPU architecture).
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from dataclasses import dataclass
from pathlib import Path

import tvm

from ..fileio import atomic_write
from .target import cpu_features, hardware_of

__all__ = [
    "device_key",
    "device_log_dir",
    "DEFAULT_LOG_DIR",
    "DEVICE_FILE",
    "CompatibleKey",
    "compatible_keys",
    "refused_keys",
    "write_device_file",
]

log = logging.getLogger(__name__)

#: The repository's checked-in tuning logs (one folder per device key).
DEFAULT_LOG_DIR = Path("tuning_logs")
#: In a key's folder: the ISA features its records were built for (`compatible_keys` reads it)
DEVICE_FILE = "device.json"
_LLVM_KEY = re.compile(r"^llvm-(?P<arch>[^-]+)-(?P<mcpu>.+)-(?P<cores>\d+)c-(?P<digest>[0-9a-f]{8})$")


def _digest(features) -> str:
    return hashlib.sha256(",".join(sorted(features)).encode()).hexdigest()[:8]


def device_key(target: tvm.target.Target) -> str:
    """e.g. ``llvm-x86_64-znver5-2c-1a2b3c4d`` or ``cuda-sm_90``: safe as a folder name."""
    hardware, features = hardware_of(target)
    if target.kind.name == "cuda":
        key = f"cuda-{hardware.split('/', 1)[-1]}"
    else:
        arch, mcpu = hardware.split("/", 1)
        cores = int(target.attrs.get("num-cores", 0) or 0)
        key = f"llvm-{arch}-{mcpu}-{cores}c-{_digest(features)}"
    return re.sub(r"[^A-Za-z0-9_.-]", "_", key)


def write_device_file(directory: Path, target: tvm.target.Target) -> None:
    """Say in a key's folder which ISA features its records need, so another host can tell whether
    they are valid code there (the key holds only a digest of them)."""
    hardware, features = hardware_of(target)
    path = Path(directory) / DEVICE_FILE
    if not path.is_file():
        text = json.dumps(
            {"key": device_key(target), "hardware": hardware, "features": list(features)}, indent=1
        )
        atomic_write(path, (text + "\n").encode())


@dataclass(frozen=True)
class CompatibleKey:
    """Another device key whose records are valid code on this host, and how close its CPU is."""

    key: str
    closeness: str  #: "same CPU model" (other core count), "same family", "compatible ISA"


def _key_features(directory: Path, arch: str, mcpu: str, digest: str) -> frozenset[str] | None:
    """The ISA features a key's records were built for: its `DEVICE_FILE`, else what this LLVM enables for
    its CPU model where that matches the key's digest; None when neither can be trusted."""
    path = directory / DEVICE_FILE
    if path.is_file():
        try:
            features = frozenset(str(f) for f in json.loads(path.read_text())["features"])
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("%s unreadable (%s); its key's records are not transferred", path, exc)
            return None
    else:
        features = cpu_features(mcpu)
    return features if _digest(features) == digest else None


def _family(mcpu: str) -> str:
    return mcpu.rstrip("0123456789-_.v")


def _judged(log_dir: str | Path, target: tvm.target.Target):
    """Each other LLVM key of this architecture under `log_dir`: (its folder, its match, its features,
    why its records cannot run here, "" when they can)."""
    own = device_key(target)
    mine = _LLVM_KEY.match(own)
    if mine is None or not Path(log_dir).is_dir():  # GPU keys name the architecture: no transfer
        return
    host = frozenset(hardware_of(target)[1])
    for directory in sorted(p for p in Path(log_dir).iterdir() if p.is_dir() and p.name != own):
        other = _LLVM_KEY.match(directory.name)
        if other is None or other["arch"] != mine["arch"]:
            continue
        features = _key_features(directory, other["arch"], other["mcpu"], other["digest"])
        if features is None:
            why = f"the ISA features its records need are unknown (no readable {DEVICE_FILE})"
        elif not features <= host:
            missing = sorted(features - host)
            shown = ", ".join(missing[:6]) + (f" and {len(missing) - 6} more" if len(missing) > 6 else "")
            why = f"its records need {shown}, which this CPU ({mine['mcpu']}) lacks"
        else:
            why = ""
        yield directory, other, features, why


def compatible_keys(log_dir: str | Path, target: tvm.target.Target) -> list[CompatibleKey]:
    """The other keys under `log_dir` whose records this host can run, closest first: same target kind and
    architecture, every ISA feature the records were built for present here; then ordered by same CPU
    model, same family (znver4 for znver5), most features shared. A record is valid code on any CPU with
    its features; only its speed differs, so keys choose, features refuse."""
    mine = _LLVM_KEY.match(device_key(target))
    found: list[tuple[tuple, CompatibleKey]] = []
    for directory, other, features, why in _judged(log_dir, target):
        if why:
            continue
        if other["mcpu"] == mine["mcpu"]:
            rank, closeness = 0, "same CPU model"
        elif _family(other["mcpu"]) == _family(mine["mcpu"]):
            rank, closeness = 1, "same family"
        else:
            rank, closeness = 2, "compatible ISA"
        found.append(((rank, -len(features), directory.name), CompatibleKey(directory.name, closeness)))
    return [k for _, k in sorted(found)]


def refused_keys(log_dir: str | Path, target: tvm.target.Target) -> dict[str, str]:
    """The other keys of this architecture under `log_dir` whose records never apply here, and why."""
    return {directory.name: why for directory, _, _, why in _judged(log_dir, target) if why}


def device_log_dir(log_dir: str | Path, target: tvm.target.Target) -> Path:
    return Path(log_dir) / device_key(target)
