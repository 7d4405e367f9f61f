"""Per-device MetaSchedule databases: open, digest, and the pass that applies them at compile time.

Two databases per device key, both in TVM's JSON format: MetaSchedule's own
(the search's measured candidates) and, in ``default_schedules/``, the default
rules' schedule of every tuned kernel, measured the same way (the baseline a
searched schedule must beat; kept apart because the search seeds itself from
its database, and replaying a rule's layout rewrite there fails). The searched
record wins where it measured `SEARCHED_MARGIN` faster than the rule's. A
kernel takes the record of its own workload when one exists; otherwise the
record of a kernel with the same *anchor* operation (the same matmul or conv
with another epilogue: MetaSchedule's ``anchor-block`` module equality) is
transferred to it with MetaSchedule's anchor-trace application. Where the
host's own key has no record for a kernel, the records of compatible keys
(`device_key.compatible_keys`: every ISA feature they were built for present
here, closest CPU first) apply, as MetaSchedule's ``OrderedUnionDatabase``
would: `TuningRecords`. The sizes tuning fixed symbolic dims at (`sizes.json`, written by
`nxrt-tvm tune --dim seq=16,128`) come with the records: a session builds a symbolic partition at those
sizes too (`providers.tvm.sizes`), so the records apply. A record whose
trace is the default rule's own schedule (tuning measures it as a candidate,
and it won) is not replayed: the rule schedules the kernel, and the kernel
variant says that the rule measured fastest.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
from dataclasses import dataclass, replace
from pathlib import Path

import tvm
import tvm_ffi
from tvm import s_tir
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.meta_schedule.trace_apply import schedule_using_anchor_trace

from ..fileio import atomic_write
from .device_key import CompatibleKey, compatible_keys, device_key, device_log_dir, refused_keys
from .strict import own_pass
from .tir_pipeline import tir_pipeline_for

__all__ = [
    "open_database",
    "open_records",
    "TuningRecords",
    "write_index",
    "INDEX_FILE",
    "TuningDatabase",
    "RecordMatch",
    "ApplyTuningRecords",
    "TUNING_ATTR",
    "FAILED_RUN_SECS",
    "is_searched",
    "workload_module",
    "mean_us",
    "replay",
    "read_sizes",
    "record_sizes",
    "merge_sizes",
    "SIZES_FILE",
]

log = logging.getLogger(__name__)

_FILES = ("database_workload.json", "database_tuning_record.json")
#: subfolder of a device key's folder holding the default rules' measured schedules
BASELINE_DIR = "default_schedules"
#: each workload's fastest record, written beside a database by tuning (`write_index`; a cache: the
#: database files stay the record, and an index they no longer match is not read)
INDEX_FILE = "fastest_records.json"
INDEX_FORMAT = 1  #: entries: [structural hash, workload line, mean run secs, record JSON text]
#: MetaSchedule's run time for a candidate that failed to
#: build or run (1e10 s); anything this slow is no record.
FAILED_RUN_SECS = 1e9
#: A searched schedule replaces the default rule's only when it measured this much faster: MetaSchedule times
#: a kernel alone (warm caches, one kernel at a time), and inside a model the two differ by about as much.
SEARCHED_MARGIN = 0.05
#: PrimFunc attribute: how a tuning record scheduled the function ("exact", "anchor"),
#: "rule-best", or "unfit" (a matching record failed to replay: the default rules schedule it); a record of
#: another device key adds "@<key>" ("exact@llvm-x86_64-znver4-2c-5a12382f").
TUNING_ATTR = "nxrt.tuning_record"


#: a device key's sizes of symbolic dims tuned at: {"seq": [16, 128]}
SIZES_FILE = "sizes.json"


def read_sizes(directory: Path) -> dict[str, tuple[int, ...]]:
    """The sizes records under `directory` were tuned at, per dim name ({} where none were named)."""
    path = Path(directory) / SIZES_FILE
    try:
        data = json.loads(path.read_text()) if path.is_file() else {}
    except (OSError, ValueError) as exc:
        log.warning("%s unreadable (%s); no size-specialised builds from it", path, exc)
        return {}
    if not isinstance(data, dict):
        log.warning("%s is not a JSON object of dim sizes; ignored", path)
        return {}
    return {
        str(name): tuple(sorted({int(s) for s in sizes if isinstance(s, int) and s > 0}))
        for name, sizes in data.items()
        if isinstance(sizes, list)
    }


def merge_sizes(*dims: dict[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
    """Per dim name, every size any of `dims` has, ascending."""
    merged: dict[str, set[int]] = {}
    for sizes_by_name in dims:
        for name, sizes in sizes_by_name.items():
            merged.setdefault(name, set()).update(int(s) for s in sizes)
    return {name: tuple(sorted(sizes)) for name, sizes in sorted(merged.items())}


def record_sizes(directory: Path, dims: dict[str, tuple[int, ...]]) -> None:
    """Add `dims`' sizes to those `directory`'s records were tuned at (kept in sizes.json, merged)."""
    text = json.dumps({k: list(v) for k, v in merge_sizes(read_sizes(directory), dims).items()}, indent=1)
    atomic_write(Path(directory) / SIZES_FILE, text.encode())


def is_searched(trace: s_tir.Trace) -> bool:
    """Whether a trace came from MetaSchedule's search (it samples); the default rules' traces never do."""
    return any(inst.kind.name.startswith("Sample") for inst in trace.insts)


def workload_module(func: tvm.tirx.PrimFunc) -> tvm.IRModule:
    """A kernel as MetaSchedule keys it (its task module: "main", with that global symbol)."""
    return tvm.IRModule({"main": func.with_attr("global_symbol", "main")})


def replay(record: ms.database.TuningRecord) -> s_tir.Schedule:
    """A record's trace applied to its own workload, postprocessing included (as it was measured)."""
    sch = s_tir.Schedule(record.workload.mod)
    record.trace.apply_to_schedule(sch, remove_postproc=False)
    return sch


def _valid(record: ms.database.TuningRecord | None) -> bool:
    secs = record.run_secs if record is not None else None
    return bool(secs) and min(float(s) for s in secs) < FAILED_RUN_SECS


@dataclass(frozen=True)
class RecordMatch:
    """The best record for a kernel and how it matched:
    "exact" (same workload) or "anchor" (same anchor op)."""

    record: ms.database.TuningRecord
    how: str
    #: the device key the record was tuned on, where it is not this host's own (None: own)
    transferred_from: str | None = None

    @property
    def mean_us(self) -> float:
        return mean_us(self.record.run_secs)


def _json_database(directory: Path) -> ms.database.JSONDatabase:
    return ms.database.JSONDatabase(
        path_workload=str(directory / _FILES[0]),
        path_tuning_record=str(directory / _FILES[1]),
        allow_missing=True,
    )


def _lines(path: Path) -> list[str]:
    return [line for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []


@functools.lru_cache(maxsize=1024)
def _workload_mod(line: str) -> tvm.IRModule:
    """A workload's module from its JSON line (device keys tuned from the same models share them)."""
    return ms.database.Workload.from_json(json.loads(line)).mod


@dataclass(eq=False)
class _Entry:
    """A workload's fastest record as stored: parsing it replays its trace (about 5 ms), so it waits for a
    kernel that asks for it, and is done once (not frozen: it keeps what it parsed)."""

    workload: str  # the workload's JSON line
    line: int  # its line in the workload file (what the database's records refer to it by)
    record: str  # the record's JSON text, [trace, run_secs, target, args_info], decoded when parsed
    mean: float  # its mean run time (s), what `get_top_k` ranks by

    @functools.cached_property
    def mod(self) -> tvm.IRModule:
        return _workload_mod(self.workload)

    @functools.cached_property
    def parsed(self) -> ms.database.TuningRecord | None:
        record = ms.database.TuningRecord.from_json(json.loads(self.record), ms.database.Workload(self.mod))
        return record if _valid(record) else None


class _Fastest:
    """Each workload's fastest record of a JSON database, read-only, parsed on first use. MetaSchedule
    keeps every candidate it measured (the search trains its cost model on them; the shipped Zen 4 logs
    hold 2922 records), where applying needs one per workload: the one `get_top_k` ranks first (least mean
    run time), so every lookup answers as on the whole database. Parsing even those took 1.3 s of every
    session with logs; a session parses the few its kernels match. Tuning writes them beside the database
    (`INDEX_FILE`, `write_index`): read from there where it is current (`digest`: the folder's files),
    they spare a session JSON-decoding every candidate (0.2 s of the shipped logs)."""

    def __init__(self, directory: Path, digest: str):
        #: by the workload's structural hash (what MetaSchedule's structural module equality hashes)
        self.entries: dict[int, _Entry] = _read_index(directory, digest) or _fastest_entries(directory)

    def __len__(self) -> int:
        return len(self.entries)

    def top(self, mod: tvm.IRModule) -> ms.database.TuningRecord | None:
        entry = self.entries.get(tvm_ffi.structural_hash(mod))
        if entry is None or not tvm_ffi.structural_equal(entry.mod, mod):
            return None
        return entry.parsed


def _fastest_entries(directory: Path) -> dict[int, _Entry]:
    """Each workload's fastest record in `directory`'s database files, by structural hash."""
    workloads = _lines(directory / _FILES[0])
    fastest: dict[int, tuple[float, list]] = {}
    for index, record in map(json.loads, _lines(directory / _FILES[1])):
        secs = record[1]
        mean = sum(secs) / len(secs) if secs else float("inf")
        if index not in fastest or mean < fastest[index][0]:
            fastest[index] = (mean, record)
    entries: dict[int, _Entry] = {}
    for index, (mean, record) in fastest.items():
        key = tvm_ffi.structural_hash(_workload_mod(workloads[index]))
        if key not in entries or mean < entries[key].mean:
            entries[key] = _Entry(workloads[index], index, json.dumps(record), mean)
    return entries


def _read_index(directory: Path, digest: str) -> dict[int, _Entry] | None:
    """`INDEX_FILE`'s entries where it was written from these very files by this TVM; None otherwise (none
    written, a tuning run added records since, or another TVM's hashes)."""
    path = directory / INDEX_FILE
    if not path.is_file():
        return None
    try:
        index = json.loads(path.read_text())
        if index.get("format") != INDEX_FORMAT or index.get("tvm") != tvm.__version__:
            return None
        if index.get("digest") != digest:
            log.info("%s is older than the database beside it; reading the database", path)
            return None
        workloads = _lines(directory / _FILES[0])  # a few MB: the records are what is worth skipping
        return {
            int(key): _Entry(workloads[line], line, str(record), float(mean))
            for key, line, mean, record in index["entries"]
        }
    except (OSError, ValueError, TypeError, KeyError, AttributeError, IndexError) as exc:
        log.warning("%s unreadable (%s); reading the database beside it", path, exc)
        return None


def write_index(directory: Path) -> None:
    """Write `INDEX_FILE` for the databases under a device key's folder (its own and the baseline's), from
    their files as they are now (tuning and revalidation call this when they finish)."""
    for folder, digest in _folders(Path(directory)).items():
        if not (folder / _FILES[1]).is_file():
            continue
        entries = _fastest_entries(folder)
        index = {
            "format": INDEX_FORMAT,
            "tvm": tvm.__version__,
            "digest": digest,
            "entries": [[key, e.line, e.mean, e.record] for key, e in sorted(entries.items())],
        }
        atomic_write(folder / INDEX_FILE, json.dumps(index).encode())


def _top(database: ms.database.Database | _Fastest, mod: tvm.IRModule) -> ms.database.TuningRecord | None:
    if isinstance(database, _Fastest):
        return database.top(mod)
    if not database.has_workload(mod):
        return None
    top = database.get_top_k(database.commit_workload(mod), 1)
    return top[0] if top and _valid(top[0]) else None


def mean_us(run_secs) -> float:
    """A record's measured time (MetaSchedule keeps one per repeat, in seconds), in us."""
    return 1e6 * sum(float(s) for s in run_secs) / len(run_secs)


class TuningDatabase:
    """The records of one device key (searched and baseline), ready to apply while lowering.

    `fastest_only`: each workload's fastest record, read-only (what applying needs, in a fraction of the
    time); otherwise MetaSchedule's whole database, which tuning reads and writes."""

    def __init__(self, directory: Path, key: str, *, fastest_only: bool = False):
        self.directory = directory
        self.key = key
        self.fastest_only = fastest_only
        folders = _folders(directory)
        baseline = directory / BASELINE_DIR
        if fastest_only:
            self.database = _Fastest(directory, folders[directory])
            self.baseline = _Fastest(baseline, folders[baseline]) if baseline.is_dir() else None
        else:
            self.database = _json_database(directory)
            self.baseline = _json_database(baseline) if baseline.is_dir() else None
        self.digest = _combined(folders)
        #: the sizes symbolic dims were fixed at when these records were tuned (`SIZES_FILE`)
        self.sizes = read_sizes(directory)
        self._anchors: ms.database.MemoryDatabase | None = None
        #: fastest_only: each anchor class's records as stored, by the class's first workload's hash
        self._anchor_entries: dict[int, list[_Entry]] = {}

    def __len__(self) -> int:
        return len(self.database) + (len(self.baseline) if self.baseline is not None else 0)

    def _databases(self) -> list[ms.database.Database | _Fastest]:
        return [self.database] + ([self.baseline] if self.baseline is not None else [])

    def all_records(self) -> list[ms.database.TuningRecord]:
        """Every record, searched and baseline (revalidation measures their kernels on another host)."""
        if self.fastest_only:
            parsed = (e.parsed for db in self._databases() for e in db.entries.values())
            return [r for r in parsed if r is not None]
        return [r for database in self._databases() for r in database.get_all_tuning_records()]

    def searched_trials(self, mod: tvm.IRModule) -> int:
        """How many searched schedules of `mod` were measured: MetaSchedule commits each as it runs,
        so this is where a search killed mid-task resumes (the state file only counts finished tasks)."""
        if not self.database.has_workload(mod):
            return 0
        return len(self.database.get_top_k(self.database.commit_workload(mod), 1 << 30))

    def commit_baseline(self, mod: tvm.IRModule, trace: s_tir.Trace, run_secs, target, args_info) -> None:
        """Keep the default rules' measured schedule of a kernel (see the module docstring)."""
        if self.baseline is None:
            (self.directory / BASELINE_DIR).mkdir(parents=True, exist_ok=True)
            self.baseline = _json_database(self.directory / BASELINE_DIR)
        self._commit(self.baseline, mod, trace, run_secs, target, args_info)

    def top_searched(self, mod: tvm.IRModule) -> ms.database.TuningRecord | None:
        """The fastest valid searched record of `mod`'s own workload."""
        return _top(self.database, mod)

    def commit_searched(self, mod: tvm.IRModule, trace: s_tir.Trace, run_secs, target, args_info) -> None:
        """Record a searched schedule measured again (the
        database keeps every measurement; the fastest counts)."""
        self._commit(self.database, mod, trace, run_secs, target, args_info)

    def _commit(
        self,
        database: ms.database.Database,
        mod: tvm.IRModule,
        trace: s_tir.Trace,
        run_secs,
        target,
        args_info,
    ) -> None:
        if self.fastest_only:
            raise RuntimeError(f"{self.directory}: opened fastest_only (read-only); commits would be lost")
        workload = database.commit_workload(mod)
        database.commit_tuning_record(ms.database.TuningRecord(trace, workload, run_secs, target, args_info))
        self._anchors = None  # rebuilt from the records on its next use

    def best(self, mod: tvm.IRModule) -> RecordMatch | None:
        """The record to apply to `mod` (a one-function module): its own workload's, else its anchor op's."""
        return self.exact(mod) or self.anchor(mod)

    def exact(self, mod: tvm.IRModule) -> RecordMatch | None:
        """The record of `mod`'s own workload: the searched one where it beat the default rule's by
        `SEARCHED_MARGIN`, else the rule's."""
        searched = _top(self.database, mod)
        rule = _top(self.baseline, mod) if self.baseline is not None else None
        if searched is not None and rule is not None:
            faster = mean_us(searched.run_secs) < (1 - SEARCHED_MARGIN) * mean_us(rule.run_secs)
            return RecordMatch(searched if faster else rule, "exact")
        if searched is not None or rule is not None:
            return RecordMatch(searched or rule, "exact")
        return None

    def anchor(self, mod: tvm.IRModule) -> RecordMatch | None:
        """The record of a kernel with `mod`'s anchor op (another epilogue), transferred by its trace."""
        record = self._anchor_top(mod) if self.fastest_only else _top(self._anchor_database(), mod)
        return RecordMatch(record, "anchor") if record is not None else None

    def _anchor_top(self, mod: tvm.IRModule) -> ms.database.TuningRecord | None:
        """`anchor` on a fastest_only database: the workloads are classed by anchor block once (MetaSchedule's
        own equality), and only the fastest valid record of `mod`'s class is parsed."""
        if self._anchors is None:
            self._anchors = ms.database.MemoryDatabase(module_equality="anchor-block")
            for db in self._databases():
                for entry in db.entries.values():
                    first = self._anchors.commit_workload(entry.mod)
                    self._anchor_entries.setdefault(tvm_ffi.structural_hash(first.mod), []).append(entry)
        if not self._anchors.has_workload(mod):
            return None
        first = self._anchors.commit_workload(mod)
        for entry in sorted(self._anchor_entries[tvm_ffi.structural_hash(first.mod)], key=lambda e: e.mean):
            record = entry.parsed
            if record is not None:
                return record
        return None

    def _anchor_database(self) -> ms.database.MemoryDatabase:
        """The records re-keyed by anchor block (built once, on the first kernel without its own record)."""
        if self._anchors is None:
            self._anchors = ms.database.MemoryDatabase(module_equality="anchor-block")
            for record in self.all_records():
                if _valid(record):
                    workload = self._anchors.commit_workload(record.workload.mod)
                    self._anchors.commit_tuning_record(
                        ms.database.TuningRecord(
                            record.trace, workload, record.run_secs, record.target, record.args_info
                        )
                    )
        return self._anchors


def _folder_digest(folder: Path) -> str:
    """sha256 over one database's files (what `INDEX_FILE` was written from)."""
    digest = hashlib.sha256()
    for name in _FILES:
        path = folder / name
        if path.is_file():
            digest.update(name.encode() + b"\0")
            digest.update(path.read_bytes())
    return digest.hexdigest()


def _folders(directory: Path) -> dict[Path, str]:
    """The digest of a device key's database and of its baseline, each read once."""
    return {folder: _folder_digest(folder) for folder in (Path(directory), Path(directory) / BASELINE_DIR)}


def _combined(folders: dict[Path, str]) -> str:
    """sha256 over a device key's database files (baseline included): part of compile-cache keys, so new
    records invalidate old builds (`TuningDatabase.digest`)."""
    digest = hashlib.sha256()
    for folder, folder_digest in folders.items():
        digest.update(f"{folder.name}\0{folder_digest}\0".encode())
    return digest.hexdigest()


def open_database(
    log_dir: str | Path, target: tvm.target.Target, *, quiet: bool = False, fastest_only: bool = False
) -> TuningDatabase | None:
    """The database for this target's device key under `log_dir`, or None (logged unless `quiet`) when
    there is none."""
    directory = device_log_dir(log_dir, target)
    if not (directory / _FILES[1]).is_file():
        if quiet:
            return None
        others = (
            sorted(p.name for p in Path(log_dir).iterdir() if p.is_dir()) if Path(log_dir).is_dir() else []
        )
        refused = refused_keys(log_dir, target)
        listed = ", ".join(f"{k} (not applied: {refused[k]})" if k in refused else k for k in others)
        log.warning(
            "no tuning records for device %s under %s%s; using default schedules",
            device_key(target),
            log_dir,
            f" (records exist for: {listed})" if others else "",
        )
        return None
    return TuningDatabase(directory, device_key(target), fastest_only=fastest_only)


class TuningRecords:
    """What a host applies: its own key's records first, then, for a kernel its own key has none for,
    those of compatible keys, closest first (exact workloads before anchor transfers, in both)."""

    def __init__(self, own: TuningDatabase | None, transferred: list[tuple[TuningDatabase, CompatibleKey]]):
        self.own = own
        self.transferred = transferred
        digest = hashlib.sha256()
        for db in self.databases:
            digest.update(f"{db.key}\0{db.digest}\0".encode())
        #: compile-cache keys and EPContext notes: which keys' records, and which versions of them
        self.digest = digest.hexdigest()

    @property
    def databases(self) -> list[TuningDatabase]:
        return ([self.own] if self.own is not None else []) + [db for db, _ in self.transferred]

    @property
    def sizes(self) -> dict[str, tuple[int, ...]]:
        """Per dim name, every size any of these keys' records were tuned at."""
        return merge_sizes(*(db.sizes for db in self.databases))

    @property
    def sources(self) -> tuple[str, ...]:
        """The device keys whose records may apply, in the order they are asked."""
        return tuple(db.key for db in self.databases)

    def __len__(self) -> int:
        return sum(len(db) for db in self.databases)

    def best(self, mod: tvm.IRModule) -> RecordMatch | None:
        for find in (TuningDatabase.exact, TuningDatabase.anchor):
            for db in self.databases:
                match = find(db, mod)
                if match is not None:
                    return match if db is self.own else replace(match, transferred_from=db.key)
        return None


def open_records(log_dir: str | Path, target: tvm.target.Target) -> TuningRecords | None:
    """This host's records and those of compatible keys under `log_dir`; None (logged) when there are none."""
    own = open_database(log_dir, target, quiet=True, fastest_only=True)
    transferred = [
        (TuningDatabase(Path(log_dir) / k.key, k.key, fastest_only=True), k)
        for k in compatible_keys(log_dir, target)
        if (Path(log_dir) / k.key / _FILES[1]).is_file()
    ]
    if own is None and not transferred:
        open_database(log_dir, target)  # says why nothing applies
        return None
    if transferred:
        log.info(
            "tuning records of %s apply where %s has none: %s",
            ", ".join(k.key for _, k in transferred),
            device_key(target),
            "; ".join(f"{k.key}: {k.closeness}" for _, k in transferred),
        )
    return TuningRecords(own, transferred)


def _schedule(func: tvm.tirx.PrimFunc, match: RecordMatch, target: tvm.target.Target) -> tvm.tirx.PrimFunc:
    """`func` scheduled by the record's trace (replayed, or transferred from the anchor op's kernel)."""
    mod = workload_module(func)
    if match.how == "exact" or tvm_ffi.structural_equal(match.record.workload.mod, mod):
        # The record's own module, not `func`: structural equality ignores names, but the trace finds its
        # blocks by name, and block names follow the input's (a LayerNorm of `lv20` has block `lv20_sum`).
        sch = replay(match.record)
    else:
        sch = s_tir.Schedule(mod)
        schedule_using_anchor_trace(sch, match.record.trace, target)
    scheduled = sch.mod["main"]
    if match.how == "anchor":
        tvm.compile(
            tvm.IRModule({"main": scheduled}), target, tir_pipeline=tir_pipeline_for(target)
        )  # a transferred trace must build, or the rules take over
    return scheduled.without_attr("global_symbol")


@tvm.transform.module_pass(opt_level=0, name="nxrt_tvm.ApplyTuningRecords")
class ApplyTuningRecords:
    """Schedule each PrimFunc from the device's records
    (see the module docstring); tag how with `TUNING_ATTR`.

    Runs inside the target's scope, before the default schedule rules, which
    then take every function left unscheduled.
    """

    def __init__(self, database: TuningDatabase | TuningRecords):
        self.database = database

    @own_pass
    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        target = tvm.target.Target.current(allow_none=False)
        updates = {}
        for gvar, func in mod.functions_items():
            if not isinstance(func, tvm.tirx.PrimFunc) or (
                func.attrs is not None and func.attrs.get("tirx.is_scheduled", False)
            ):
                continue
            match = self.database.best(workload_module(func))
            if match is None:
                continue
            source = "" if match.transferred_from is None else f"@{match.transferred_from}"
            if not is_searched(match.record.trace):
                updates[gvar] = func.with_attr(TUNING_ATTR, "rule-best" + source)
                continue
            try:
                scheduled = _schedule(func, match, target)
            except Exception as exc:  # noqa: BLE001 - a record that does not fit keeps the default rules
                log.warning(
                    "tuning record for %s not applied (default rules kept): %s",
                    gvar.name_hint,
                    str(exc).splitlines()[0] if str(exc) else type(exc).__name__,
                )
                updates[gvar] = func.with_attr(TUNING_ATTR, "unfit")
                continue
            updates[gvar] = scheduled.with_attr("tirx.is_scheduled", True).with_attr(
                TUNING_ATTR, match.how + source
            )
        for gvar, func in updates.items():
            mod[gvar] = func
        return mod
