"""Device keys: which folder of `tuning_logs/` holds the records for a target.

MetaSchedule's database matches on workload alone and ignores the target, so
records must be kept apart per device: the key names the target kind and the
hardware (CPU model and a digest of its ISA features; GPU architecture).
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import tvm

from .target import hardware_of

__all__ = ["device_key", "device_log_dir", "DEFAULT_LOG_DIR"]

#: The repository's checked-in tuning logs (one folder per device key).
DEFAULT_LOG_DIR = Path("tuning_logs")


def device_key(target: tvm.target.Target) -> str:
    """e.g. ``llvm-x86_64-znver5-2c-1a2b3c4d`` or ``cuda-sm_90``: safe as a folder name."""
    hardware, features = hardware_of(target)
    if target.kind.name == "cuda":
        key = f"cuda-{hardware.split('/', 1)[-1]}"
    else:
        arch, mcpu = hardware.split("/", 1)
        cores = int(target.attrs.get("num-cores", 0) or 0)
        digest = hashlib.sha256(",".join(features).encode()).hexdigest()[:8]
        key = f"llvm-{arch}-{mcpu}-{cores}c-{digest}"
    return re.sub(r"[^A-Za-z0-9_.-]", "_", key)


def device_log_dir(log_dir: str | Path, target: tvm.target.Target) -> Path:
    return Path(log_dir) / device_key(target)
