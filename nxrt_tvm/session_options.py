"""Session options in onnxruntime's words: string config entries such as ``ep.context_enable``."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from .api.errors import InvalidProviderOptions
from .options import as_bool, as_choice, as_int

__all__ = ["SessionOptions", "SessionConfig", "CONFIG_KEYS", "DEFAULT_SHAPE_SPECIALISATIONS"]

#: input shapes a symbolic model is built for again when calls repeat them (`runtime.specialise`): each
#: build costs a compile (or a cache load) and a copy of the weights
DEFAULT_SHAPE_SPECIALISATIONS = 2

#: Config keys and what they mean (onnxruntime's names where onnxruntime has one).
CONFIG_KEYS = {
    "ep.context_enable": "'1': after compiling, write the model with EPContext nodes",
    "ep.context_file_path": "where to write it (default: MODEL_ctx.onnx beside the model)",
    "ep.context_embed_mode": "'1' (default): blobs inside the model; '0': blob files beside it",
    "session.disable_model_compile": (
        "'1': any compile is an error (deploy precompiled EPContext models only)"
    ),
    "nxrt.context_on_mismatch": (
        "'error' (default), 'recompile' or 'fallback' for blobs this host cannot load"
    ),
    "nxrt.trusted_keys": (
        "PEM public keys or X.509 certificates whose signatures count (`compile --sign`): paths, ',' or ';'"
        " separated"
    ),
    "nxrt.require_signature": "'1': load no blob of a model that a trusted key has not signed",
    "nxrt.shape_specialisations": (
        "most input shapes a model with symbolic dims is built for again, once calls repeat them"
        f" (default '{DEFAULT_SHAPE_SPECIALISATIONS}'; '0': never)"
    ),
    "nxrt.symbolic_compile": (
        "'deferred' (default): a model with symbolic input dims runs on the fallback until its input"
        " shapes recur or vary, then builds for them; 'load': build the symbolic plan when the session"
        " is made"
    ),
}

_ON_MISMATCH = ("error", "recompile", "fallback")
_SYMBOLIC_COMPILE = ("deferred", "load")


class SessionOptions:
    """Like `onnxruntime.SessionOptions` for what nxrt-tvm reads: `intra_op_num_threads`, free dimension
    overrides and config entries by string key. Setting any other attribute raises: an onnxruntime option
    nxrt-tvm does not read would otherwise be silently ignored."""

    __slots__ = ("_entries", "_free_dims", "_threads")

    def __init__(self) -> None:
        self._entries: dict[str, str] = {}
        self._free_dims: dict[str, int] = {}
        self._threads = 0

    @property
    def intra_op_num_threads(self) -> int:
        """Threads of the session's kernels, TVM's and the fallback's (0: every core this process may
        use). TVM's pool cannot grow past `TVM_NUM_THREADS`, read when nxrt_tvm is imported."""
        return self._threads

    @intra_op_num_threads.setter
    def intra_op_num_threads(self, value: int) -> None:
        self._threads = _threads(value)

    def __setattr__(self, name: str, value: Any) -> None:
        if name not in SessionOptions.__slots__ and name != "intra_op_num_threads":
            raise AttributeError(
                f"nxrt_tvm.SessionOptions has no option {name!r}; it reads intra_op_num_threads, "
                "add_free_dimension_override_by_name and add_session_config_entry "
                f"(keys: {sorted(CONFIG_KEYS)})"
            )
        object.__setattr__(self, name, value)

    def add_free_dimension_override_by_name(self, dim_name: str, dim_value: int) -> None:
        """Fix a symbolic input dim (e.g. ``batch``) to a size,
        as onnxruntime does: static shapes let TVM claim more."""
        if int(dim_value) < 0:
            raise InvalidProviderOptions(f"free dimension {dim_name!r} must be >= 0, got {dim_value}")
        self._free_dims[str(dim_name)] = int(dim_value)

    def free_dimension_overrides(self) -> dict[str, int]:
        return dict(self._free_dims)

    def add_session_config_entry(self, key: str, value: str) -> None:
        if key not in CONFIG_KEYS:
            raise InvalidProviderOptions(
                f"unknown session config key {key!r}; known keys: {sorted(CONFIG_KEYS)}"
            )
        self._entries[key] = str(value)

    def get_session_config_entry(self, key: str) -> str:
        return self._entries[key]

    def entries(self) -> dict[str, str]:
        return dict(self._entries)


def _threads(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
        raise InvalidProviderOptions(f"intra_op_num_threads must be an int >= 0 (0: all cores): {value!r}")
    return int(value)


def _flag(entries: Mapping[str, str], key: str) -> bool:
    return as_bool(key, entries.get(key, "0"), "session config")


@dataclass(frozen=True)
class SessionConfig:
    """Parsed session options."""

    context_enable: bool = False
    context_file_path: str | None = None
    context_embed_mode: int = 1
    disable_model_compile: bool = False
    context_on_mismatch: str = "error"
    trusted_keys: tuple[str, ...] = ()
    require_signature: bool = False
    free_dimension_overrides: tuple[tuple[str, int], ...] = ()
    intra_op_num_threads: int = 0  #: 0: every core this process may use
    shape_specialisations: int = DEFAULT_SHAPE_SPECIALISATIONS
    symbolic_compile: str = "deferred"

    @classmethod
    def parse(cls, options: Any) -> "SessionConfig":
        if options is None:
            return cls()
        free_dims: dict[str, int] = {}
        threads = 0
        if isinstance(options, SessionOptions):
            entries = options.entries()
            free_dims = options.free_dimension_overrides()
            threads = options.intra_op_num_threads
        elif isinstance(options, Mapping):
            entries = {str(k): str(v) for k, v in options.items()}
            unknown = sorted(set(entries) - set(CONFIG_KEYS))
            if unknown:
                raise InvalidProviderOptions(
                    f"unknown session config key(s) {unknown}; known keys: {sorted(CONFIG_KEYS)}"
                )
        elif hasattr(options, "get_session_config_entry"):  # an onnxruntime.SessionOptions
            threads = _threads(getattr(options, "intra_op_num_threads", 0))
            entries = {}
            for key in CONFIG_KEYS:
                try:
                    entries[key] = options.get_session_config_entry(key)
                except Exception:  # onnxruntime raises when a key is unset
                    continue
        else:
            raise InvalidProviderOptions(
                f"sess_options must be a SessionOptions or a dict, got {type(options).__name__}"
            )
        embed = entries.get("ep.context_embed_mode", "1")
        if embed not in ("0", "1"):
            raise InvalidProviderOptions(f"ep.context_embed_mode must be '0' or '1', got {embed!r}")
        mismatch = as_choice(
            "nxrt.context_on_mismatch", entries.get("nxrt.context_on_mismatch", "error"), _ON_MISMATCH
        )
        symbolic_compile = as_choice(
            "nxrt.symbolic_compile", entries.get("nxrt.symbolic_compile", "deferred"), _SYMBOLIC_COMPILE
        )
        specialisations = as_int(
            "nxrt.shape_specialisations",
            entries.get("nxrt.shape_specialisations", DEFAULT_SHAPE_SPECIALISATIONS),
        )
        trusted_keys = [p.strip() for p in re.split("[,;]", entries.get("nxrt.trusted_keys", ""))]
        return cls(
            context_enable=_flag(entries, "ep.context_enable"),
            context_file_path=entries.get("ep.context_file_path") or None,
            context_embed_mode=int(embed),
            disable_model_compile=_flag(entries, "session.disable_model_compile"),
            context_on_mismatch=mismatch,
            trusted_keys=tuple(p for p in trusted_keys if p),
            require_signature=_flag(entries, "nxrt.require_signature"),
            free_dimension_overrides=tuple(sorted(free_dims.items())),
            intra_op_num_threads=threads,
            shape_specialisations=specialisations,
            symbolic_compile=symbolic_compile,
        )
