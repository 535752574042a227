"""Compile lowered Ascend C with g++ against the emulator headers, and launch it on torch CPU tensors.

Ascend C emulated on CPU. `SourceKernel` runs a source whose entry is called with arguments in its C parameter
order; `EmulatedKernel` (in kernel.py) binds a TileLang prim_func's parameters to it by name.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import hashlib
import os
import random
import re
import subprocess
import tempfile
import time
from pathlib import Path

import torch

EMU_DIR = Path(__file__).resolve().parent
INCLUDE_DIR = EMU_DIR / 'include'
RUNTIME_CPP = EMU_DIR / 'runtime.cpp'

ENV_REPORT = 'OPS_TILELANG_EMU_REPORT'  # truthy: every launch prints its report to stderr
ENV_CACHE_DIR = 'OPS_TILELANG_EMU_CACHE_DIR'  # where compiled kernels are cached (default ~/.cache/cann_ops_ascend_emu)
ENV_TIMEOUT = 'OPS_TILELANG_EMU_TIMEOUT_S'  # seconds one emulated run may take (default 300; 0: no limit)

UB_BYTES = 248 * 1024  # Unified Buffer of one Ascend 950 vector core
SIMT_RESERVED_BYTES = 32 * 1024  # reserved for the SIMT context when a kernel contains a __simt_vf__ function


def ub_limit_of(source: str) -> int:
    """The UB bytes a kernel of this Ascend C source may allocate: less the SIMT reservation where it has a
    __simt_vf__ function."""
    return UB_BYTES - (SIMT_RESERVED_BYTES if '__simt_vf__' in source else 0)


# Two poison patterns for never-written UB, as 32-bit words (little endian). 0xFFFFFFFF is NaN as fp32, bf16
# and fp16 halves; 0x7FC17FC1 is a different NaN in all three (and different integers).
POISON_WORDS = (0xFFFFFFFF, 0x7FC17FC1)

CXX = os.environ.get('CXX', 'g++')
# -O1: the fastest compile + run of a typical test (kernels run for milliseconds; -O2 doubles compile time).
# -ffp-contract=off: a * b + c in emulated code rounds twice unless the API documents a fused operation.
CXXFLAGS = ('-std=c++20', '-O1', '-fno-strict-aliasing', '-ffp-contract=off', '-fPIC', '-w')

_switches = {'saturate': False, 'strict_pad': False, 'vf_membar': True}


class EmulatorError(RuntimeError):
    """A fault detected by the emulator: names kernel, core (block_idx), pipe and UB/GM offset where they apply."""


def set_saturation(enabled: bool) -> None:
    """Read `RS_ENABLE` of vcvt as saturation (+-inf / overflow -> +-max, NaN -> 0). Default off (README)."""
    _switches['saturate'] = bool(enabled)


def get_saturation() -> bool:
    return _switches['saturate']


def set_strict_dma_pad(enabled: bool) -> None:
    """Make any read of the undefined rest of a 32-byte block after a non-32-byte DMA an error (default: count it)."""
    _switches['strict_pad'] = bool(enabled)


def set_vf_membar_check(enabled: bool) -> None:
    """Check that a vector load after a vector store of the same UB inside one SIMD VF has asc_mem_bar between."""
    _switches['vf_membar'] = bool(enabled)


def tilelang_src_dir() -> Path:
    import tilelang

    return Path(tilelang.__file__).resolve().parent / 'src'


# ---------------------------------------------------------------------------------------------- rewrites
_UB_TYPE = r'([A-Za-z_][\w:]*(?:\s+[A-Za-z_]\w*)*)'
_UB_BASE = re.compile(r'\(__ubuf__\s+' + _UB_TYPE + r'\s*\*\s*\)\s*(\d+)(?![\w.])')
_UB_PTR_TYPE = re.compile(r'__ubuf__\s+' + _UB_TYPE + r'\s*\*')
_SIMT_DEF = re.compile(r'__simt_(?:vf|callee)__[^;{}]*?\)\s*\{')
_UB_INDEX = re.compile(r'\(\(__ubuf__\s+([A-Za-z_][\w:]*(?:\s+[A-Za-z_]\w*)*)\s*\*\s*\)\s*([A-Za-z_]\w*)\)\s*\[')
_SIMD_VF_DEF = re.compile(r'(__simd_vf__[^;{}()]*\b\w+\s*\([^)]*\)\s*\{)')
ENTRY_RE = re.compile(r'extern\s+"C"\s+__global__\s+__vector__\s+void\s+(\w+)\s*\(([^)]*)\)')


def rewrite_source(source: str) -> str:
    """The only changes made to a lowered source (README "Rewrites"):

    1. `(__ubuf__ T *)N`, a UB address (the merged buffer's base is `(__ubuf__ uint8_t *)0`), becomes that offset
       in the emulated core's UB (`::emu::ub_base() + N`).
    2. `((__ubuf__ T *)buf)[i]`, a scalar or SIMT access of one UB element, becomes `(::emu::ub_view<T>(buf))[i]`,
       an accessor that checks bounds and records the access for the hazard model and the written-bytes shadow.
    3. Every `__simd_vf__` function body starts with `::emu::VfScope`, so that the VF runs on PIPE_V.
    4. Inside `__simt_vf__` / `__simt_callee__` functions (signature and body) the type `__ubuf__ T *` becomes
       `::emu::UbPtr<T>`, so that SIMT threads' pointer-arithmetic accesses of UB (`*(__ubuf__ uint1 *)(p + k)`)
       are checked and recorded like element accesses.
    """
    out = _UB_BASE.sub(lambda m: f'(__ubuf__ {m.group(1)} *)(::emu::ub_base() + {m.group(2)})', source)
    out = _rewrite_simt_bodies(out)
    out = _UB_INDEX.sub(lambda m: f'(::emu::ub_view<{m.group(1)}>({m.group(2)}))[', out)
    out = _SIMD_VF_DEF.sub(lambda m: m.group(1) + ' ::emu::VfScope emu_vf_scope_;', out)
    return out


def _rewrite_simt_bodies(source: str) -> str:
    out, pos = [], 0
    for m in _SIMT_DEF.finditer(source):
        if m.start() < pos:
            continue
        depth, i = 1, m.end()
        while depth and i < len(source):
            depth += {'{': 1, '}': -1}.get(source[i], 0)
            i += 1
        out.append(source[pos : m.start()])
        out.append(_UB_PTR_TYPE.sub(lambda t: f'::emu::UbPtr<{t.group(1)}>', source[m.start() : i]))
        pos = i
    out.append(source[pos:])
    return ''.join(out)


@dataclasses.dataclass(frozen=True)
class EntryParam:
    ctype: str
    name: str

    @property
    def is_pointer(self) -> bool:
        return '*' in self.ctype


@dataclasses.dataclass(frozen=True)
class Entry:
    name: str
    params: tuple[EntryParam, ...]


def parse_entry(source: str) -> Entry:
    m = ENTRY_RE.search(source)
    if m is None:
        raise EmulatorError('no `extern "C" __global__ __vector__ void NAME(...)` entry in the source')
    params = []
    for raw in m.group(2).split(','):
        raw = raw.strip()
        if not raw:
            continue
        pm = re.match(r'(.*?)([A-Za-z_]\w*)$', raw)
        if pm is None:
            raise EmulatorError(f'cannot parse entry parameter {raw!r}')
        params.append(EntryParam(ctype=' '.join(pm.group(1).split()), name=pm.group(2)))
    return Entry(name=m.group(1), params=tuple(params))


_SCALAR_CTYPES = {
    'float': ctypes.c_float,
    'double': ctypes.c_double,
    'int8_t': ctypes.c_int8,
    'int16_t': ctypes.c_int16,
    'int32_t': ctypes.c_int32,
    'int': ctypes.c_int32,
    'int64_t': ctypes.c_int64,
    'uint8_t': ctypes.c_uint8,
    'uint16_t': ctypes.c_uint16,
    'uint32_t': ctypes.c_uint32,
    'uint64_t': ctypes.c_uint64,
    'bool': ctypes.c_bool,
}


def _ctype_of(p: EntryParam):
    if p.is_pointer:
        return ctypes.c_void_p
    ty = p.ctype.replace('const ', '').strip()
    if ty not in _SCALAR_CTYPES:
        raise EmulatorError(f'entry parameter {p.name!r} has C type {p.ctype!r}, not emulated')
    return _SCALAR_CTYPES[ty]


# ---------------------------------------------------------------------------------------------- build + cache
def cache_dir() -> Path:
    d = os.environ.get(ENV_CACHE_DIR)
    return Path(d) if d else Path.home() / '.cache' / 'cann_ops_ascend_emu'


def _emulator_hash() -> str:
    h = hashlib.sha256()
    files = [*sorted(INCLUDE_DIR.rglob('*.h')), RUNTIME_CPP]
    tl = tilelang_src_dir() / 'tl_templates' / 'ascend'
    files += sorted(tl.glob('*.h'))
    for f in files:
        h.update(str(f.name).encode())
        h.update(f.read_bytes())
    h.update(' '.join((CXX, *CXXFLAGS, '-Wl,-Bsymbolic')).encode())
    return h.hexdigest()[:24]


_EMU_HASH: str | None = None


def emulator_hash() -> str:
    global _EMU_HASH
    if _EMU_HASH is None:
        _EMU_HASH = _emulator_hash()
    return _EMU_HASH


class CompilerNotFoundError(EmulatorError):
    """No C++ compiler to build the emulated kernels with: the message says what to install."""


def _compile(args: list[str], what: str) -> None:
    try:
        proc = subprocess.run(args, capture_output=True, text=True, check=False)
    except FileNotFoundError:
        # One line saying what is missing, not a subprocess traceback (a machine without a toolchain).
        raise CompilerNotFoundError(
            f'the Ascend C emulator compiles kernels with a C++20 compiler and {args[0]!r} (CXX) was not found: '
            'install g++ 10 or newer (e.g. `apt-get install g++`) or set CXX to one'
        ) from None
    if proc.returncode != 0:
        hint = ''
        if '-std=c++20' in proc.stderr:  # a compiler older than GCC 10 does not know the flag
            hint = f' ({args[0]} does not know C++20: the emulator needs g++ 10 or newer)'
        raise EmulatorError(f'g++ failed for {what}{hint}:\n{proc.stderr[-6000:]}')


def _locked_build(target: Path, build) -> Path:
    import filelock

    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with filelock.FileLock(str(target) + '.lock'):
        if target.exists():
            return target
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=target.name + '.', suffix='.tmp')
        os.close(fd)
        try:
            build(tmp)
            os.replace(tmp, target)  # atomic: other workers see the whole file or none
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    return target


def _includes() -> list[str]:
    # ours first: the stand-ins for CANN's headers; then TileLang's own tl_templates (kept as shipped).
    return [f'-I{INCLUDE_DIR}', f'-I{tilelang_src_dir()}']


def _runtime_object() -> Path:
    target = cache_dir() / f'runtime-{emulator_hash()}.o'

    def build(tmp: str) -> None:
        _compile([CXX, *CXXFLAGS, *_includes(), '-c', str(RUNTIME_CPP), '-o', tmp], 'the emulator runtime')

    return _locked_build(target, build)


def build_shared_object(source: str) -> Path:
    """Rewrite, compile and cache `source`; returns the shared object (cached by source + emulator hash)."""
    rewritten = rewrite_source(source)
    h = hashlib.sha256((emulator_hash() + '\0' + rewritten).encode()).hexdigest()[:32]
    target = cache_dir() / f'kernel-{h}.so'
    if target.exists():
        return target
    runtime = _runtime_object()

    def build(tmp: str) -> None:
        cpp = tmp + '.cpp'
        Path(cpp).write_text(rewritten)
        try:
            # -Bsymbolic: each kernel's copy of the runtime binds to itself, never to another loaded kernel's
            link = ['-shared', '-Wl,-Bsymbolic']
            _compile([CXX, *CXXFLAGS, *_includes(), *link, cpp, str(runtime), '-o', tmp], 'the kernel source')
        finally:
            os.unlink(cpp)

    return _locked_build(target, build)


# ---------------------------------------------------------------------------------------------- report
@dataclasses.dataclass(frozen=True)
class CoreCounters:
    block_idx: int
    gm2ub_bytes: int
    ub2gm_bytes: int
    vector_instrs: int
    simd_vf_calls: int
    simt_vf_calls: int
    simt_threads: int
    pad_reads: int
    unaligned_single: int


_COUNTER_FIELDS = (
    'gm2ub_bytes',
    'ub2gm_bytes',
    'vector_instrs',
    'simd_vf_calls',
    'simt_vf_calls',
    'simt_threads',
    'pad_reads',
    'unaligned_single',
)


@dataclasses.dataclass(frozen=True)
class LaunchReport:
    """Per-core counters of one launch (Ascend C emulated on CPU; the first of its two runs)."""

    kernel: str
    grid: int
    seed: int
    order: tuple[int, ...]
    cores: tuple[CoreCounters, ...]
    wall_s: float  # both runs, including fork and copies

    def total(self, field: str) -> int:
        return sum(getattr(c, field) for c in self.cores)

    def imbalance(self, field: str) -> float:
        """max / mean over the cores (1.0 = balanced; 0.0 when nothing was counted)."""
        vals = [getattr(c, field) for c in self.cores]
        mean = sum(vals) / len(vals) if vals else 0.0
        return max(vals) / mean if mean else 0.0

    def format(self) -> str:
        cols = ('gm2ub_bytes', 'ub2gm_bytes', 'vector_instrs', 'simd_vf_calls', 'simt_vf_calls', 'simt_threads')
        heads = ('block_idx', 'GM->UB B', 'UB->GM B', 'vec instrs', 'SIMD VFs', 'SIMT VFs', 'SIMT threads')
        rows = [[str(c.block_idx)] + [str(getattr(c, f)) for f in cols] for c in self.cores]
        rows.append(['total'] + [str(self.total(f)) for f in cols])
        rows.append(['max/mean'] + [f'{self.imbalance(f):.2f}' for f in cols])
        widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(heads)]
        lines = [
            f'{self.kernel}: {self.grid} cores, seed {self.seed}, {self.wall_s * 1e3:.1f} ms '
            '(Ascend C emulated on CPU: counts, not hardware speed)',
            '  '.join(h.rjust(w) for h, w in zip(heads, widths, strict=True)),
        ]
        lines += ['  '.join(v.rjust(w) for v, w in zip(r, widths, strict=True)) for r in rows]
        pads = self.total('pad_reads')
        if pads:
            lines.append(f'reads of the undefined rest of a non-32-byte DMA block: {pads} bytes')
        return '\n'.join(lines)


# ---------------------------------------------------------------------------------------------- launch
@dataclasses.dataclass
class _Region:
    start: int  # host address of the first byte
    end: int
    members: list[int]
    data: int = 0  # arena address of `start`
    lo_guard: int = 0
    hi_guard: int = 0


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1).contiguous().view(torch.uint8)


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(_bytes(a), _bytes(b))


def _extent(t: torch.Tensor) -> int:
    if t.numel() == 0:
        return 0
    if any(s < 0 for s in t.stride()):
        raise EmulatorError('tensors with negative strides are not supported')
    return t.element_size() * (1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride(), strict=True)))


class _Lib:
    """A loaded kernel shared object with the runtime's C functions typed."""

    def __init__(self, so: Path, entry: Entry):
        self.cdll = ctypes.CDLL(str(so))
        c = self.cdll
        c.emu_map_shared.restype = ctypes.c_void_p
        c.emu_map_shared.argtypes = [ctypes.c_uint64]
        c.emu_protect_none.argtypes = [ctypes.c_void_p, ctypes.c_uint64]
        c.emu_unmap.argtypes = [ctypes.c_void_p, ctypes.c_uint64]
        c.emu_page_size.restype = ctypes.c_uint64
        c.emu_counters_size.restype = ctypes.c_uint64
        c.emu_configure.argtypes = [
            ctypes.c_char_p,
            ctypes.c_uint32,
            ctypes.c_int64,
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_void_p,
            ctypes.c_void_p,
        ]
        c.emu_add_gm_arg.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.c_uint64] + [ctypes.c_void_p] * 4
        c.emu_child_start.argtypes = [ctypes.c_uint32, ctypes.c_uint32]
        c.emu_core_begin.argtypes = [ctypes.c_int]
        c.emu_child_fail.argtypes = [ctypes.c_char_p]
        self.fn = getattr(c, entry.name)
        self.fn.restype = None
        self.fn.argtypes = [_ctype_of(p) for p in entry.params]
        self.page = int(c.emu_page_size())
        assert int(c.emu_counters_size()) == 8 * len(_COUNTER_FIELDS)


class SourceKernel:
    """An Ascend C source on the emulator; called with its entry's arguments in C parameter order.

    `grid` is the number of blocks (T.Kernel extent); `ub_limit` defaults to 248 KB, or 216 KB when the source
    contains a __simt_vf__ function.
    """

    def __init__(self, source: str, *, grid: int, ub_limit: int | None = None, seed: int | None = None):
        if not isinstance(grid, int) or grid < 1:
            raise ValueError(f'grid must be a positive int, got {grid!r}')
        self.source = source
        self.entry = parse_entry(source)
        self.grid = grid
        self.ub_limit = ub_limit or ub_limit_of(source)
        self.seed = seed
        self.last_report: LaunchReport | None = None
        self._lib = _Lib(build_shared_object(source), self.entry)

    def get_kernel_source(self) -> str:
        return self.source

    def __call__(self, *args, grid: int | None = None):
        if len(args) != len(self.entry.params):
            raise TypeError(f'{self.entry.name} takes {len(self.entry.params)} arguments, got {len(args)}')
        return self.launch(dict(zip((p.name for p in self.entry.params), args, strict=True)), grid=grid)

    def launch(self, values: dict, *, grid: int | None = None) -> LaunchReport:
        grid = self.grid if grid is None else grid
        seed = self.seed if self.seed is not None else torch.initial_seed()
        order = list(range(grid))
        random.Random(seed).shuffle(order)
        t0 = time.perf_counter()
        tensors: list[tuple[str, torch.Tensor]] = []
        for p in self.entry.params:
            v = values[p.name]
            if p.is_pointer:
                if not isinstance(v, torch.Tensor):
                    raise TypeError(
                        f'{self.entry.name}: argument {p.name!r} must be a torch tensor, got {type(v).__name__}'
                    )
                if v.device.type != 'cpu':
                    raise EmulatorError(
                        f'{self.entry.name}: argument {p.name!r} is on {v.device}, the emulator needs CPU'
                    )
                tensors.append((p.name, v))
            elif isinstance(v, torch.Tensor) or not isinstance(v, (int, float, bool)):
                raise TypeError(
                    f'{self.entry.name}: argument {p.name!r} must be a Python number, got {type(v).__name__}'
                )
        runs = [self._run(values, tensors, grid, order, POISON_WORDS[0])]
        runs.append(self._run(values, tensors, grid, order[::-1], POISON_WORDS[1]))
        (snap_a, counters), (snap_b, _) = runs
        self._compare(tensors, snap_a, snap_b)
        for (_name, t), after in zip(tensors, snap_a, strict=True):
            if not _same_bits(t, after):  # the caller's tensor still holds the input: write back what changed
                t.copy_(after)
        report = LaunchReport(
            kernel=self.entry.name,
            grid=grid,
            seed=seed,
            order=tuple(order),
            cores=tuple(CoreCounters(b, *counters[b]) for b in range(grid)),
            wall_s=time.perf_counter() - t0,
        )
        self.last_report = report
        if os.environ.get(ENV_REPORT, '').strip().lower() not in ('', '0', 'false', 'no'):
            import sys

            print(report.format(), file=sys.stderr)
        return report

    def _compare(self, tensors, snap_a, snap_b) -> None:
        for (name, _t), a, b in zip(tensors, snap_a, snap_b, strict=True):
            if _same_bits(a, b):
                continue
            n = a.numel()
            diff = (_bytes(a).reshape(n, -1) != _bytes(b).reshape(n, -1)).any(dim=1)
            k = int(diff.nonzero()[0, 0])
            idx = tuple(int(i) for i in torch.unravel_index(torch.tensor(k), a.shape)) if a.dim() else ()
            va, vb = a.reshape(-1)[k].item(), b.reshape(-1)[k].item()
            raise EmulatorError(
                f'kernel {self.entry.name}: argument {name!r} element {idx} differs between the two runs '
                f'(UB poison 0x{POISON_WORDS[0]:08X}, cores in order: {va!r}; poison 0x{POISON_WORDS[1]:08X}, '
                f'reverse order: {vb!r}): a never-written UB value reached GM, or the result depends on the order '
                'of the cores'
            )

    def _run(self, values, tensors, grid, order, poison):
        lib = self._lib
        page = lib.page
        # Group overlapping tensors (views of one storage) into one GM region, so aliasing is kept.
        spans = []
        for i, (_n, t) in enumerate(tensors):
            s = t.data_ptr()
            spans.append((s, s + _extent(t), i))
        regions: list[_Region] = []
        for s, e, i in sorted(spans):
            if regions and s < regions[-1].end and e > s:
                regions[-1].end = max(regions[-1].end, e)
                regions[-1].members.append(i)
            else:
                regions.append(_Region(s, e, [i]))
        # Arena: guard page | pages holding the region, right-aligned to 32 bytes | guard page | ...
        layout, total = [], page
        for r in regions:
            size = r.end - r.start
            pages = max(1, -(-(size + 32) // page))
            block = total
            total += pages * page + page
            layout.append((block, pages))
        status_bytes = 4096 + grid * 8 * len(_COUNTER_FIELDS)
        arena = lib.cdll.emu_map_shared(total)
        status = lib.cdll.emu_map_shared(status_bytes)
        if not arena or not status:
            raise EmulatorError('cannot map shared memory for the emulated GM')
        try:
            ctypes.memset(status, 0, status_bytes)
            for r, (block, pages) in zip(regions, layout, strict=True):
                size = r.end - r.start
                r.data = arena + block + pages * page - ((size + 31) // 32 * 32)
                r.lo_guard = arena + block - page
                r.hi_guard = arena + block + pages * page
                if size:
                    ctypes.memmove(r.data, r.start, size)
            lib.cdll.emu_protect_none(arena, page)
            for block, pages in layout:
                lib.cdll.emu_protect_none(arena + block + pages * page, page)
            ptr_of = {}
            for r in regions:
                for i in r.members:
                    ptr_of[i] = r.data + (tensors[i][1].data_ptr() - r.start)
            sw = _switches
            lib.cdll.emu_configure(
                self.entry.name.encode(),
                self.ub_limit,
                grid,
                int(sw['saturate']),
                int(sw['strict_pad']),
                int(sw['vf_membar']),
                status,
                status + 4096,
            )
            region_of = {i: r for r in regions for i in r.members}
            for i, (name, t) in enumerate(tensors):
                r = region_of[i]
                lib.cdll.emu_add_gm_arg(
                    name.encode(), ptr_of[i], _extent(t), r.lo_guard, r.lo_guard + page, r.hi_guard, r.hi_guard + page
                )
            cargs, ti = [], 0
            for p, ct in zip(self.entry.params, lib.fn.argtypes, strict=True):
                if p.is_pointer:
                    cargs.append(ctypes.c_void_p(ptr_of[ti]))
                    ti += 1
                else:
                    cargs.append(ct(values[p.name]))
            self._fork_and_run(cargs, order, poison)
            st = (ctypes.c_int32 * 2).from_address(status)
            if st[0] != 2:
                msg = ctypes.string_at(status + 8).decode(errors='replace')
                raise EmulatorError(msg or f'kernel {self.entry.name}: the emulated launch ended without a report')
            raw = (ctypes.c_uint64 * (grid * len(_COUNTER_FIELDS))).from_address(status + 4096)
            n = len(_COUNTER_FIELDS)
            counters = [tuple(int(raw[b * n + k]) for k in range(n)) for b in range(grid)]
            # Snapshot every tensor argument out of the arena, with the caller's shape and strides.
            snaps = []
            for i, (_name, t) in enumerate(tensors):
                r = region_of[i]
                size = r.end - r.start
                buf = torch.empty(max(size, 1), dtype=torch.uint8)
                if size:
                    ctypes.memmove(buf.data_ptr(), r.data, size)
                off = t.data_ptr() - r.start
                if t.numel() == 0:
                    snaps.append(torch.empty_like(t))
                    continue
                typed = buf[off : off + _extent(t)].view(t.dtype) if _extent(t) % t.element_size() == 0 else None
                if typed is None:
                    raise EmulatorError(f'argument {tensors[i][0]!r}: extent not a multiple of its element size')
                snaps.append(torch.as_strided(typed, t.shape, t.stride()).clone())
            return snaps, counters
        finally:
            lib.cdll.emu_unmap(arena, total)
            lib.cdll.emu_unmap(status, status_bytes)

    def _fork_and_run(self, cargs, order, poison) -> None:
        lib = self._lib
        timeout = os.environ.get(ENV_TIMEOUT, '300').strip()
        if not timeout.isdigit():
            raise ValueError(f'{ENV_TIMEOUT} must be a whole number of seconds, got {timeout!r}')
        pid = os.fork()
        if pid == 0:  # child: only ctypes calls, then _exit; never returns into the caller
            code = 0
            try:
                lib.cdll.emu_child_start(poison, int(timeout))
                for core in order:
                    lib.cdll.emu_core_begin(core)
                    lib.fn(*cargs)
                    lib.cdll.emu_core_end()
                lib.cdll.emu_child_done()
            except BaseException as e:
                code = 5
                with contextlib.suppress(BaseException):
                    lib.cdll.emu_child_fail(f'Python error in the emulated launch: {e!r}'.encode())
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        if os.WIFSIGNALED(status):
            # the runtime's handlers catch faults; a signal here means the child was killed from outside
            raise EmulatorError(
                f'kernel {self.entry.name}: the emulated launch was killed by signal {os.WTERMSIG(status)}'
            )
