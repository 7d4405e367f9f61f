"""The TVM EP's options: checked once, into a frozen record (onnxruntime passes them as strings)."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

import tvm

from ...api.errors import InvalidProviderOptions
from ...lower.schedules import CONV_ALGORITHMS
from ...lower.target import make_target
from ...options import as_bool, as_choice, as_int, as_seconds, as_str_list, reject_unknown
from .cost import CLAIM_POLICIES

__all__ = ["CLAIM_POLICY_ENV", "TvmOptions"]

#: sets the default claim_policy (a CI job that wants every partition compiled sets it to "all")
CLAIM_POLICY_ENV = "NXRT_TVM_CLAIM_POLICY"


def _env_defaults() -> dict[str, Any]:
    policy = os.environ.get(CLAIM_POLICY_ENV)
    return {} if not policy else {"claim_policy": policy}


@dataclass(frozen=True)
class TvmOptions:
    """Every option of `TvmExecutionProvider`, validated (see the README's option table)."""

    target: tvm.target.Target
    min_subgraph_size: int = 1
    op_types_to_exclude: frozenset[str] = frozenset()
    passes: tuple[tvm.transform.Pass, ...] = ()
    #: None: the default schedule rules
    schedule_passes: tuple[tvm.transform.Pass, ...] | None = None
    conv_algorithm: str = "auto"
    tuning_logs: str | os.PathLike | None = None
    weightless: bool = False
    cache_dir: str | os.PathLike | None = None
    cache_max_bytes: int | None = 2 * 1024**3
    claim_policy: str = "auto"
    cost_budget_s: float = 0.2
    compile_isolation: str = "process"
    compile_timeout_s: float = 600.0

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))

    @classmethod
    def parse(cls, ep: str, options: Mapping[str, Any]) -> TvmOptions:
        """Check `options` (keywords or onnxruntime's strings); raise `InvalidProviderOptions` saying what
        is wrong."""
        reject_unknown(ep, options, cls.names())
        given = (
            {f.name: f.default for f in fields(cls) if f.name != "target"} | _env_defaults() | dict(options)
        )
        for option in ("passes", "schedule_passes"):
            value: Sequence[Any] = given[option] or ()
            if any(not isinstance(p, tvm.transform.Pass) for p in value):
                raise InvalidProviderOptions(
                    f"option {option!r} must be a list of tvm.transform.Pass objects"
                )
        as_choice("conv_algorithm", given["conv_algorithm"], CONV_ALGORITHMS)
        source = "claim_policy" if "claim_policy" in options else f"{CLAIM_POLICY_ENV} (the environment)"
        as_choice(source, given["claim_policy"], CLAIM_POLICIES)
        as_choice("compile_isolation", given["compile_isolation"], ("process", "none"))
        max_bytes = given["cache_max_bytes"]
        schedule_passes = given["schedule_passes"]
        return cls(
            target=make_target(given.get("target", "llvm")),
            min_subgraph_size=as_int("min_subgraph_size", given["min_subgraph_size"], minimum=1),
            op_types_to_exclude=frozenset(as_str_list("op_types_to_exclude", given["op_types_to_exclude"])),
            passes=tuple(given["passes"] or ()),
            schedule_passes=None if schedule_passes is None else tuple(schedule_passes),
            conv_algorithm=given["conv_algorithm"],
            tuning_logs=_unset_if_empty(given["tuning_logs"]),
            weightless=as_bool("weightless", given["weightless"]),
            cache_dir=_unset_if_empty(given["cache_dir"]),
            cache_max_bytes=None if max_bytes is None else as_int("cache_max_bytes", max_bytes, 1),
            claim_policy=given["claim_policy"],
            cost_budget_s=as_seconds("cost_budget_s", given["cost_budget_s"]),
            compile_isolation=given["compile_isolation"],
            compile_timeout_s=as_seconds("compile_timeout_s", given["compile_timeout_s"]),
        )


def _unset_if_empty(path: str | os.PathLike | None) -> str | os.PathLike | None:
    """An empty path is no path, as onnxruntime's providers read their path options: `cache_dir=""` had
    made the working directory a compile cache."""
    return None if isinstance(path, str) and not path.strip() else path
