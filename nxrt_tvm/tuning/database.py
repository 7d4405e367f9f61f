"""Per-device MetaSchedule databases: open, digest, and the pass that applies them at compile time."""
from __future__ import annotations

import hashlib
import logging
from pathlib import Path

import tvm
from tvm.s_tir import meta_schedule as ms

from .device import device_key, device_log_dir

__all__ = ["open_database", "database_digest", "TuningDatabase"]

log = logging.getLogger(__name__)

_FILES = ("database_workload.json", "database_tuning_record.json")


class TuningDatabase:
    """The records of one device key, ready to apply while lowering."""

    def __init__(self, directory: Path, key: str):
        self.directory = directory
        self.key = key
        self.database = ms.database.JSONDatabase(
            path_workload=str(directory / _FILES[0]), path_tuning_record=str(directory / _FILES[1]), allow_missing=True
        )
        self.digest = database_digest(directory)

    def __len__(self) -> int:
        return len(self.database)

    def has_record(self, func: tvm.tirx.PrimFunc) -> bool:
        mod = tvm.IRModule({"main": func})
        if not self.database.has_workload(mod):
            return False
        return bool(self.database.get_top_k(self.database.commit_workload(mod), 1))


def database_digest(directory: Path) -> str:
    """sha256 over the database files: part of compile-cache keys, so new records invalidate old builds."""
    digest = hashlib.sha256()
    for name in _FILES:
        path = Path(directory) / name
        if path.is_file():
            digest.update(name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def open_database(log_dir: str | Path, target: tvm.target.Target) -> TuningDatabase | None:
    """The database for this target's device key under `log_dir`, or None (logged) when there is none."""
    directory = device_log_dir(log_dir, target)
    if not (directory / _FILES[1]).is_file():
        others = sorted(p.name for p in Path(log_dir).iterdir() if p.is_dir()) if Path(log_dir).is_dir() else []
        log.warning(
            "no tuning records for device %s under %s%s; using default schedules",
            device_key(target), log_dir, f" (records exist for: {', '.join(others)})" if others else "",
        )
        return None
    return TuningDatabase(directory, device_key(target))
