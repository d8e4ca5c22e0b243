"""Compiled C++ kernels for this CPU: a torch-free source built at first use and loaded with
ctypes.

:func:`build` compiles a source file with the system's C++ compiler (``$CXX``, else ``g++``)
for this CPU (``-O3 -march=native -fopenmp``, linked to the OpenMP runtime torch already
loaded) into ``$FASTBERT_CACHE/cpu-kernels`` (default ``~/.cache/fastbert``), keyed by the
source, the compiler, the flags and the CPU, so a build for one CPU never loads on another.
:class:`Library` loads one such source once per process, says why where it cannot (not
Linux on x86-64, no compiler, a failed build, a missing CPU feature), and a call into it
releases the GIL. Nothing is compiled at import.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import os
import platform
import shutil
import struct
import subprocess
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

from fastbert.settings import cache_dir

FLAGS = ("-O3", "-march=native", "-fopenmp", "-fPIC", "-shared", "-std=c++17")


def first_processor(cpuinfo: str | None = None) -> list[str] | None:
    """The lines of the first processor's block in ``cpuinfo`` (None: /proc/cpuinfo's text;
    the other processors' blocks repeat it), or None where there is no such file."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return None
    lines = cpuinfo.splitlines()
    end = next((i for i, line in enumerate(lines) if not line.strip()), len(lines))
    return lines[:end]


def cpu_identity() -> str:
    """The CPU's model name and flags (a build for one CPU must not load on another)."""
    lines = first_processor()
    if lines is None:
        return platform.processor()
    return "\n".join(line for line in lines if line.startswith(("model name", "flags")))


@functools.cache
def cpu_flags() -> frozenset[str]:
    """The instruction-set flags of the first processor in /proc/cpuinfo (empty where there
    is none)."""
    flags = next((line for line in cpu_identity().splitlines() if line.startswith("flags")), "")
    return frozenset(flags.partition(":")[2].split())


# The flags of an int8 dot product that sums into 32 bits (VNNI's vpdpbusd, AMX's tiles).
# Without them oneDNN's int8 GEMMs either pair the products in 16 bits, saturating on
# full-range operands (its quantised linear), or fall to its reference kernel (its s8 x s8
# matmul, torch._int_mm: about 2 GFLOP/s on an AVX2-only CPU, where float32 ran at 100).
# The fastest first, the order in which fastbert info names them.
INT8_DOT_FLAGS = ("amx_int8", "avx512_vnni", "avx_vnni")


# Flags the int8 linear's choice of product treats as absent (see the two blocks below).
_ignored: frozenset[str] = frozenset()


def has_int8_dot_products() -> bool:
    """Whether this CPU has one of :data:`INT8_DOT_FLAGS` (False inside
    :func:`int8_dot_products_ignored` and :func:`int8_products_as_on_avx2_only`)."""
    return not (cpu_flags() - _ignored).isdisjoint(INT8_DOT_FLAGS)


def has_avx512() -> bool:
    """Whether this CPU has AVX-512 (its foundation, avx512f) for oneDNN's float32 GEMMs (False
    inside :func:`int8_products_as_on_avx2_only`)."""
    return "avx512f" in cpu_flags() - _ignored


@contextlib.contextmanager
def _ignoring(flags: frozenset[str]) -> Iterator[None]:
    global _ignored
    before, _ignored = _ignored, _ignored | flags
    try:
        yield
    finally:
        _ignored = before


def int8_dot_products_ignored() -> contextlib.AbstractContextManager[None]:
    """Inside the block the int8 linear chooses its product as on a CPU without int8 dot
    products, whatever this one has (to compare the products on one machine, as the tests and
    the pass profile do); not for use from several threads."""
    return _ignoring(frozenset(INT8_DOT_FLAGS))


def int8_products_as_on_avx2_only() -> contextlib.AbstractContextManager[None]:
    """As :func:`int8_dot_products_ignored`, and as on a CPU without AVX-512 too."""
    return _ignoring(frozenset({*INT8_DOT_FLAGS, "avx512f"}))


def compiler() -> str | None:
    return os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")


def kernels_dir() -> Path:
    return cache_dir() / "cpu-kernels"


def build(source: Path, compiler: str, extra_flags: tuple[str, ...] = ()) -> Path:
    """The compiled library of ``source``, building it when this source, compiler, flags
    (:data:`FLAGS` and ``extra_flags``) and CPU have none yet (into a temporary file, then
    renamed, so concurrent builds never load a partial one). Raises RuntimeError with the
    compiler's message when the build fails."""
    flags = (*FLAGS, *extra_flags)
    version = subprocess.run(
        [compiler, "--version"], capture_output=True, text=True, timeout=60
    ).stdout
    key = hashlib.sha256(
        "\0".join([source.read_text(), compiler, version, " ".join(flags), cpu_identity()]).encode()
    ).hexdigest()[:16]
    target = kernels_dir() / f"{source.stem}-{key}.so"
    if whole_library(target):
        return target
    with _work_folder(target.parent) as work:
        built = Path(work) / target.name
        result = subprocess.run(
            [compiler, *flags, "-o", str(built), str(source)],
            capture_output=True,
            text=True,
            timeout=300,
        )
        if result.returncode != 0:
            raise RuntimeError(result.stderr.strip().splitlines()[-1] if result.stderr else "")
        os.replace(built, target)
    return target


def whole_library(path: Path) -> bool:
    """Whether ``path`` holds a whole 64-bit ELF library: its section headers, which the
    linker writes last, end within the file. A cut one (a full disk, a copy stopped halfway)
    killed every process that loaded it with SIGBUS; it is built again instead."""
    try:
        with open(path, "rb") as file:
            header = file.read(64)
            size = os.fstat(file.fileno()).st_size
    except OSError:
        return False
    if len(header) < 64 or header[:5] != b"\x7fELF\x02":
        return False
    (offset,) = struct.unpack_from("<Q", header, 0x28)
    entry_size, count = struct.unpack_from("<HH", header, 0x3A)
    return offset + entry_size * count <= size


class CacheFolderError(OSError):
    """The folder the compiled libraries go to cannot be made or written."""


def _work_folder(folder: Path) -> tempfile.TemporaryDirectory:
    """A temporary folder in ``folder`` (made first) for one build; CacheFolderError naming
    ``folder`` and the setting that moves it when that fails."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        return tempfile.TemporaryDirectory(dir=folder)
    except OSError as error:
        raise CacheFolderError(
            f"cannot write {folder} ({error.strerror or error}); set $FASTBERT_CACHE to a "
            "writable folder"
        ) from error


def missing_requirement(cpu_flag: str | None = None) -> str | None:
    """Why this machine cannot build a kernel (not Linux on x86-64, no ``cpu_flag`` when one
    is named, no C++ compiler), or None."""
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
        return f"needs Linux on x86-64, this is {platform.system()} on {platform.machine()}"
    if cpu_flag is not None and cpu_flag not in cpu_flags():
        return f"this CPU has no {cpu_flag}"
    if compiler() is None:
        return "no C++ compiler found (set $CXX)"
    return None


class Library:
    """One compiled source, loaded at the first :meth:`get` of the process.

    ``switched_on()``: whether its setting lets it run (its reason when off: ``off_reason``);
    ``cpu_flag``: an instruction set the source needs, or None; ``declare(library)`` sets the
    ctypes signatures of its functions; ``extra_flags``: compiler flags of this source.
    """

    def __init__(
        self,
        source: Path,
        declare: Callable[[ctypes.CDLL], None],
        cpu_flag: str | None = None,
        switched_on: Callable[[], bool] = lambda: True,
        off_reason: str = "off",
        extra_flags: tuple[str, ...] = (),
    ):
        self.source = source
        self.declare = declare
        self.cpu_flag = cpu_flag
        self.switched_on = switched_on
        self.off_reason = off_reason
        self.extra_flags = extra_flags
        self._lock = threading.Lock()
        self._library: ctypes.CDLL | None = None
        self._status: str | None = None
        self._paused = False

    def _load(self) -> tuple[ctypes.CDLL | None, str]:
        if not self.switched_on():
            return None, self.off_reason
        missing = missing_requirement(self.cpu_flag)
        if missing is not None:
            return None, f"not built: {missing}"
        found = compiler()
        assert found is not None
        try:
            path = build(self.source, found, self.extra_flags)
        except CacheFolderError as error:
            return None, f"not built: {error}"
        except (OSError, RuntimeError, subprocess.SubprocessError) as error:
            return None, f"not built: {found} failed: {error}"
        try:
            library = ctypes.CDLL(str(path))
            self.declare(library)
        except (OSError, AttributeError) as error:  # not loadable, or another library's
            return None, f"not loaded: {path}: {error} (delete it to build it again)"
        return library, f"ready ({path})"

    def get(self) -> ctypes.CDLL | None:
        """The loaded library (built at the first call), or None where it cannot run."""
        if self._status is None:
            with self._lock:
                if self._status is None:
                    self._library, self._status = self._load()
        return self._library

    def status(self) -> str:
        """ "ready (path)", or why the library is not used."""
        self.get()
        assert self._status is not None
        return self._status

    def in_use(self) -> bool:
        """Whether callers run the library now: loaded, and not :meth:`paused`."""
        return not self._paused and self.get() is not None

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Inside the block, callers that ask :meth:`in_use` take their PyTorch path (to
        compare the two, as the benchmarks do); not for use from several threads."""
        before, self._paused = self._paused, True
        try:
            yield
        finally:
            self._paused = before
