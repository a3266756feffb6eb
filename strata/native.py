"""Thin wrappers over the C runtime (`strata._native`). The only module that touches ffi/lib.

Every wrapper checks its inputs in Python (dtype, contiguity, sizes, block multiples) so that the
C code is only ever called with consistent arguments, then turns a non-zero status into
`NativeError`. The C calls release the GIL (cffi API mode), so threads overlap with Python.
"""
from __future__ import annotations

import errno
import operator
import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from strata.errors import NativeError
from strata.quant import DEQUANT_TYPES, GGMLType, block_size, ggml_type, row_bytes

try:
    from strata._native import ffi, lib
except ImportError as exc:  # pragma: no cover - only on a broken install
    raise ImportError(
        "strata's native runtime is not built: reinstall with `pip install -e .` "
        f"(needs a C compiler) [{exc}]"
    ) from exc

IMPLS = {"auto": lib.STRATA_IMPL_AUTO, "scalar": lib.STRATA_IMPL_SCALAR, "avx2": lib.STRATA_IMPL_AVX2}

_OUT_NUMPY = {np.dtype(np.float32): lib.STRATA_OUT_F32, np.dtype(np.float16): lib.STRATA_OUT_F16}
_OUT_TORCH_NAMES = {"torch.float32": lib.STRATA_OUT_F32, "torch.float16": lib.STRATA_OUT_F16,
                    "torch.bfloat16": lib.STRATA_OUT_BF16}


def _check(status: int, what: str) -> None:
    if status != lib.STRATA_OK:
        raise NativeError(f"{what}: {ffi.string(lib.strata_status_string(status)).decode()} (status {status})")


def cpu_has_avx2() -> bool:
    """True when this CPU runs the AVX2 kernels (AVX2, FMA, F16C)."""
    return bool(lib.strata_cpu_has_avx2())


def default_impl() -> str:
    """What 'auto' resolves to here: 'avx2', or 'scalar' (no AVX2, or STRATA_FORCE_SCALAR set)."""
    return "avx2" if lib.strata_impl_default() == lib.STRATA_IMPL_AVX2 else "scalar"


def has_kernel(t: Any, impl: str) -> bool:
    """True when `impl` has its own kernel for type `t` (else that format runs its scalar kernel)."""
    return bool(lib.strata_dequant_has_kernel(int(ggml_type(t)), _impl(impl)))


def default_threads() -> int:
    """Threads available to this process (its CPU affinity)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


def _impl(impl: str) -> int:
    try:
        return IMPLS[impl]
    except KeyError:
        raise ValueError(f"unknown implementation {impl!r}; expected one of {sorted(IMPLS)}") from None


def _src_view(src: Any) -> tuple[Any, int]:
    """(cdata pointer, byte length) of a contiguous byte source: bytes-like, numpy or CPU torch."""
    if hasattr(src, "data_ptr") and hasattr(src, "is_contiguous"):  # torch.Tensor
        if src.device.type != "cpu":
            raise ValueError(f"source tensor must be on the CPU, found {src.device}")
        if not src.is_contiguous():
            raise ValueError("source tensor must be contiguous")
        return ffi.cast("const void *", src.data_ptr()), src.numel() * src.element_size()
    if isinstance(src, np.ndarray) and not src.flags.c_contiguous:
        raise ValueError("source array must be C-contiguous")
    buf = ffi.from_buffer(src)
    return buf, len(buf)


def _out_view(out: Any) -> tuple[Any, int, int, tuple[int, ...], str]:
    """(cdata pointer, byte length, STRATA_OUT_*, shape, description) of an output buffer."""
    if hasattr(out, "data_ptr") and hasattr(out, "is_contiguous"):  # torch.Tensor
        code = _OUT_TORCH_NAMES.get(str(out.dtype))
        if code is None:
            raise ValueError(f"output tensor dtype must be float32, float16 or bfloat16, found {out.dtype}")
        if out.device.type != "cpu":
            raise ValueError(f"output tensor must be on the CPU, found {out.device}")
        if not out.is_contiguous():
            raise ValueError("output tensor must be contiguous")
        return (ffi.cast("void *", out.data_ptr()), out.numel() * out.element_size(), code,
                tuple(out.shape), f"tensor {tuple(out.shape)} {out.dtype}")
    if isinstance(out, np.ndarray):
        code = _OUT_NUMPY.get(out.dtype)
        if code is None:
            raise ValueError(f"output array dtype must be float32 or float16, found {out.dtype}")
        if not out.flags.c_contiguous or not out.flags.writeable:
            raise ValueError("output array must be C-contiguous and writeable")
        return ffi.from_buffer(out, require_writable=True), out.nbytes, code, out.shape, f"array {out.shape} {out.dtype}"
    raise TypeError(f"output must be a numpy array or a torch tensor, found {type(out).__name__}")


def _row_geometry(t: GGMLType, shape: tuple[int, ...], what: str) -> tuple[int, int, int]:
    """(row_len, n_rows, packed bytes) of a row-major `shape` of type `t`; the last dimension is
    the row and must hold whole blocks."""
    row_len = int(shape[-1]) if shape else 1
    n_elems = int(np.prod(shape)) if shape else 1
    elems, nbytes = block_size(t)
    if row_len % elems:
        raise ValueError(f"{t.name}: row length {row_len} of {what} is not a multiple of the block size {elems}")
    return row_len, (n_elems // row_len if row_len else 0), n_elems // elems * nbytes


def dequantize_into(t: Any, src: Any, out: Any, *, n_threads: int = 1, impl: str = "auto") -> Any:
    """Dequantize packed `src` of ggml type `t` into `out` (numpy float32/float16 array or CPU
    torch float32/float16/bfloat16 tensor), without copies.

    `out`'s last dimension is the row length and must be a multiple of the type's block size; the
    source must hold at least as many packed bytes as `out` has elements. Returns `out`.
    """
    t = ggml_type(t)
    if t not in DEQUANT_TYPES:
        raise ValueError(f"dequantization of {t.name} is not supported")
    if not isinstance(n_threads, int) or n_threads < 1:
        raise ValueError(f"n_threads must be a positive integer, found {n_threads!r}")
    src_ptr, src_bytes = _src_view(src)
    dst_ptr, dst_bytes, out_code, shape, desc = _out_view(out)
    row_len, n_rows, need = _row_geometry(t, shape, f"output {desc}")
    if src_bytes < need:
        raise ValueError(f"{t.name}: output {desc} needs {need} packed bytes, source holds {src_bytes}")
    status = lib.strata_dequant(int(t), src_ptr, src_bytes, dst_ptr, dst_bytes, out_code,
                                n_rows, row_len, n_threads, _impl(impl))
    _check(status, f"dequantize {t.name} into {desc}")
    return out


def dequantize(t: Any, src: Any, shape: tuple[int, ...] | int, *, dtype: Any = np.float32,
               n_threads: int = 1, impl: str = "auto") -> np.ndarray:
    """Dequantize into a new numpy array of `shape` (row-major, last dimension = row length)."""
    out = np.empty(shape, dtype=dtype)
    return dequantize_into(t, src, out, n_threads=n_threads, impl=impl)


def convert_f32_into(src: np.ndarray, out: Any, *, impl: str = "auto") -> Any:
    """Round float32 `src` into float16/bfloat16 `out` (same element count), nearest-even."""
    if not isinstance(src, np.ndarray) or src.dtype != np.float32 or not src.flags.c_contiguous:
        raise ValueError("source must be a C-contiguous float32 numpy array")
    dst_ptr, dst_bytes, out_code, shape, desc = _out_view(out)
    n = int(np.prod(shape)) if shape else 1
    if n != src.size:
        raise ValueError(f"output {desc} has {n} elements, source has {src.size}")
    _check(lib.strata_convert_f32(ffi.cast("const float *", ffi.from_buffer(src)), dst_ptr, n, out_code, _impl(impl)),
           f"convert float32 into {desc}")
    return out


# ---------------------------------------------------------------------------------------------
# Quantization (native/quantize.c): float32 rows -> packed GGML blocks, for the converter.
# ---------------------------------------------------------------------------------------------

def can_quantize(t: Any) -> bool:
    """True when the native runtime quantizes into type `t` (Q8_0, Q4_K, Q6_K)."""
    return bool(lib.strata_quantize_has_type(int(ggml_type(t))))


def _f32_view(src: Any) -> tuple[Any, int, tuple[int, ...]]:
    """(cdata float pointer, byte length, shape) of a contiguous float32 numpy array or CPU tensor."""
    if hasattr(src, "data_ptr") and hasattr(src, "is_contiguous"):  # torch.Tensor
        if str(src.dtype) != "torch.float32":
            raise ValueError(f"source tensor must be float32, found {src.dtype}")
        if src.device.type != "cpu":
            raise ValueError(f"source tensor must be on the CPU, found {src.device}")
        if not src.is_contiguous():
            raise ValueError("source tensor must be contiguous")
        return ffi.cast("const float *", src.data_ptr()), src.numel() * 4, tuple(src.shape)
    if not isinstance(src, np.ndarray):
        raise TypeError(f"source must be a numpy array or a torch tensor, found {type(src).__name__}")
    if src.dtype != np.float32 or not src.flags.c_contiguous:
        raise ValueError(f"source array must be C-contiguous float32, found {src.dtype}"
                         f"{'' if src.flags.c_contiguous else ' (not contiguous)'}")
    return ffi.cast("const float *", ffi.from_buffer(src)), src.nbytes, src.shape


def quantize_into(t: Any, src: Any, out: Any, *, n_threads: int = 1, impl: str = "auto") -> Any:
    """Quantize float32 `src` (last dimension = row length, a multiple of the block size) into
    `out`, a writable contiguous byte buffer (numpy array, bytearray, memoryview) holding at least
    the packed size. Returns `out`."""
    t = ggml_type(t)
    if not can_quantize(t):
        raise ValueError(f"quantization into {t.name} is not supported natively")
    if not isinstance(n_threads, int) or n_threads < 1:
        raise ValueError(f"n_threads must be a positive integer, found {n_threads!r}")
    src_ptr, src_bytes, shape = _f32_view(src)
    row_len, n_rows, need = _row_geometry(t, shape, f"source {shape}")
    if isinstance(out, np.ndarray) and not out.flags.c_contiguous:
        raise ValueError("output array must be C-contiguous")
    dst = ffi.from_buffer(out, require_writable=True)
    if len(dst) < need:
        raise ValueError(f"{t.name}: source {shape} packs into {need} bytes, output holds {len(dst)}")
    status = lib.strata_quantize(int(t), src_ptr, src_bytes, dst, len(dst), n_rows, row_len, n_threads, _impl(impl))
    _check(status, f"quantize {shape} float32 into {t.name}")
    return out


def quantize(t: Any, src: Any, *, n_threads: int = 1, impl: str = "auto") -> np.ndarray:
    """Quantize float32 `src` into a new uint8 array of shape (*src.shape[:-1], packed row bytes)."""
    t = ggml_type(t)
    _, _, shape = _f32_view(src)
    row_len, _, _ = _row_geometry(t, shape, f"source {shape}")
    out = np.empty((*shape[:-1], row_bytes(t, row_len)), dtype=np.uint8)
    return quantize_into(t, src, out, n_threads=n_threads, impl=impl)


# ---------------------------------------------------------------------------------------------
# Pager (native/pager.c): asynchronous reads of file ranges into host buffers, for the memory
# tiers. The pager's workers run in C without the GIL; Python only submits and collects tickets.
# ---------------------------------------------------------------------------------------------

class PagerTimeoutError(NativeError, TimeoutError):
    """A wait on a pager request timed out; the request is still pending (wait again)."""


_PAGER_FALLBACKS = {"pread": 0, "mmap": lib.STRATA_PAGER_FALLBACK_MMAP}
_PAGER_STATS = ("submitted", "completed", "failed", "direct", "chunks", "bytes_requested",
                "bytes_read", "read_ns", "busy_ns", "in_flight")


@dataclass(frozen=True)
class PagerInfo:
    """What a pager found at open. `align` is the O_DIRECT alignment (0 when reads are buffered)."""

    file_size: int
    align: int
    chunk_bytes: int
    n_threads: int
    direct: bool
    mmap: bool
    max_requests: int


def _pager_reason(status: int) -> str:
    return ffi.string(lib.strata_pager_status_string(status)).decode()


def _pager_flags(direct: bool | None, fallback: str) -> int:
    if fallback not in _PAGER_FALLBACKS:
        raise ValueError(f"pager fallback must be one of {sorted(_PAGER_FALLBACKS)}, found {fallback!r}")
    flags = _PAGER_FALLBACKS[fallback]
    if direct is True:
        flags |= lib.STRATA_PAGER_DIRECT_REQUIRED
    elif direct is False:
        flags |= lib.STRATA_PAGER_DIRECT_OFF
    return flags


def _dst_view(dst: Any) -> tuple[Any, int]:
    """(cdata pointer, byte length) of a writable contiguous destination: a numpy array, a CPU
    (possibly pinned) torch tensor, or any writable buffer (bytearray, mmap, memoryview)."""
    if hasattr(dst, "data_ptr") and hasattr(dst, "is_contiguous"):  # torch.Tensor
        if dst.device.type != "cpu" or not dst.is_contiguous():
            raise ValueError(f"destination tensor must be contiguous in host memory, found {dst.device}"
                             f"{'' if dst.is_contiguous() else ' (not contiguous)'}")
        return ffi.cast("void *", dst.data_ptr()), dst.numel() * dst.element_size()
    if isinstance(dst, np.ndarray) and not (dst.flags.c_contiguous and dst.flags.writeable):
        raise ValueError("destination array must be C-contiguous and writeable")
    try:
        buf = ffi.from_buffer(dst, require_writable=True)
    except (TypeError, BufferError) as exc:
        raise TypeError(f"destination must be a writable buffer, found {type(dst).__name__}: {exc}") from None
    return buf, len(buf)


class Pager:
    """Reads byte ranges of one file into caller buffers on `n_threads` native worker threads.

        with Pager("model.gguf", n_threads=4) as pager:
            ticket = pager.submit(slab.offset, slab.nbytes, buf)   # returns at once
            start = pager.wait(ticket)                             # buf[start:start + nbytes]

    `direct`: None reads with O_DIRECT when the file system allows it and the destination is
    aligned to `info.align` with room for the enclosing aligned range (see `span`), else
    buffered; True fails at open when O_DIRECT is refused; False never uses it. `fallback` picks
    how non-direct requests read: "pread" or "mmap" (a copy from a read-only mapping).
    Destinations are kept alive by the pager until their request is collected or it is closed.
    """

    def __init__(self, path: str | os.PathLike, n_threads: int = 4, *, chunk_bytes: int = 0,
                 direct: bool | None = None, fallback: str = "pread") -> None:
        self.path = os.fspath(path)
        if not isinstance(n_threads, int) or not 1 <= n_threads <= 256:
            raise ValueError(f"pager threads must be an integer in 1..256, found {n_threads!r}")
        if not isinstance(chunk_bytes, int) or chunk_bytes < 0:
            raise ValueError(f"pager chunk_bytes must be a non-negative integer (0: default), found {chunk_bytes!r}")
        out, err = ffi.new("strata_pager **"), ffi.new("int *")
        status = lib.strata_pager_open(os.fsencode(self.path), n_threads, chunk_bytes,
                                       _pager_flags(direct, fallback), out, err)
        if status == lib.STRATA_E_OPEN:
            raise NativeError(f"{self.path}: cannot open for reading: {os.strerror(err[0])} (errno {err[0]})")
        if status == lib.STRATA_E_DIRECT:
            raise NativeError(f"{self.path}: O_DIRECT was required but the file system refuses it "
                              f"(open with direct=None to fall back to buffered reads)")
        if status != lib.STRATA_OK:
            raise NativeError(f"{self.path}: cannot start a pager: {_pager_reason(status)} (status {status})")
        self._handle = ffi.gc(out[0], lib.strata_pager_free)
        self._close_native = lib.strata_pager_close  # held: module globals may be gone at exit
        self._closed = False
        self._pending: dict[int, tuple[Any, int, int]] = {}  # ticket -> (dst keep-alive, offset, nbytes)
        info = ffi.new("strata_pager_info *")
        lib.strata_pager_get_info(self._handle, info)
        self.info = PagerInfo(info.file_size, info.align, info.chunk_bytes, info.n_threads,
                              bool(info.direct), bool(info.mmap), info.max_requests)

    def __repr__(self) -> str:
        i = self.info
        mode = f"O_DIRECT align {i.align}" if i.direct else "mmap" if i.mmap else "buffered"
        return f"Pager({self.path!r}, {i.n_threads} threads, {mode}{', closed' if self._closed else ''})"

    def span(self, offset: int, nbytes: int) -> tuple[int, int]:
        """The file range [start, end) a direct read of [offset, offset + nbytes) reads: the
        enclosing aligned range, at most round_up(nbytes, align) + align long. (offset,
        offset + nbytes) when the pager reads buffered."""
        a = self.info.align
        if not a:
            return offset, offset + nbytes
        return offset // a * a, -(-(offset + nbytes) // a) * a

    # ---- requests ------------------------------------------------------------------------------

    def submit(self, offset: int, nbytes: int, dst: Any) -> int:
        """Queue a read of file bytes [offset, offset + nbytes) into `dst`; returns a ticket."""
        offset, nbytes = operator.index(offset), operator.index(nbytes)
        what = f"{self.path}: read of bytes [{offset}, {offset + nbytes})"
        self._check_open(what)
        ptr, dst_bytes = _dst_view(dst)
        if offset < 0 or nbytes < 0 or offset + nbytes > self.info.file_size:
            raise NativeError(f"{what}: outside the file (0..{self.info.file_size} bytes)")
        if nbytes > dst_bytes:
            raise NativeError(f"{what}: destination holds {dst_bytes} bytes, the read needs {nbytes}")
        ticket = ffi.new("int64_t *")
        status = lib.strata_pager_submit(self._handle, offset, nbytes, ptr, dst_bytes, ticket)
        if status != lib.STRATA_OK:
            raise NativeError(f"{what}: {_pager_reason(status)} (status {status})")
        self._pending[ticket[0]] = (ptr, offset, nbytes)
        return int(ticket[0])

    def poll(self, ticket: int) -> bool:
        """True when the request has finished (collect it with `wait`)."""
        self._check_open(f"{self.path}: poll of ticket {ticket}")
        done = ffi.new("int *")
        status = lib.strata_pager_poll(self._handle, operator.index(ticket), done)
        if status != lib.STRATA_OK:
            raise NativeError(self._ticket_message(ticket, status))
        return bool(done[0])

    def wait(self, ticket: int, timeout: float | None = None) -> int:
        """Wait for a request and collect it; returns where its first byte landed in dst.
        Raises PagerTimeoutError after `timeout` seconds (the request stays pending), and
        NativeError naming the file range and errno when the read failed."""
        ticket = operator.index(ticket)
        self._check_open(f"{self.path}: wait for ticket {ticket}")
        if timeout is not None and not timeout >= 0:
            raise ValueError(f"timeout must be None or >= 0 seconds, found {timeout!r}")
        result = ffi.new("strata_pager_result *")
        timeout_ns = -1 if timeout is None else min(int(timeout * 1e9), 2**62)
        status = lib.strata_pager_wait(self._handle, ticket, timeout_ns, result)
        if status == lib.STRATA_E_TIMEOUT:
            raise PagerTimeoutError(self._ticket_message(ticket, status) + f" ({timeout} s)")
        if status != lib.STRATA_OK:
            message = (self._io_message(ticket, result) if status == lib.STRATA_E_IO
                       else self._ticket_message(ticket, status))
        if status != lib.STRATA_E_TICKET:  # collected (or cancelled): release the destination
            self._pending.pop(ticket, None)
        if status != lib.STRATA_OK:
            raise NativeError(message)
        return int(result.data_offset)

    def read(self, offset: int, nbytes: int, dst: Any) -> int:
        """Submit and wait: the bytes are in dst[start:start + nbytes] for the returned start."""
        return self.wait(self.submit(offset, nbytes, dst))

    # ---- state ---------------------------------------------------------------------------------

    def stats(self) -> dict[str, int]:
        """Counters since open: requests, chunks, bytes requested and read, read and busy ns."""
        s = ffi.new("strata_pager_stats *")
        _check(lib.strata_pager_get_stats(self._handle, s), f"{self.path}: pager stats")
        return {name: int(getattr(s, name)) for name in _PAGER_STATS}

    def bind_node(self, node: int) -> None:
        """Run the workers on the CPUs of NUMA node `node` (best effort; a no-op on one node)."""
        self._check_open(f"{self.path}: bind to NUMA node {node}")
        status = lib.strata_pager_bind_node(self._handle, operator.index(node))
        if status != lib.STRATA_OK:
            raise NativeError(f"{self.path}: bind pager to NUMA node {node} of {numa_node_count()}: "
                              f"{_pager_reason(status)}")

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Cancel queued reads, finish those in progress, stop the workers. Idempotent."""
        if not getattr(self, "_closed", True):
            self._closed = True
            self._close_native(self._handle)  # joins the workers: no write into dst after this
            self._pending.clear()

    __del__ = close  # before the destinations kept alive in _pending are released

    def __enter__(self) -> Pager:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- messages ------------------------------------------------------------------------------

    def _check_open(self, what: str) -> None:
        if self._closed:
            raise NativeError(f"{what}: {_pager_reason(lib.STRATA_E_CLOSED)}")

    def _ticket_message(self, ticket: int, status: int) -> str:
        request = self._pending.get(ticket)
        where = f" (bytes [{request[1]}, {request[1] + request[2]}))" if request else ""
        return f"{self.path}: ticket {ticket}{where}: {_pager_reason(status)}"

    def _io_message(self, ticket: int, result: Any) -> str:
        request = self._pending.get(ticket)
        what = (f"{self.path}: read of bytes [{request[1]}, {request[1] + request[2]})" if request
                else f"{self.path}: read")
        if result.os_errno == 0:
            return (f"{what}: the file ended at byte {result.error_offset} (it had "
                    f"{self.info.file_size} bytes at open; truncated since?)")
        err = result.os_errno
        return (f"{what} failed at byte {result.error_offset}: {os.strerror(err)} "
                f"(errno {err}, {errno.errorcode.get(err, '?')})")


def numa_node_count() -> int:
    """NUMA nodes of this machine (1 where the kernel reports none)."""
    n = ffi.new("int *")
    _check(lib.strata_numa_count_nodes(n), "count NUMA nodes")
    return int(n[0])


def numa_node_of(buffer: Any) -> int:
    """The NUMA node holding the first page of `buffer` (0 on a one-node machine)."""
    ptr, nbytes = _dst_view(buffer)
    if nbytes == 0:
        raise ValueError("numa_node_of: empty buffer")
    node = ffi.new("int *")
    _check(lib.strata_numa_locate(ptr, node), "locate buffer's NUMA node")
    return int(node[0])
