"""Build the ONNX Runtime plugin EP library (`plugin/`) with the system C compiler.

ORT's C headers come from a package, never from a hand-written copy (the ABI
must be the one ORT ships): a directory the user names (`include_dir`, or the
``NXRT_TVM_ORT_INCLUDE`` environment variable), else the npm package
`com.github.asus4.onnxruntime` fetched once with ``npm pack`` into the cache.
The built library is cached under a key of everything that shapes it (sources,
headers, TVM and TVM-FFI versions and paths, compiler, flags, this host's CPU as
LLVM names it, OpenSSL), so a change to any of them rebuilds it and nothing else does.

Signature checks use OpenSSL's libcrypto where its headers are found (``-lcrypto``);
without them (or with ``NXRT_TVM_ORT_OPENSSL=0``) the plugin is built without it and
loads no code of a signed model, nor of any model when a signature is required.
"""

from __future__ import annotations

import hashlib
import logging
import os
import platform
import re
import shutil
import subprocess
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock

__all__ = [
    "PluginBuildError",
    "PluginCompileError",
    "EP_NAME",
    "NPM_PACKAGE",
    "plugin_source_dir",
    "cache_root",
    "ort_headers",
    "build_plugin",
]

log = logging.getLogger(__name__)

EP_NAME = "TvmExecutionProvider"
LIBRARY_NAME = "libnxrt_tvm_ep.so"
#: npm package (MIT) that carries ORT's C headers, and where they sit inside it
NPM_PACKAGE = "com.github.asus4.onnxruntime@0.4.9"
NPM_HEADERS = "package/Plugins/iOS~/onnxruntime.xcframework/ios-arm64/onnxruntime.framework/Headers"
REQUIRED_HEADERS = ("onnxruntime_c_api.h", "onnxruntime_ep_c_api.h", "onnxruntime_error_code.h")
#: the plugin-EP ABI the plugin is written against (OrtEp::Compile, GetTensorElementTypeAndShapeDataReference)
MIN_ORT_API_VERSION = 24
CFLAGS = (
    "-std=c11",
    "-D_GNU_SOURCE",
    "-O2",
    "-Wall",
    "-Wno-missing-field-initializers",
    "-fPIC",
    "-shared",
    "-fvisibility=hidden",
)


class PluginBuildError(RuntimeError):
    """The plugin cannot be built here (no compiler, npm or headers); the message says how to supply them."""


class PluginCompileError(RuntimeError):
    """The compiler rejected the plugin's sources: a bug to report, not a missing tool."""


def plugin_source_dir() -> Path:
    """The C sources: ``NXRT_TVM_ORT_PLUGIN_SRC`` or the repository's `plugin/` folder."""
    env = os.environ.get("NXRT_TVM_ORT_PLUGIN_SRC")
    path = Path(env) if env else Path(__file__).resolve().parents[2] / "plugin"
    if not (path / "ep.c").is_file():
        raise PluginBuildError(
            f"the plugin sources are not at {path}; set NXRT_TVM_ORT_PLUGIN_SRC to the plugin/ folder"
        )
    return path


def cache_root() -> Path:
    """``NXRT_TVM_CACHE_DIR``, else ``$XDG_CACHE_HOME/nxrt-tvm`` (``~/.cache/nxrt-tvm``)."""
    env = os.environ.get("NXRT_TVM_CACHE_DIR")
    if env:
        return Path(env)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "nxrt-tvm"


def _api_version(include: Path) -> int:
    match = re.search(
        r"#define\s+ORT_API_VERSION\s+(\d+)", (include / "onnxruntime_c_api.h").read_text(errors="replace")
    )
    return int(match.group(1)) if match else 0


def _check_headers(include: Path, origin: str) -> Path:
    missing = [h for h in REQUIRED_HEADERS if not (include / h).is_file()]
    if missing:
        raise PluginBuildError(
            f"{origin} {include} lacks {', '.join(missing)}; point NXRT_TVM_ORT_INCLUDE at the folder "
            "that holds onnxruntime_c_api.h and onnxruntime_ep_c_api.h"
        )
    version = _api_version(include)
    if version < MIN_ORT_API_VERSION:
        raise PluginBuildError(
            f"{origin} {include} declares ORT_API_VERSION {version}; the plugin needs "
            f"{MIN_ORT_API_VERSION} or newer (onnxruntime >= 1.{MIN_ORT_API_VERSION} headers)"
        )
    return include


def _fetch_npm_headers(dest: Path) -> None:
    npm = shutil.which("npm")
    if npm is None:
        raise PluginBuildError(
            "ONNX Runtime's C headers are needed to build the "
            "plugin: install npm (they are fetched once from the "
            f"npm package {NPM_PACKAGE}), or set NXRT_TVM_ORT_INCLUDE to a folder holding onnxruntime_c_api.h"
        )
    with tempfile.TemporaryDirectory(prefix=".npm-", dir=dest.parent) as tmp:
        log.info("fetching ONNX Runtime headers from npm (%s, ~150 MB, once)", NPM_PACKAGE)
        try:
            done = subprocess.run(
                [npm, "pack", NPM_PACKAGE, "--pack-destination", tmp, "--silent"],
                cwd=tmp,
                capture_output=True,
                text=True,
                timeout=900,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise PluginBuildError(
                f"`npm pack {NPM_PACKAGE}` failed: {exc}; set NXRT_TVM_ORT_INCLUDE instead"
            ) from exc
        tarballs = list(Path(tmp).glob("*.tgz"))
        if done.returncode != 0 or len(tarballs) != 1:
            raise PluginBuildError(
                f"`npm pack {NPM_PACKAGE}` failed ({done.stderr.strip()[-400:]}); "
                "set NXRT_TVM_ORT_INCLUDE to a folder holding ONNX Runtime's C headers"
            )
        staged = Path(tmp) / "headers"
        staged.mkdir()
        with tarfile.open(tarballs[0]) as tar:
            for member in tar.getmembers():
                parent, _, name = member.name.rpartition("/")
                if parent == NPM_HEADERS and member.isfile() and name.endswith(".h") and "/" not in name:
                    source = tar.extractfile(member)
                    (staged / name).write_bytes(source.read() if source else b"")
        _check_headers(staged, f"npm package {NPM_PACKAGE} at")
        os.replace(staged, dest)


def ort_headers(include_dir: str | os.PathLike | None = None) -> Path:
    """The folder holding ORT's C headers: `include_dir`,
    ``NXRT_TVM_ORT_INCLUDE``, or the npm package (cached)."""
    given = include_dir or os.environ.get("NXRT_TVM_ORT_INCLUDE")
    if given:
        return _check_headers(Path(given).resolve(), "the ONNX Runtime include folder")
    name, _, version = NPM_PACKAGE.rpartition("@")
    dest = cache_root() / "ort-headers" / f"{name}-{version}"
    if not dest.is_dir():
        dest.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(str(dest) + ".lock"):
            if not dest.is_dir():
                _fetch_npm_headers(dest)
    return _check_headers(dest, "the cached npm headers in")


@dataclass(frozen=True)
class _Toolchain:
    compiler: str
    compiler_version: str
    tvm_version: str
    ffi_include: Path
    ffi_lib_dir: Path
    tvm_runtime: Path
    #: LLVM's name for this host's CPU (the plugin's choice among a fat node's variants needs it: the
    #: TVM runtime has no LLVM to ask) and the CPU model it was read on ("vendor/family/model")
    host_cpu: str = ""
    host_cpu_id: str = ""
    #: OpenSSL's version text when its headers and libcrypto are found (signature checks), else ""
    openssl: str = ""


def _host_cpu() -> tuple[str, str]:
    """(LLVM's name for this CPU, "vendor/family/model" from /proc/cpuinfo); empty where either is unknown.

    The plugin compares the model id with the CPU it runs on, so a library that reaches another CPU model (a
    cache shared between hosts, a copied file) treats the name as unknown instead of trusting it.
    """
    try:
        from ..lower.target import host_cpu

        name = host_cpu()
    except Exception:  # a TVM without LLVM: the plugin ranks variants by their features alone
        return "", ""
    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                if not line.strip():
                    break  # the first processor is enough
                fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    parts = [fields.get(k, "") for k in ("vendor_id", "cpu family", "model")]
    return (name if re.fullmatch(r"[A-Za-z0-9_.+-]+", name) else ""), ("/".join(parts) if all(parts) else "")


def _openssl(compiler: str) -> str:
    """OpenSSL's version text where its headers reach `compiler` and libcrypto links; "" otherwise."""
    if os.environ.get("NXRT_TVM_ORT_OPENSSL", "1").strip().lower() in ("0", "false", "no", "off"):
        return ""
    probe = "#include <openssl/evp.h>\n#include <openssl/opensslv.h>\nnxrt_openssl OPENSSL_VERSION_TEXT\n"
    try:
        done = subprocess.run(
            [compiler, "-E", "-P", "-x", "c", "-"], input=probe, capture_output=True, text=True, timeout=60
        )
        library = subprocess.run(
            [compiler, "-print-file-name=libcrypto.so"], capture_output=True, text=True, timeout=60
        ).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return ""
    match = re.search(r"nxrt_openssl\s+\"([^\"]*)\"", done.stdout) if done.returncode == 0 else None
    if match is None or not os.path.isabs(library) or not os.path.exists(library):
        log.info(
            "building the ORT plugin without OpenSSL (no headers or libcrypto): signed models are declined"
        )
        return ""
    return match.group(1)


def _toolchain(compiler: str | None) -> _Toolchain:
    cc = (
        compiler or os.environ.get("CC") or next((c for c in ("cc", "gcc", "clang") if shutil.which(c)), None)
    )
    path = shutil.which(cc) if cc else None
    if path is None:
        raise PluginBuildError(
            "building the plugin needs a C compiler (cc, gcc or clang) on PATH, or CC set; "
            "install one (e.g. apt-get install gcc)"
        )
    try:
        version = subprocess.run(
            [path, "--version"], capture_output=True, text=True, timeout=60
        ).stdout.splitlines()[0]
    except (OSError, IndexError, subprocess.TimeoutExpired):
        version = "?"
    import tvm
    import tvm_ffi

    ffi_root = Path(tvm_ffi.__file__).parent
    runtime = Path(tvm.__file__).parent / "lib" / "libtvm_runtime.so"
    if (
        not (ffi_root / "include" / "tvm" / "ffi" / "c_api.h").is_file()
        or not (ffi_root / "lib" / "libtvm_ffi.so").is_file()
    ):
        raise PluginBuildError(
            f"apache-tvm-ffi at {ffi_root} ships no C headers or libtvm_ffi.so; reinstall it"
        )
    if not runtime.is_file():
        raise PluginBuildError(
            f"apache-tvm at {runtime.parent.parent} ships no lib/libtvm_runtime.so; reinstall it"
        )
    return _Toolchain(
        path,
        version,
        tvm.__version__,
        ffi_root / "include",
        ffi_root / "lib",
        runtime,
        *_host_cpu(),
        _openssl(path),
    )


def _build_key(sources: list[Path], include: Path, tc: _Toolchain) -> str:
    h = hashlib.sha256(b"nxrt-tvm.ort-plugin.v1\0")
    for part in (
        *CFLAGS,
        tc.compiler,
        tc.compiler_version,
        tc.tvm_version,
        str(tc.ffi_include),
        str(tc.ffi_lib_dir),
        str(tc.tvm_runtime),
        platform.machine(),
        tc.host_cpu,
        tc.host_cpu_id,
        tc.openssl,
    ):
        h.update(part.encode() + b"\0")
    for path in [
        *sources,
        *(include / n for n in REQUIRED_HEADERS),
        tc.ffi_include / "tvm" / "ffi" / "c_api.h",
    ]:
        h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:20]


def build_plugin(
    include_dir: str | os.PathLike | None = None,
    *,
    output_dir: str | os.PathLike | None = None,
    compiler: str | None = None,
    force: bool = False,
) -> Path:
    """The plugin library, built now if no cached build matches the current sources, headers and versions."""
    source_dir = plugin_source_dir()
    sources = sorted([*source_dir.glob("*.c"), *source_dir.glob("*.h")])
    include = ort_headers(include_dir)
    tc = _toolchain(compiler)
    key = _build_key(sources, include, tc)
    out_dir = Path(output_dir) if output_dir is not None else cache_root() / "ort-plugin" / key
    library = out_dir / LIBRARY_NAME
    if library.is_file() and not force:
        return library
    out_dir.mkdir(parents=True, exist_ok=True)
    with FileLock(str(out_dir / ".lock")):
        if library.is_file() and not force:
            return library
        fd, tmp = tempfile.mkstemp(prefix=f".{LIBRARY_NAME}.", suffix=".tmp", dir=out_dir)
        os.close(fd)
        command = [
            tc.compiler,
            *CFLAGS,
            f"-I{include}",
            f"-I{tc.ffi_include}",
            f'-DNXRT_TVM_VERSION="{tc.tvm_version}"',
            f'-DNXRT_TVM_RUNTIME_LIB="{tc.tvm_runtime}"',
            f'-DNXRT_HOST_CPU="{tc.host_cpu}"',
            f'-DNXRT_HOST_CPU_ID="{tc.host_cpu_id}"',
            *(["-DNXRT_HAVE_OPENSSL"] if tc.openssl else []),
            *(str(s) for s in sources if s.suffix == ".c"),
            "-o",
            tmp,
            f"-L{tc.ffi_lib_dir}",
            "-ltvm_ffi",
            f"-Wl,-rpath,{tc.ffi_lib_dir}",
            *(["-lcrypto"] if tc.openssl else []),
            "-lpthread",
            "-ldl",
        ]
        log.info("building the ORT plugin: %s", " ".join(command))
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=600)
            if done.returncode != 0:
                raise PluginCompileError(f"compiling the plugin failed:\n{done.stderr.strip()[-4000:]}")
            os.replace(tmp, library)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    return library
