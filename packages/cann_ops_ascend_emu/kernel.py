"""A TileLang prim_func on the emulator: lowered for Ascend 950, called like TileLang's JIT kernel of it.

Ascend C emulated on CPU. Buffer parameters are bound to the entry's C parameters by name; dynamic shape and
stride variables are bound from the tensors, and dtypes, shapes and static strides are checked the way
TileLang's host code checks them.
"""

from __future__ import annotations

import torch

from cann_ops_ascend_emu.driver import (
    EmulatorError,
    LaunchReport,
    SourceKernel,
    parse_entry,
    ub_limit_of,
)

_TORCH_DTYPES = {
    'float32': torch.float32,
    'float16': torch.float16,
    'bfloat16': torch.bfloat16,
    'float64': torch.float64,
    'int8': torch.int8,
    'int16': torch.int16,
    'int32': torch.int32,
    'int64': torch.int64,
    'uint8': torch.uint8,
    'uint16': torch.uint16,
    'uint32': torch.uint32,
    'uint64': torch.uint64,
    'bool': torch.bool,
    'float8_e4m3fn': torch.float8_e4m3fn,  # storage only: the emulated fp8 conversions write its bytes
    'float8_e5m2': torch.float8_e5m2,  # likewise (vcvt's fp8_e5m2 <-> fp32 pairs, vector.h)
}


def _lower(prim_func) -> tuple[str, int]:
    """(Ascend C source, merged UB bytes) of `prim_func` lowered for Ascend 950 (cached on disk)."""
    from cann_ops_tilelang.kernel_target import lower_to_source, tilelang_target

    return lower_to_source(prim_func, tilelang_target('ascend'))


def _grid_expr(prim_func):
    """The blockIdx.x extent of the prim_func (its T.Kernel(n)), as a PrimExpr."""
    from tilelang import tvm

    found = []

    def visit(node):
        if isinstance(node, tvm.tirx.For) and node.thread_binding is not None:
            if node.thread_binding.thread_tag == 'blockIdx.x':
                found.append(node.extent)
        elif isinstance(node, tvm.tirx.AttrStmt) and node.attr_key == 'thread_extent':
            iv = node.node
            if getattr(iv, 'thread_tag', None) == 'blockIdx.x':
                found.append(node.value)

    tvm.tirx.stmt_functor.post_order_visit(prim_func.body, visit)
    if not found:
        raise EmulatorError('the prim_func has no blockIdx.x extent (T.Kernel)')
    return found[0]


def _eval_int(expr, binds: dict, what: str) -> int:
    from tilelang import tvm

    if isinstance(expr, int):
        return expr
    if isinstance(expr, tvm.tirx.IntImm):
        return int(expr.value)
    vmap = {v: tvm.tirx.const(val, v.dtype) for v, val in binds.items()}
    e = tvm.arith.Analyzer().simplify(tvm.tirx.stmt_functor.substitute(expr, vmap))
    if not isinstance(e, tvm.tirx.IntImm):
        raise EmulatorError(f'cannot evaluate {what} = {expr} (unbound variables)')
    return int(e.value)


class EmulatedKernel:
    """`prim_func` lowered for Ascend 950 (or `source`, when given, used as is) and run on the emulator.

    Call it like TileLang's JIT kernel: the prim_func's parameters in order, torch CPU tensors for buffers and
    Python numbers for scalars. `seed` fixes the shuffled core order (default: torch.initial_seed()).
    """

    def __init__(self, prim_func, source: str | None = None, *, seed: int | None = None):
        self.prim_func = prim_func
        self.ub_bytes: int | None = None
        if source is None:
            source, self.ub_bytes = _lower(prim_func)
        self._source = source
        self.entry = parse_entry(source)
        self.ub_limit = ub_limit_of(source)
        if self.ub_bytes is not None and self.ub_bytes > self.ub_limit:
            raise EmulatorError(
                f'kernel {self.entry.name}: merged UB allocation {self.ub_bytes} B exceeds the {self.ub_limit} B UB'
            )
        self._grid = _grid_expr(prim_func)
        self.seed = seed
        self._kernel = SourceKernel(source, grid=1, ub_limit=self.ub_limit)
        self.last_report: LaunchReport | None = None

    def get_kernel_source(self) -> str:
        return self._source

    def __call__(self, *args):
        from tilelang import tvm

        pf = self.prim_func
        params = list(pf.params)
        if len(args) != len(params):
            raise TypeError(f'{self.entry.name} takes {len(params)} arguments, got {len(args)}')
        binds: dict = {}
        values: dict = {}
        checks = []
        for p, a in zip(params, args, strict=True):
            if p in pf.buffer_map:
                buf = pf.buffer_map[p]
                name = buf.name
                cname = buf.data.name  # the entry's C parameter is named after the buffer's data variable
                if not isinstance(a, torch.Tensor):
                    raise TypeError(
                        f'{self.entry.name}: argument {name!r} must be a torch tensor, got {type(a).__name__}'
                    )
                want = _TORCH_DTYPES.get(str(buf.dtype))
                if a.dtype != want:
                    raise EmulatorError(
                        f'{self.entry.name}: argument {name!r} dtype mismatch, expected {buf.dtype}, got {a.dtype}'
                    )
                if a.dim() != len(buf.shape):
                    raise EmulatorError(
                        f'{self.entry.name}: argument {name!r} ndim mismatch, expected {len(buf.shape)}, got {a.dim()}'
                    )
                strides = list(buf.strides) if len(buf.strides) else None
                if strides is None:
                    # a compact buffer: TileLang requires the row-major strides
                    acc, want_strides = 1, []
                    for n in reversed(a.shape):
                        want_strides.append(acc)
                        acc *= n
                    want_strides.reverse()
                for d, e in enumerate(buf.shape):
                    self._bind_or_check(e, int(a.shape[d]), binds, checks, f'{name}.shape[{d}]')
                for d in range(a.dim()):
                    if strides is None:
                        if a.shape[d] != 1 and a.stride(d) != want_strides[d]:
                            raise EmulatorError(
                                f'{self.entry.name}: argument {name!r} stride[{d}] mismatch, expected a compact tensor '
                                f'(strides {tuple(want_strides)}), got {a.stride()}'
                            )
                    elif a.shape[d] != 1 or isinstance(strides[d], tvm.tirx.Var):
                        self._bind_or_check(strides[d], int(a.stride(d)), binds, checks, f'{name}.strides[{d}]')
                values[cname] = a
            else:
                if isinstance(a, torch.Tensor) or not isinstance(a, (int, float, bool)):
                    raise TypeError(
                        f'{self.entry.name}: argument {p.name!r} must be a Python number, got {type(a).__name__}'
                    )
                binds[p] = a
                values[p.name] = a
        for expr, actual, what in checks:
            want = _eval_int(expr, binds, what)
            if want != actual:
                shown = str(want) if isinstance(expr, (int, tvm.tirx.IntImm)) else f'{expr} = {want}'
                raise EmulatorError(f'{self.entry.name}: {what} mismatch, expected {shown}, got {actual}')
        by_name = {v.name: val for v, val in binds.items()}
        cvals = {}
        for cp in self.entry.params:
            if cp.name in values:
                cvals[cp.name] = values[cp.name]
            elif cp.name in by_name:
                cvals[cp.name] = by_name[cp.name]
            else:
                raise EmulatorError(f'{self.entry.name}: entry parameter {cp.name!r} is bound by no argument')
        grid = _eval_int(self._grid, binds, 'the grid (blockIdx.x extent)')
        if grid < 1:
            raise EmulatorError(f'{self.entry.name}: grid of {grid} blocks')
        self._kernel.seed = self.seed
        self.last_report = self._kernel.launch(cvals, grid=grid)
        return None

    @staticmethod
    def _bind_or_check(expr, actual: int, binds: dict, checks: list, what: str) -> None:
        from tilelang import tvm

        if isinstance(expr, tvm.tirx.Var):
            if expr in binds and binds[expr] != actual:
                raise EmulatorError(f'{what} = {actual} conflicts with {expr.name} = {binds[expr]} bound earlier')
            binds[expr] = actual
        else:
            checks.append((expr, actual, what))


def compile_prim_func(prim_func, *, seed: int | None = None) -> EmulatedKernel:
    """Lower `prim_func` for Ascend 950 and build it for the emulator (cached by source hash)."""
    return EmulatedKernel(prim_func, seed=seed)
