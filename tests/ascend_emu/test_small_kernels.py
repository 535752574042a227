"""Small TileLang Ascend kernels written for these tests, Ascend C emulated on CPU, against torch references.

They take paths the Engram kernels do not: a row whose length is no multiple of the block (a short last
task per row, copied with a runtime extent), a SIMD store under a runtime tail mask, the same work on the
SIMT path, and an accumulation under a tail mask in MODE_MERGING whose inactive lanes hold the emulator's
UB poison (NaN): a lane the mask fails to exclude shows up as a NaN in the result.
"""

# No `from __future__ import annotations`: TileLang evaluates the prim_func annotations, which refer to the
# generators' local sizes.
import functools

import cann_ops_ascend_emu as emu
import pytest
import torch

LANES = 64  # fp32 lanes of one 256-byte vector register


def _product_kernel(hc: int, hidden: int, blk: int, num_cores: int, threads: int | None):
    """out[h, d] = float(a[h, d]) * float(b[h, d]) in tasks of `blk` elements of a row, the last one shorter;
    SIMD vectors under a tail mask, or with `threads` one SIMT thread per element."""
    import tilelang.ascend.language as T

    per_row = -(-hidden // blk)
    num_tasks = hc * per_row
    grid = min(num_cores, num_tasks)

    @T.prim_func
    def product_kernel(
        a: T.Tensor((hc, hidden), T.bfloat16),
        b: T.Tensor((hc, hidden), T.bfloat16),
        out: T.Tensor((hc, hidden), T.float32),
    ):
        with T.Kernel(grid) as cid:
            a_ub = T.alloc_shared((blk,), T.bfloat16)
            b_ub = T.alloc_shared((blk,), T.bfloat16)
            o_ub = T.alloc_shared((blk,), T.float32)
            for t in T.Persistent([num_tasks], grid, cid, group_size=1, num_stages=1):
                h = t // per_row
                d0 = (t % per_row) * blk
                n = T.min(blk, hidden - d0)
                T.copy(a[h, d0 : d0 + n], a_ub[0:n])
                T.copy(b[h, d0 : d0 + n], b_ub[0:n])
                if threads is None:
                    with T.SimdVF():
                        for c in T.serial(T.ceildiv(n, LANES)):
                            av = T.simd.vcvt(T.simd.vld(a_ub[c * LANES], dist='UNPK_B16'), T.float32)
                            bv = T.simd.vcvt(T.simd.vld(b_ub[c * LANES], dist='UNPK_B16'), T.float32)
                            tail = T.simd.update_mask(n - c * LANES)  # lanes [0, n - c * LANES) of the last vector
                            T.simd.vsts(o_ub[c * LANES], T.simd.vmul(av, bv), mask=tail)
                else:
                    with T.SimtVF(threads=threads):
                        for i in T.Parallel(blk):
                            if i < n:
                                o_ub[i] = T.cast(a_ub[i], T.float32) * T.cast(b_ub[i], T.float32)
                T.copy(o_ub[0:n], out[h, d0 : d0 + n])

    return product_kernel


def _sum_of_squares_kernel(rows: int, hidden: int):
    """out[r] = sum(x[r] ** 2): one row per core, vectors accumulated with vmula under a tail mask."""
    import tilelang.ascend.language as T

    vectors = -(-hidden // LANES)

    @T.prim_func
    def sum_of_squares_kernel(x: T.Tensor((rows, hidden), T.float32), out: T.Tensor((rows,), T.float32)):
        with T.Kernel(rows) as r:
            x_ub = T.alloc_shared((vectors * LANES,), T.float32)  # the lanes past `hidden` are never written
            s_ub = T.alloc_shared((LANES,), T.float32)
            T.copy(x[r, :], x_ub[0:hidden])
            with T.SimdVF():
                acc = T.simd.alloc_var(T.float32)
                acc = T.simd.vdup(0.0, T.float32)
                for c in T.serial(vectors):
                    v = T.simd.vld(x_ub[c * LANES])
                    # MODE_MERGING: lanes outside the mask keep acc, so the poisoned tail never enters it
                    T.simd.vmula(acc, v, v, mask=T.simd.update_mask(hidden - c * LANES), mode='MODE_MERGING')
                T.simd.vsts(s_ub[0], T.simd.vcadd(acc))
            T.copy(s_ub[0:1], out[r : r + 1])

    return sum_of_squares_kernel


@functools.cache
def _compiled(make, *args):
    return emu.compile_prim_func(make(*args))


@pytest.mark.parametrize(
    ('hc', 'hidden', 'threads'),
    [(3, 1100, None), (2, 1000, 256), (1, 40, None)],  # 1100 = 2 * 512 + 76; 40: one task, shorter than a vector
    ids=['simd', 'simt', 'simd-one-short-task'],
)
def test_product_with_a_short_last_task(hc, hidden, threads):
    kernel = _compiled(_product_kernel, hc, hidden, 512, 8, threads)
    a = torch.randn(hc, hidden).to(torch.bfloat16)
    b = torch.randn(hc, hidden).to(torch.bfloat16)
    out = torch.full((hc, hidden), float('nan'))
    kernel(a, b, out)
    assert torch.equal(out, a.float() * b.float())  # the product of two bf16 values is exact in fp32
    if threads is not None:
        assert kernel.last_report.total('simt_threads') > 0


@pytest.mark.parametrize('hidden', [200, 256])  # 200 = 3 * 64 + 8: a tail of 8 lanes; 256: none
def test_sum_of_squares_under_a_merging_tail_mask(hidden):
    rows = 5
    kernel = _compiled(_sum_of_squares_kernel, rows, hidden)
    x = torch.randn(rows, hidden)
    out = torch.full((rows,), float('nan'))
    kernel(x, out)
    exact = x.double().square().sum(-1)
    # positive fp32 terms: hidden / 64 + 6 roundings (lane sums, then the 64-lane tree) of the sum at most
    torch.testing.assert_close(out.double(), exact, rtol=(hidden / LANES + 6) * 2.0**-24, atol=0)
