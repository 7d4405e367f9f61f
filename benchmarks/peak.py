"""The CPU's measured fp32 peak, the yardstick for GEMM GFLOP/s (a clock read from /proc/cpuinfo is not one:
turbo, AVX-512 clocks and 256-bit FMA datapaths all change it).

    python benchmarks/peak.py [--threads N]

Builds `fma_peak.c` (24 independent vector-FMA chains per thread) with the system C compiler and
``-march=native``, runs it, and returns the best of three runs.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

SOURCE = Path(__file__).resolve().parent / "fma_peak.c"


def fp32_peak_gflops(threads: int, runs: int = 3) -> float:
    """Best of `runs` measurements of `threads` threads of back-to-back fp32 FMAs, in GFLOP/s."""
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise RuntimeError("measuring the fp32 peak needs a C compiler (cc or gcc) on PATH")
    with tempfile.TemporaryDirectory(prefix="nxrt-peak-") as tmp:
        exe = Path(tmp) / "fma_peak"
        subprocess.run(
            [cc, "-O2", "-march=native", "-ffp-contract=fast", "-pthread", str(SOURCE), "-o", str(exe)],
            check=True,
            capture_output=True,
        )
        results = [
            float(
                subprocess.run(
                    [str(exe), str(threads)], check=True, capture_output=True, text=True
                ).stdout.split()[0]
            )
            for _ in range(runs)
        ]
    return max(results)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    args = parser.parse_args()
    print(f"fp32 peak, {args.threads} thread(s): {fp32_peak_gflops(args.threads):.0f} GFLOP/s")


if __name__ == "__main__":
    main()
