"""tune_model: MetaSchedule + XGBoost over every TVM partition, per device, resumable.

First the default CPU rules' schedule of every task is measured, with the
same builder and runner as the trials, and committed as a record: it is the
baseline the search must beat (compile takes a searched record only where it
measured 5% faster than the rule's), and it tells where
the weighted latency is (calls x measured time), which is where the trials
go. Each task is then tuned in turn into the device's JSON database; a small
state file records trials done per workload, so a second run continues
instead of repeating finished tasks. Measurement runs locally or, through
TVM's own RPC tracker, on the device itself.
"""

from __future__ import annotations

import hashlib
import inspect
import itertools
import json
import logging
import os
import statistics
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import tvm
from tqdm import tqdm
from tvm import s_tir
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.meta_schedule.utils import remove_build_dir

from ..api.errors import InvalidProviderOptions
from ..api.provider import inlined_ops
from ..graph.model import ModelSource, load_model
from ..lower.device_key import DEFAULT_LOG_DIR, device_key, device_log_dir, write_device_file
from ..lower.schedules import default_rules, schedule_with_rules
from ..lower.target import make_target
from ..lower.tir_pipeline import MEASURED_PIPELINE, build_for_measurement, measured_module
from ..lower.tuned import TuningDatabase, is_searched, mean_us, record_sizes, replay, write_index
from ..partition.plan import make_plan
from ..providers import CPUExecutionProvider, TvmExecutionProvider
from .tasks import TuningTask, extract_tasks

__all__ = [
    "tune_model",
    "TuneReport",
    "TaskResult",
    "parse_tracker",
    "measurers",
    "measure_schedules",
    "rule_digest",
]

log = logging.getLogger(__name__)

STATE_FILE = "nxrt_tuning_state.json"
#: Builder/runner timeouts: MetaSchedule's 30 s default kills builds on a busy 2-core machine.
_TIMEOUT_S = 300
#: what `_measure_rules` calls a task's best searched schedule, measured again beside the rule's
_SEARCHED = "best searched"


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
    rule_us: float | None = None  # the default rules' schedule, measured like a trial (None: no rule fits)
    best_is_rule: bool = False  # no searched schedule beat the default rules'

    @property
    def speedup(self) -> float | None:
        """Default rules' time over the best record's (1.0 where the rules stayed fastest)."""
        return self.rule_us / self.best_us if self.rule_us and self.best_us else None


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


def _weighted_latency(tasks: Sequence[TuningTask], latency_us: Sequence[float | None]) -> list[float]:
    """Calls x measured time per task; a task without a measurement is estimated from its flops
    at the median rate of the measured ones."""
    rates = [t.flops / us for t, us in zip(tasks, latency_us) if us and t.flops > 0]
    rate = statistics.median(rates) if rates else 1e4  # flop per us (10 GFLOP/s) when nothing was measured
    return [t.weight * (us if us else max(t.flops, 1.0) / rate) for t, us in zip(tasks, latency_us)]


def _allot(costs: Sequence[float], trials: int, per_iter: int) -> list[int]:
    """Trials per task in proportion to its cost, one measurement round at least."""
    total = sum(costs) or 1.0
    return [max(per_iter, int(round(trials * c / total / per_iter)) * per_iter) for c in costs]


def _trials_in_budget(todo: int, left_s: float | None, per_trial_s: float | None, per_iter: int) -> int:
    """A task's `todo` trials cut to what fits in the time left at this run's measured rate, in whole rounds
    (at least one while any time is left: a task is never started for nothing)."""
    if left_s is None or todo == 0:
        return todo
    if left_s <= 0:
        return 0
    if per_trial_s is None:
        return todo  # nothing measured yet: the heaviest task runs its allotment
    fits = int(left_s / per_trial_s) // per_iter * per_iter
    return min(todo, max(per_iter, fits))


def _best(db: TuningDatabase, task: TuningTask) -> tuple[float | None, bool]:
    """(mean time of the task's best valid record in us,
    whether that record is the default rules' schedule)."""
    match = db.best(task.extracted.dispatched[0])
    if match is None or match.how != "exact":
        return None, False
    return match.mean_us, not is_searched(match.record.trace)


def _rule_schedule(task: TuningTask, target) -> tuple[str, s_tir.Schedule] | None:
    return schedule_with_rules(task.extracted.dispatched[0]["main"], target, default_rules())


def rule_digest(sch: s_tir.Schedule) -> str:
    """What identifies a default rule's measured schedule of a kernel: its trace and the code generation
    it was built with (`MEASURED_PIPELINE`). A change to either means a new baseline to measure."""
    return hashlib.sha256(f"{sch.trace}\0{MEASURED_PIPELINE}".encode()).hexdigest()[:16]


def _stale_baseline(entry: dict, found: tuple[str, s_tir.Schedule] | None) -> bool:
    """Whether a task's default-rule baseline is missing or was measured on another
    version of the rules or of code generation (`found`: the rules' schedule now;
    None where no rule fits, as on cuda, whose kernels dlight schedules)."""
    if "rule_us" not in entry:
        return True
    return found is not None and entry.get("rule_digest") != rule_digest(found[1])


def _searched_schedule(db: TuningDatabase, task: TuningTask) -> tuple[tvm.IRModule, s_tir.Schedule] | None:
    """(workload, schedule) of the task's best searched record, replayed as compile applies it; or None."""
    record = db.top_searched(task.extracted.dispatched[0])
    return None if record is None else (record.workload.mod, replay(record))


def _measure_rules(
    tasks: Sequence[tuple[TuningTask, tuple[str, s_tir.Schedule] | None]],
    target,
    builder: ms.builder.Builder,
    runner: ms.runner.Runner,
    db: TuningDatabase,
) -> list[tuple[str, float, str] | None]:
    """Measure the default rules' schedule of each task (given
    with it) like a trial; keep it as its baseline record.

    The task's best searched schedule is measured again beside it and recorded once more, so the two that
    compile chooses between have a time from the same run and the same code generation (a baseline goes stale
    when either changed). Per task: (rule, us, rule digest), or None where no rule
    fits or the schedule failed to build or run (logged).
    """
    scheduled = []  # (task, workload, what: a rule's name or _SEARCHED, schedule)
    for task, found in tasks:
        if found is not None:
            scheduled.append((task, task.extracted.dispatched[0], *found))
            searched = _searched_schedule(db, task)
            if searched is not None:
                scheduled.append((task, searched[0], _SEARCHED, searched[1]))
    times = measure_schedules(
        [(task.name, what, sch) for task, _, what, sch in scheduled], target, builder, runner
    )
    measured: dict[str, tuple[str, float, str]] = {}
    for (task, kernel, what, sch), found in zip(scheduled, times):
        if found is None:
            continue
        args, run_secs = found
        if what == _SEARCHED:
            db.commit_searched(kernel, sch.trace, run_secs, target, args)
            continue
        db.commit_baseline(kernel, sch.trace, run_secs, target, args)
        measured[task.workload] = (what, mean_us(run_secs), rule_digest(sch))
    return [measured.get(task.workload) for task, _ in tasks]


def measure_schedules(
    scheduled: Sequence[tuple[str, str, s_tir.Schedule]],
    target,
    builder: ms.builder.Builder,
    runner: ms.runner.Runner,
) -> list[tuple[list, list] | None]:
    """Build and run each (kernel name, what, schedule) as MetaSchedule measures a trial: per schedule its
    (args info, run seconds), or None where it failed to build or run (logged). One build call and one
    run call for all of them (each call starts worker processes)."""
    mods = [measured_module(sch.mod) for *_, sch in scheduled]
    built = builder.build([ms.builder.BuilderInput(mod, target) for mod in mods]) if mods else []
    runnable, inputs = [], []
    device = "cpu" if target.kind.name == "llvm" else target.kind.name
    for k, ((name, what, _), result) in enumerate(zip(scheduled, built)):
        if result.error_msg:
            log.warning(
                "the %s schedule of %s did not build for measurement: %s",
                what,
                name,
                result.error_msg.strip().splitlines()[-1],
            )
            continue
        # As MetaSchedule measures its candidates: a layout-rewrite
        # block (packed weights) is not run, its output is the argument.
        args = ms.arg_info.ArgInfo.from_entry_func(mods[k], remove_preproc=True)
        runnable.append((k, name, what, args, result.artifact_path))
        inputs.append(ms.runner.RunnerInput(result.artifact_path, device, args))
    measured: list[tuple[list, list] | None] = [None] * len(scheduled)
    try:
        futures = runner.run(inputs) if inputs else []
        for (k, name, what, args, _), future in zip(runnable, futures):
            result = future.result()
            if result.error_msg or not result.run_secs:
                log.warning(
                    "the %s schedule of %s failed to run for measurement: %s",
                    what,
                    name,
                    (result.error_msg or "no run time").strip().splitlines()[-1],
                )
                continue
            measured[k] = (args, result.run_secs)
    finally:
        for *_, artifact in runnable:
            remove_build_dir(artifact)
    return measured


def measurers(rpc_tracker: str | None, rpc_key: str | None) -> tuple[ms.builder.Builder, ms.runner.Runner]:
    """The builder (as compile builds) and runner (here, or on the device behind the RPC tracker) that
    tuning and revalidation measure schedules with."""
    builder = ms.builder.LocalBuilder(timeout_sec=_TIMEOUT_S, f_build=build_for_measurement)
    return builder, _runner(rpc_tracker, rpc_key)


def _runner(rpc_tracker: str | None, rpc_key: str | None) -> ms.runner.Runner:
    if rpc_tracker is None:
        return ms.runner.LocalRunner(timeout_sec=_TIMEOUT_S)
    if not rpc_key:
        raise InvalidProviderOptions(
            "--rpc-tracker needs --rpc-key (the key the device's RPC server registered)"
        )
    host, port = parse_tracker(rpc_tracker)
    return ms.runner.RPCRunner(
        rpc_config=ms.runner.RPCConfig(
            tracker_host=host, tracker_port=port, tracker_key=rpc_key, session_timeout_sec=120
        )
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
    free_dims: Mapping[str, int | Sequence[int]] | None = None,
    conv_algorithm: str = "auto",
    passes: Sequence[tvm.transform.Pass] = (),
    progress: bool | None = None,
) -> TuneReport:
    """Tune every TVM partition of `models` for `target`; records go to `log_dir/<device key>/`.

    `free_dims` fixes symbolic input dims by name, each at one size or several: the models are tuned at
    every combination of them, and the sizes are kept with the records (`lower.tuned.SIZES_FILE`), so a
    session over the symbolic model also builds its partitions at those sizes and runs the tuned kernels
    where a call's sizes match (`providers.tvm.sizes`).

    `conv_algorithm` and `passes` are the TVM EP options the models will be compiled with: both change
    the kernels, so records made under one configuration do not match the kernels of another.
    """
    if trials < 1:
        raise InvalidProviderOptions(f"trials must be >= 1, got {trials}")
    sizes = _dim_sizes(free_dims or {})
    started = time.perf_counter()
    tvm_target = make_target(target)
    builder, runner = measurers(rpc_tracker, rpc_key)  # bad RPC arguments fail before anything is written
    # Every partition TVM can build is tuned: one the default rules run slower than onnxruntime is what
    # tuning is for (sessions judge it again with its records).
    ep = TvmExecutionProvider(
        target=tvm_target, passes=passes, conv_algorithm=conv_algorithm, claim_policy="all"
    )  # and bad options
    directory = device_log_dir(log_dir, tvm_target)
    directory.mkdir(parents=True, exist_ok=True)
    write_device_file(directory, tvm_target)  # lets hosts with these ISA features take its records
    if sizes:
        record_sizes(directory, sizes)
    sources = list(models) if isinstance(models, (list, tuple)) else [models]
    partitions = []
    for source in sources:
        for values in itertools.product(*sizes.values()):  # one empty combination where no dim is named
            providers = [ep, CPUExecutionProvider()]
            dims = dict(zip(sizes, values))
            graph = load_model(source, free_dims=dims, inline=inlined_ops(providers))
            plan = make_plan(graph, providers)
            partitions.extend((graph, p) for p in plan.partitions if p.ep == ep.ep_id)
    tasks = extract_tasks(partitions, tvm_target, ep.lowering)
    state_path = directory / STATE_FILE
    state: dict[str, dict] = json.loads(state_path.read_text()) if state_path.is_file() else {}
    db = TuningDatabase(directory, device_key(tvm_target))
    show = None if progress is None else not progress

    # 1. The default rules' schedules: the baseline records, and where the weighted
    #    latency is. Measured again when the rules changed: a record is applied only
    #    where it beat the baseline, so an old, slower baseline would keep a searched
    #    schedule the new rule beats. (The database keeps the fastest baseline.)
    rules = [(t, _rule_schedule(t, tvm_target)) for t in tasks]  # scheduled once: checked, then measured
    new = [(t, found) for t, found in rules if _stale_baseline(state.get(t.workload, {}), found)]
    if new:
        log.info("measuring the default schedules of %d task(s)", len(new))
        llvm = tvm_target.kind.name == "llvm"
        measured = _measure_rules(new, tvm_target, builder, runner, db) if llvm else [None] * len(new)
        for (task, _), found in zip(new, measured):
            entry = state.setdefault(task.workload, {"name": task.name, "trials": 0})
            entry["rule"], entry["rule_us"], entry["rule_digest"] = (
                found if found is not None else (None, None, None)
            )
        _write_json(state_path, state)

    # 2. The search, task by task, heaviest first, trials where calls x time are.
    per_iter = max(1, min(trials_per_iter, trials))
    costs = _weighted_latency(tasks, [state[t.workload]["rule_us"] for t in tasks])
    order = sorted(range(len(tasks)), key=lambda k: -costs[k])
    tasks = [tasks[k] for k in order]
    allotted = _allot([costs[k] for k in order], trials, per_iter)
    results: list[TaskResult] = []
    search_s, searched = 0.0, 0  # this run's search time and trials: the rate the time budget is spent at
    bar = tqdm(list(zip(tasks, allotted)), desc=f"tuning {device_key(tvm_target)}", unit="task", disable=show)
    for task, want in bar:
        entry = state[task.workload]
        done = max(int(entry.get("trials", 0)), db.searched_trials(task.extracted.dispatched[0]))
        left_s = None if time_budget is None else time_budget - (time.perf_counter() - started)
        todo = _trials_in_budget(
            max(0, want - done), left_s, search_s / searched if searched else None, per_iter
        )
        if todo:
            bar.set_postfix_str(f"{task.name}: {todo} trials")
            search_started = time.perf_counter()
            _search(task, todo, per_iter, builder, runner, db)
            search_s += time.perf_counter() - search_started
            searched += todo
            entry["trials"] = done + todo
            _write_json(state_path, state)
        best, best_is_rule = _best(db, task)
        rule_us = entry.get("rule_us")
        bar.set_postfix_str(
            f"{task.name}: best {best:.1f} us" + (f" (default {rule_us:.1f} us)" if rule_us else "")
            if best
            else task.name
        )
        results.append(
            TaskResult(
                task.name,
                task.workload,
                task.weight,
                task.flops,
                todo,
                done + todo,
                best,
                todo == 0,
                rule_us,
                best_is_rule,
            )
        )
    write_index(directory)  # what sessions read instead of every candidate
    return TuneReport(device_key(tvm_target), directory, tuple(results), time.perf_counter() - started)


def _dim_sizes(free_dims: Mapping[str, int | Sequence[int]]) -> dict[str, tuple[int, ...]]:
    """`free_dims` as {name: sizes}, each size a positive int (a typed error says which is not)."""
    sizes = {}
    for name, value in free_dims.items():
        values = (value,) if isinstance(value, int) else tuple(value)
        if not values or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in values):
            raise InvalidProviderOptions(
                f"free_dims[{name!r}] must be a positive size or a list of them, got {value!r}"
            )
        sizes[name] = tuple(dict.fromkeys(values))
    return sizes


#: files of frames that belong to no module (the import machinery, code compiled from strings)
_MODULELESS_FILES = (
    "<frozen importlib._bootstrap>",
    "<frozen importlib._bootstrap_external>",
    "<string>",
    "<ast>",
)


def _import_tensor_intrinsics() -> None:
    """Import TVM's tensor intrinsics (what `TuneContext` imports on first use) in seconds, not minutes.

    TVMScript's parser calls `inspect.stack()` for each of their ~700 prim_funcs, and `inspect.getmodule`
    scans every loaded module for each frame whose file belongs to no module (the import machinery's):
    50-110 s before the first trial, with torch loaded (tvm_ffi imports it). Recording up front that those
    files belong to no module gives the same answer as the scan, from inspect's own cache: 7 s.
    """
    for name in _MODULELESS_FILES:
        inspect.modulesbyfile.setdefault(os.path.normcase(os.path.abspath(name)), name)
    import tvm.s_tir.tensor_intrin  # noqa: F401 - registers the intrinsics MetaSchedule's rules use


def _search(
    task: TuningTask,
    trials: int,
    per_iter: int,
    builder: ms.builder.Builder,
    runner: ms.runner.Runner,
    db: TuningDatabase,
) -> None:
    """`trials` MetaSchedule trials of one task (evolutionary search, XGBoost cost model) into `db`."""
    _import_tensor_intrinsics()
    # Built here rather than by extracted_tasks_to_tune_contexts, which rewrites the
    # process's logging configuration (and breaks on handlers without names).
    context = ms.TuneContext(
        mod=task.extracted.dispatched[0],
        target=task.extracted.target,
        space_generator="post-order-apply",
        search_strategy="evolutionary",
        task_name=task.name,
        logger=logging.getLogger(f"{__name__}.{task.name[:100]}"),
        num_threads="physical",
    ).clone()
    with tempfile.TemporaryDirectory(prefix="nxrt-tune-") as scratch:
        ms.tune.tune_tasks(
            tasks=[context],
            task_weights=[1.0],
            work_dir=scratch,
            max_trials_global=trials,
            max_trials_per_task=trials,
            num_trials_per_iter=min(per_iter, trials),
            builder=builder,
            runner=runner,
            database=db.database,
            cost_model=ms.cost_model.XGBModel(
                extractor=ms.feature_extractor.PerStoreFeature(), num_warmup_samples=min(16, trials)
            ),
        )


def _write_json(path: Path, data: object) -> None:
    from ..fileio import atomic_write

    atomic_write(path, json.dumps(data, indent=1, sort_keys=True).encode())
