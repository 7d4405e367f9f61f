"""Kernels' code generation in parallel: `lower.build.ShardCodegen` in forked processes.

LLVM's code generation of a partition's kernels is most of its build (mobilenet_v2: 3.0 of 5.1 s), one
kernel after another on one core. The kernels are independent functions, so a build splits them into
modules, each child builds one into an object file, and the export links them into the one library,
as it links any multi-module build. Children are forked like the isolated build itself (`isolate`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import tvm

from ..api.errors import CompileFailed
from ..lower.tir_pipeline import tir_pipeline_for
from .isolate import Isolated, start_isolated

__all__ = ["ParallelCodegen"]


class ParallelCodegen:
    """Builds each module given to it in a forked child, into an object file in `directory`; `objects`
    lists every file written so far (what `artifact.export_executable` links in)."""

    def __init__(self, jobs: int, directory: str | Path, timeout_s: float, what: str):
        self.jobs = jobs
        self.directory = Path(directory)
        self.timeout_s = timeout_s
        self.what = what
        self.objects: list[str] = []

    def __call__(self, modules: Sequence[tvm.IRModule], target: tvm.target.Target) -> Callable[[], None]:
        children: list[tuple[Isolated, str]] = []
        for module in modules:
            path = str(self.directory / f"kernels{len(self.objects) + len(children)}.o")

            def build(module: tvm.IRModule = module, path: str = path) -> None:
                lib = tvm.tirx.build(module, target=target, pipeline=tir_pipeline_for(target))
                lib.write_to_file(path)

            what = f"{len(module.functions)} kernels of {self.what}"
            children.append((start_isolated(build, what), path))

        def wait() -> None:
            try:
                for child, path in children:
                    child.result(self.timeout_s)
                    if not Path(path).is_file():
                        raise CompileFailed(f"the code generation of {child.what} wrote no object file")
                    self.objects.append(path)
            except BaseException:
                for child, _ in children:
                    if not child.done:
                        child.kill()
                raise

        return wait
