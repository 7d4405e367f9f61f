"""Run nxrt-tvm's EPContext models in stock onnxruntime: a plugin EP library over the TVM runtime.

    import onnxruntime as ort
    import nxrt_tvm.ort
    nxrt_tvm.ort.register(ort)                 # builds the plugin once (cached), registers it
    sess = ort.InferenceSession("model_ctx.onnx", nxrt_tvm.ort.session_options(ort))

The plugin (sources in `plugin/`) claims the EPContext nodes whose `source` is
``TvmExecutionProvider`` and whose blob passes the checks `nxrt_tvm.epcontext.compat`
makes; ORT's CPU EP runs every other node.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from .build import (
    EP_NAME,
    NPM_PACKAGE,
    PluginBuildError,
    PluginCompileError,
    build_plugin,
    cache_root,
    ort_headers,
    plugin_source_dir,
)

__all__ = [
    "EP_NAME",
    "NPM_PACKAGE",
    "PluginBuildError",
    "PluginCompileError",
    "build_plugin",
    "cache_root",
    "ort_headers",
    "plugin_source_dir",
    "register",
    "ep_devices",
    "session_options",
]


def _ort(ort_module: Any | None) -> Any:
    if ort_module is not None:
        return ort_module
    import onnxruntime

    return onnxruntime


def ep_devices(ort_module: Any | None = None) -> list:
    """The `OrtEpDevice`s the registered plugin offers (one: the CPU)."""
    return [d for d in _ort(ort_module).get_ep_devices() if d.ep_name == EP_NAME]


def register(
    ort_module: Any | None = None,
    *,
    library: str | os.PathLike | None = None,
    registration_name: str = EP_NAME,
    **build_options: Any,
) -> Path:
    """Register the plugin with `ort_module` (default:
    `onnxruntime`); builds it first unless `library` is given.

    Registering again under the same name is a no-op. Returns the library's path.
    """
    ort = _ort(ort_module)
    path = Path(library) if library is not None else build_plugin(**build_options)
    if not ep_devices(ort):
        ort.register_execution_provider_library(registration_name, str(path))
    return path


def session_options(
    ort_module: Any | None = None, provider_options: dict[str, str] | None = None, base: Any | None = None
) -> Any:
    """`SessionOptions` that put the plugin first; ORT's CPU EP takes every node it does not claim."""
    ort = _ort(ort_module)
    options = base if base is not None else ort.SessionOptions()
    devices = ep_devices(ort)
    if not devices:
        raise PluginBuildError(
            "the nxrt-tvm plugin is not registered with this onnxruntime; call nxrt_tvm.ort.register() first"
        )
    options.add_provider_for_devices(devices, dict(provider_options or {}))
    return options
