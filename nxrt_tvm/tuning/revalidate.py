"""`nxrt-tvm tune --revalidate`: compatible keys' records measured on this host, no search.

A transferred record (`lower.tuned.TuningRecords`) is valid code here but was
timed on another CPU, so which of a kernel's searched schedule and its default
rule is faster may differ here. Revalidation measures both on this host, for
every workload the compatible keys hold (closest key first), and commits them
under this host's own key: the searched one as a searched record, the rule's as
its baseline, so compile chooses by this host's times. It needs no model: the
records carry their kernels. Resumable: a workload this key already has a
record for is not measured again.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

import tvm
import tvm_ffi
from tqdm import tqdm
from tvm.s_tir import meta_schedule as ms

from ..lower.device_key import DEFAULT_LOG_DIR, compatible_keys, device_key, device_log_dir, write_device_file
from ..lower.schedules import default_rules, schedule_with_rules
from ..lower.target import make_target
from ..lower.tuned import TuningDatabase, merge_sizes, read_sizes, record_sizes, replay, write_index
from .tune import STATE_FILE, measure_schedules, measurers

__all__ = ["revalidate", "RevalidateReport"]

#: workloads measured per build/run call: progress and resumption points come this often
BATCH = 8


@dataclass(frozen=True)
class RevalidateReport:
    device_key: str
    directory: Path
    sources: tuple[str, ...]  #: the compatible keys whose records were measured, closest first
    measured: int  #: workloads measured (and committed under this host's key) in this call
    done_before: int  #: workloads this host's key already had records for
    failed: int  #: workloads none of whose schedules built and ran here (logged)
    seconds: float


@dataclass(frozen=True)
class _Workload:
    name: str
    mod: tvm.IRModule
    searched: ms.database.TuningRecord | None


def _workloads(log_dir: Path, target, own: TuningDatabase) -> tuple[list[_Workload], int, tuple[str, ...]]:
    """The compatible keys' workloads this key has no record for (each once, from its closest key), how
    many it has already, and the keys."""
    seen: set[str] = set()
    todo: list[_Workload] = []
    done = 0
    keys = compatible_keys(log_dir, target)
    for key in keys:
        source = TuningDatabase(log_dir / key.key, key.key)
        state_path = log_dir / key.key / STATE_FILE
        names = json.loads(state_path.read_text()) if state_path.is_file() else {}
        for record in source.all_records():
            mod = record.workload.mod
            digest = str(tvm_ffi.structural_hash(mod))  # what tuning's state file keys workloads by
            if digest in seen:
                continue
            seen.add(digest)
            if own.exact(mod) is not None:
                done += 1
                continue
            name = names.get(digest, {}).get("name", f"workload {digest}")
            todo.append(_Workload(name, mod, source.top_searched(mod)))
    return todo, done, tuple(k.key for k in keys)


def revalidate(
    *,
    target: object = "llvm",
    log_dir: str | os.PathLike = DEFAULT_LOG_DIR,
    rpc_tracker: str | None = None,
    rpc_key: str | None = None,
    progress: bool | None = None,
) -> RevalidateReport:
    """Measure the compatible keys' records and the default rules on this host; commit them under its key."""
    started = time.perf_counter()
    tvm_target = make_target(target)
    builder, runner = measurers(rpc_tracker, rpc_key)
    log_dir = Path(log_dir)
    directory = device_log_dir(log_dir, tvm_target)
    directory.mkdir(parents=True, exist_ok=True)
    write_device_file(directory, tvm_target)
    own = TuningDatabase(directory, device_key(tvm_target))
    todo, done, sources = _workloads(log_dir, tvm_target, own)
    sizes = merge_sizes(*(read_sizes(log_dir / key) for key in sources))
    if sizes:  # the sizes the records were tuned at come with them (`lower.tuned.SIZES_FILE`)
        record_sizes(directory, sizes)
    measured = failed = 0
    show = None if progress is None else not progress
    bar = tqdm(total=len(todo), desc=f"revalidating for {own.key}", unit="kernel", disable=show)
    for first in range(0, len(todo), BATCH):
        batch = todo[first : first + BATCH]
        scheduled = []  # (workload, "searched" or "rule", schedule)
        for w in batch:
            if w.searched is not None:
                scheduled.append((w, "searched", replay(w.searched)))
            rule = schedule_with_rules(w.mod["main"], tvm_target, default_rules())
            if rule is not None:
                scheduled.append((w, "rule", rule[1]))
        times = measure_schedules(
            [(w.name, what, sch) for w, what, sch in scheduled], tvm_target, builder, runner
        )
        ok: set[int] = set()
        for (w, what, sch), found in zip(scheduled, times):
            if found is None:
                continue
            args, run_secs = found
            commit = own.commit_searched if what == "searched" else own.commit_baseline
            commit(w.mod, sch.trace, run_secs, tvm_target, args)
            ok.add(id(w))
        measured += sum(1 for w in batch if id(w) in ok)
        failed += sum(1 for w in batch if id(w) not in ok)
        bar.update(len(batch))
    bar.close()
    write_index(directory)
    return RevalidateReport(
        own.key, directory, sources, measured, done, failed, time.perf_counter() - started
    )
