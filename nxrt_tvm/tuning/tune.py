"""tune_model: MetaSchedule + XGBoost over every TVM partition, per device, resumable.

Trials are spent where the weighted cost is (calls x flops per call); each
task is tuned in turn into the device's JSON database, and a small state file
records trials done per workload, so a second run continues instead of
repeating finished tasks. Measurement runs locally or, through TVM's own RPC
tracker, on the device itself.
"""
from __future__ import annotations

import json
import logging
import os
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm
from tvm.s_tir import meta_schedule as ms

from ..api.errors import InvalidProviderOptions
from ..graph.model import ModelSource, load_model
from ..lower.target import make_target
from ..partition.plan import make_plan
from ..providers import CPUExecutionProvider, TvmExecutionProvider
from .database import TuningDatabase
from .device import DEFAULT_LOG_DIR, device_key, device_log_dir
from .tasks import TuningTask, extract_tasks

__all__ = ["tune_model", "TuneReport", "TaskResult", "parse_tracker"]

log = logging.getLogger(__name__)

_STATE = "nxrt_tuning_state.json"
_FAILED_RUN_SECS = 1e9
#: Builder/runner timeouts: MetaSchedule's 30 s default kills builds on a busy 2-core machine.
_TIMEOUT_S = 300


@dataclass(frozen=True)
class TaskResult:
    name: str
    workload: str
    weight: int
    flops: float
    trials: int  # trials run for this task in this call
    total_trials: int  # trials recorded for it across calls
    best_us: float | None
    skipped: bool


@dataclass(frozen=True)
class TuneReport:
    device_key: str
    directory: Path
    tasks: tuple[TaskResult, ...]
    seconds: float

    @property
    def trials(self) -> int:
        return sum(t.trials for t in self.tasks)


def parse_tracker(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        raise InvalidProviderOptions(f"--rpc-tracker must be HOST:PORT, got {text!r}")
    return host, int(port)


def _allot(tasks: Sequence[TuningTask], trials: int, per_iter: int) -> list[int]:
    """Trials per task in proportion to weighted flops, at least one measurement round each."""
    total = sum(t.weighted_flops for t in tasks) or 1.0
    return [max(per_iter, int(round(trials * t.weighted_flops / total / per_iter)) * per_iter) for t in tasks]


def _best_us(db: TuningDatabase, task: TuningTask) -> float | None:
    mod = task.extracted.dispatched[0]
    if not db.database.has_workload(mod):
        return None
    top = db.database.get_top_k(db.database.commit_workload(mod), 1)
    if not top or not top[0].run_secs:
        return None
    secs = [float(s) for s in top[0].run_secs]
    if min(secs) >= _FAILED_RUN_SECS:  # MetaSchedule's mark for a trial that failed to build or run
        return None
    return 1e6 * sum(secs) / len(secs)


def _runner(rpc_tracker: str | None, rpc_key: str | None) -> ms.runner.Runner:
    if rpc_tracker is None:
        return ms.runner.LocalRunner(timeout_sec=_TIMEOUT_S)
    if not rpc_key:
        raise InvalidProviderOptions("--rpc-tracker needs --rpc-key (the key the device's RPC server registered)")
    host, port = parse_tracker(rpc_tracker)
    return ms.runner.RPCRunner(
        rpc_config=ms.runner.RPCConfig(tracker_host=host, tracker_port=port, tracker_key=rpc_key, session_timeout_sec=120)
    )


def tune_model(
    models: ModelSource | Sequence[ModelSource],
    *,
    target: object = "llvm",
    trials: int = 256,
    time_budget: float | None = None,
    log_dir: str | os.PathLike = DEFAULT_LOG_DIR,
    rpc_tracker: str | None = None,
    rpc_key: str | None = None,
    trials_per_iter: int = 16,
    free_dims: dict[str, int] | None = None,
    progress: bool | None = None,
) -> TuneReport:
    """Tune every TVM partition of `models` for `target`; records go to `log_dir/<device key>/`."""
    if trials < 1:
        raise InvalidProviderOptions(f"trials must be >= 1, got {trials}")
    started = time.perf_counter()
    tvm_target = make_target(target)
    runner = _runner(rpc_tracker, rpc_key)  # bad RPC arguments fail before anything is written
    directory = device_log_dir(log_dir, tvm_target)
    directory.mkdir(parents=True, exist_ok=True)
    sources = list(models) if isinstance(models, (list, tuple)) else [models]
    partitions = []
    for source in sources:
        graph = load_model(source, free_dims=free_dims)
        ep = TvmExecutionProvider(target=tvm_target)
        plan = make_plan(graph, [ep, CPUExecutionProvider()])
        partitions.extend((graph, p) for p in plan.partitions if p.ep == ep.ep_id)
    tasks = extract_tasks(partitions, tvm_target)
    per_iter = max(1, min(trials_per_iter, trials))
    allotted = _allot(tasks, trials, per_iter)
    state_path = directory / _STATE
    state: dict[str, dict] = json.loads(state_path.read_text()) if state_path.is_file() else {}
    db = TuningDatabase(directory, device_key(tvm_target))
    results: list[TaskResult] = []
    bar = tqdm(list(zip(tasks, allotted)), desc=f"tuning {device_key(tvm_target)}", unit="task",
               disable=None if progress is None else not progress)
    for task, want in bar:
        done = int(state.get(task.workload, {}).get("trials", 0))
        over_budget = time_budget is not None and time.perf_counter() - started > time_budget
        todo = 0 if over_budget else max(0, want - done)
        if todo:
            bar.set_postfix_str(f"{task.name}: {todo} trials")
            # Built here rather than by extracted_tasks_to_tune_contexts, which rewrites the
            # process's logging configuration (and breaks on handlers without names).
            contexts = [
                ms.TuneContext(
                    mod=task.extracted.dispatched[0],
                    target=task.extracted.target,
                    space_generator="post-order-apply",
                    search_strategy="evolutionary",
                    task_name=task.name,
                    logger=logging.getLogger(f"{__name__}.{task.name[:100]}"),
                    num_threads="physical",
                ).clone()
            ]
            with tempfile.TemporaryDirectory(prefix="nxrt-tune-") as scratch:
                ms.tune.tune_tasks(
                    tasks=contexts,
                    task_weights=[1.0],
                    work_dir=scratch,
                    max_trials_global=todo,
                    max_trials_per_task=todo,
                    num_trials_per_iter=min(per_iter, todo),
                    builder=ms.builder.LocalBuilder(timeout_sec=_TIMEOUT_S),
                    runner=runner,
                    database=db.database,
                    cost_model=ms.cost_model.XGBModel(
                        extractor=ms.feature_extractor.PerStoreFeature(), num_warmup_samples=min(16, todo)
                    ),
                )
            state[task.workload] = {"name": task.name, "trials": done + todo}
            _write_json(state_path, state)
        best = _best_us(db, task)
        bar.set_postfix_str(f"{task.name}: best {best:.1f} us" if best else task.name)
        results.append(TaskResult(task.name, task.workload, task.weight, task.flops, todo, done + todo, best, todo == 0))
    return TuneReport(device_key(tvm_target), directory, tuple(results), time.perf_counter() - started)


def _write_json(path: Path, data: object) -> None:
    from ..epcontext.writer import atomic_write

    atomic_write(path, json.dumps(data, indent=1, sort_keys=True).encode())
