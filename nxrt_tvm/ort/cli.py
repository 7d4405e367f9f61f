"""`nxrt-tvm ort-plugin build`: build (or find cached) the ONNX Runtime plugin library and print its path."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

__all__ = ["add_cli"]


def _cmd_build(args: argparse.Namespace) -> int:
    from .build import EP_NAME, PluginBuildError, PluginCompileError, build_plugin

    try:
        path = build_plugin(args.include_dir, output_dir=args.output_dir, compiler=args.cc, force=args.force)
    except (PluginBuildError, PluginCompileError) as exc:
        print(f"nxrt-tvm: error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({"library": str(path), "ep_name": EP_NAME}, indent=2))
    else:
        print(path)
    return 0


def add_cli(subparsers: argparse._SubParsersAction) -> None:
    """Add `ort-plugin build` to the `nxrt-tvm` command's subparsers."""
    plugin = subparsers.add_parser(
        "ort-plugin", help="the plugin EP library that runs EPContext models in stock onnxruntime"
    )
    actions = plugin.add_subparsers(dest="ort_plugin_command", required=True)
    build = actions.add_parser(
        "build",
        help="build the plugin with the system C compiler (cached) and print its path",
        description=(
            "Build the plugin EP library (ORT headers from --include-dir, NXRT_TVM_ORT_INCLUDE, or the npm "
            "package fetched once) and print its path; register it with "
            "onnxruntime.register_execution_provider_library('TvmExecutionProvider', PATH)."
        ),
    )
    build.add_argument(
        "--include-dir", type=Path, help="folder holding onnxruntime_c_api.h and onnxruntime_ep_c_api.h"
    )
    build.add_argument(
        "--output-dir", type=Path, help="where to put the library (default: the nxrt-tvm cache)"
    )
    build.add_argument("--cc", help="C compiler (default: $CC, cc, gcc or clang)")
    build.add_argument("--force", action="store_true", help="rebuild even when a cached build matches")
    build.add_argument("--json", action="store_true", help="machine-readable output")
    build.set_defaults(func=_cmd_build)
