"""Kernels of engram_gate_fwd (shared/docs/engram.md, "Forward"): Ascend 950 and CUDA.

Per token t and branch h (vectors over the hidden size H, fp32 math, bf16 in/out):
    rstd_x = rsqrt(mean(x^2) + eps), rstd_k = rsqrt(mean(k^2) + eps), dot = sum(x * w * k)
    d = dot * rstd_x * rstd_k / sqrt(H), g = sigmoid(sign(d) * sqrt(max(|d|, clamp)))
    out = x + g * v[t]

Design: one pass over memory. Every (t, h) row of x and k is read once and kept on chip between
the reductions and the epilogue; the fused weight stays on chip for the whole kernel where it fits.
"""

# No `from __future__ import annotations`: TileLang reads the prim_func annotations at build time.
import dataclasses
import functools

from cann_ops_tilelang.config import Backend
from cann_ops_tilelang.engram._contract import HIDDEN_ALIGN, MAX_HC, MAX_HIDDEN
from cann_ops_tilelang.kernel_target import compile_kernel

# --- CUDA tuning model -----------------------------------------------------------------------
CUDA_VEC = 8  # bf16 elements per 16-byte access: the unit ("chunk") a thread owns
CUDA_REGS_PER_SM = 65536
CUDA_MAX_BLOCKS_PER_SM = 8

# --- Ascend 950 model --------------------------------------------------------------------------
ASCEND_LANES = 64  # fp32 lanes of one 256-byte vector register
ASCEND_UB_BUDGET = 232 * 1024  # keep a margin for the small buffers and alignment padding


@dataclasses.dataclass(frozen=True)
class EngramGateFwdConfig:
    backend: Backend
    hc: int
    hidden: int
    num_cores: int  # Ascend: vector cores; CUDA: SMs (persistent grid = num_cores * blocks_per_core)
    save_for_backward: bool = True
    has_mask: bool = False  # the kernel takes image_token_mask (T,) bool (mask=None is its own variant)
    # CUDA: a block owns one branch h and streams tokens; each thread owns `chunks` 8-element
    # column chunks of that branch (weight in registers for the whole kernel).
    threads: int = 128
    chunks: int = 1
    blocks_per_core: int = 1
    vec: int = 8  # elements per global access of k/v/x/out (alignment of the actual tensors: 8, 4, 2 or 1)
    # Ascend: a task is (token, group of `group` branches); `stages` buffer versions.
    group: int = 1
    stages: int = 2
    weight_resident: bool = False  # Ascend: the whole (hc, H) fp32 weight stays in UB

    def __post_init__(self):
        if self.backend not in ('ascend', 'cuda'):
            raise ValueError(f'unknown backend {self.backend!r}')
        if not 1 <= self.hc <= MAX_HC or self.hidden % HIDDEN_ALIGN or not HIDDEN_ALIGN <= self.hidden <= MAX_HIDDEN:
            raise ValueError(f'unsupported hc={self.hc}, hidden={self.hidden}')
        if self.vec not in (1, 2, 4, 8):
            raise ValueError(f'vec must be 1, 2, 4 or 8, got {self.vec}')
        if self.backend == 'cuda':
            if self.threads % 32 or not 32 <= self.threads <= 1024:
                raise ValueError(f'threads must be a multiple of 32 in 32..1024, got {self.threads}')
            if self.threads * self.chunks * CUDA_VEC < self.hidden:
                raise ValueError('threads * chunks * 8 must cover the hidden size')
        else:
            if self.hc % self.group:
                raise ValueError(f'group {self.group} must divide hc {self.hc}')

    @property
    def persistent_blocks(self) -> int:
        """CUDA: blocks per branch (the grid is hc * persistent_blocks)."""
        return max(1, self.num_cores * self.blocks_per_core // self.hc)


def _cuda_regs_estimate(chunks: int) -> int:
    # w: 8 fp32 per chunk; x, k, v: 8 bf16 (4 registers) per chunk; plus addressing/reductions
    # (ptxas, sm_90: 65 registers at 2 chunks, 104 at 4, 162 at 7, 187 at 8). Forcing one more block
    # per SM than this allows spills, which cost far more than the lost occupancy (README, Performance).
    return 20 * chunks + 24


def _ascend_ub_bytes(hc: int, hidden: int, group: int, stages: int, weight_resident: bool) -> int:
    per_stage = group * hidden * 2 * 2 + hidden * 2  # x (also the out tile), k, v
    w = hc * hidden * 4 if weight_resident else stages * group * hidden * 4
    return stages * per_stage + w + 4 * 1024


def choose_engram_gate_fwd_config(
    *,
    backend: Backend,
    hc: int,
    hidden: int,
    num_cores: int,
    save_for_backward: bool = True,
    has_mask: bool = False,
    vec: int = 8,
) -> EngramGateFwdConfig:
    """Compile-time parameters for one shape (pure: no device query)."""
    if backend == 'cuda':
        h8 = hidden // CUDA_VEC
        # Smallest thread count (multiple of 32, >= 64 where the row allows) giving <= 8 chunks per
        # thread; prefer an exact division of the row so no thread is predicated.
        threads, chunks = None, None
        for cand in (128, 64, 192, 256, 96, 320, 384, 448, 512, 640, 768, 896, 1024):
            c = -(-h8 // cand)
            if c <= 8 and h8 % cand == 0:
                threads, chunks = cand, c
                break
        if threads is None:
            threads = min(1024, max(32, -(-min(h8, 128) // 32) * 32))
            chunks = -(-h8 // threads)
            while chunks > 8 and threads < 1024:
                threads += 32
                chunks = -(-h8 // threads)
        regs = -(-_cuda_regs_estimate(chunks) // 8) * 8
        blocks = max(1, min(CUDA_MAX_BLOCKS_PER_SM, CUDA_REGS_PER_SM // (regs * threads), 2048 // threads))
        return EngramGateFwdConfig(
            backend='cuda',
            hc=hc,
            hidden=hidden,
            num_cores=num_cores,
            save_for_backward=save_for_backward,
            has_mask=has_mask,
            threads=threads,
            chunks=chunks,
            blocks_per_core=blocks,
            vec=vec,
        )
    if backend == 'ascend':
        best = None
        for weight_resident in (True, False):
            for stages in (2, 1):
                for group in sorted((g for g in range(1, hc + 1) if hc % g == 0), reverse=True):
                    if _ascend_ub_bytes(hc, hidden, group, stages, weight_resident) <= ASCEND_UB_BUDGET:
                        best = (group, stages, weight_resident)
                        break
                if best:
                    break
            if best:
                break
        if best is None:
            raise ValueError(f'no Ascend tiling fits the Unified Buffer for hc={hc}, hidden={hidden}')
        group, stages, weight_resident = best
        # `vec` is a CUDA field: the Ascend DMA takes any GM alignment, so it stays at its default.
        return EngramGateFwdConfig(
            backend='ascend',
            hc=hc,
            hidden=hidden,
            num_cores=num_cores,
            save_for_backward=save_for_backward,
            has_mask=has_mask,
            group=group,
            stages=stages,
            weight_resident=weight_resident,
        )
    raise ValueError(f'unknown backend {backend!r}')


def make_engram_gate_fwd_kernel(cfg: EngramGateFwdConfig):
    """The TileLang prim_func `engram_gate_fwd_kernel` for `cfg.backend` (no device query, no compile)."""
    if cfg.backend == 'cuda':
        return _cuda_engram_gate_fwd_kernel(cfg)
    return _ascend_engram_gate_fwd_kernel(cfg)


@functools.cache
def get_engram_gate_fwd_kernel(cfg: EngramGateFwdConfig):
    return compile_kernel(make_engram_gate_fwd_kernel(cfg), cfg.backend)


def _engram_gate_fwd_prim_func(T, body, *, hc, hidden, save, has_mask, num_tokens, strides):
    """The prim_func `engram_gate_fwd_kernel` around a backend's kernel body, a T.macro taking (x, k, v, w,
    image_token_mask, out, dot, gate_score, rstd_x, rstd_k, eps, clamp_value) with None for what the variant
    does not take: image_token_mask (T,) bool only when `has_mask`, the four saved (T, hc) fp32 outputs only
    when `save`. `T` is the backend's language module; `strides` the dynamic (k_stride_t, k_stride_h,
    v_stride_t). In place, `out` is `x` itself: every element of x is read before the same core/thread
    writes it, and no other one touches it."""
    k_st, k_sh, v_st = strides
    f32, bf16 = T.float32, T.bfloat16
    if save and has_mask:

        @T.prim_func
        def engram_gate_fwd_kernel(
            x: T.Tensor((num_tokens, hc, hidden), bf16),
            k: T.StridedTensor((num_tokens, hc, hidden), (k_st, k_sh, 1), bf16),
            v: T.StridedTensor((num_tokens, hidden), (v_st, 1), bf16),
            w: T.Tensor((hc, hidden), f32),
            image_token_mask: T.Tensor((num_tokens,), T.bool),
            out: T.Tensor((num_tokens, hc, hidden), bf16),
            dot_o: T.Tensor((num_tokens, hc), f32),
            g_o: T.Tensor((num_tokens, hc), f32),
            rx_o: T.Tensor((num_tokens, hc), f32),
            rk_o: T.Tensor((num_tokens, hc), f32),
            eps: T.float32,
            clamp_value: T.float32,
        ):
            body(x, k, v, w, image_token_mask, out, dot_o, g_o, rx_o, rk_o, eps, clamp_value)

    elif save:

        @T.prim_func
        def engram_gate_fwd_kernel(
            x: T.Tensor((num_tokens, hc, hidden), bf16),
            k: T.StridedTensor((num_tokens, hc, hidden), (k_st, k_sh, 1), bf16),
            v: T.StridedTensor((num_tokens, hidden), (v_st, 1), bf16),
            w: T.Tensor((hc, hidden), f32),
            out: T.Tensor((num_tokens, hc, hidden), bf16),
            dot_o: T.Tensor((num_tokens, hc), f32),
            g_o: T.Tensor((num_tokens, hc), f32),
            rx_o: T.Tensor((num_tokens, hc), f32),
            rk_o: T.Tensor((num_tokens, hc), f32),
            eps: T.float32,
            clamp_value: T.float32,
        ):
            body(x, k, v, w, None, out, dot_o, g_o, rx_o, rk_o, eps, clamp_value)

    elif has_mask:

        @T.prim_func
        def engram_gate_fwd_kernel(
            x: T.Tensor((num_tokens, hc, hidden), bf16),
            k: T.StridedTensor((num_tokens, hc, hidden), (k_st, k_sh, 1), bf16),
            v: T.StridedTensor((num_tokens, hidden), (v_st, 1), bf16),
            w: T.Tensor((hc, hidden), f32),
            image_token_mask: T.Tensor((num_tokens,), T.bool),
            out: T.Tensor((num_tokens, hc, hidden), bf16),
            eps: T.float32,
            clamp_value: T.float32,
        ):
            body(x, k, v, w, image_token_mask, out, None, None, None, None, eps, clamp_value)

    else:

        @T.prim_func
        def engram_gate_fwd_kernel(
            x: T.Tensor((num_tokens, hc, hidden), bf16),
            k: T.StridedTensor((num_tokens, hc, hidden), (k_st, k_sh, 1), bf16),
            v: T.StridedTensor((num_tokens, hidden), (v_st, 1), bf16),
            w: T.Tensor((hc, hidden), f32),
            out: T.Tensor((num_tokens, hc, hidden), bf16),
            eps: T.float32,
            clamp_value: T.float32,
        ):
            body(x, k, v, w, None, out, None, None, None, None, eps, clamp_value)

    return engram_gate_fwd_kernel


# ==============================================================================================
# CUDA
# ==============================================================================================


def _cuda_engram_gate_fwd_kernel(cfg: EngramGateFwdConfig):
    import tilelang.language as T

    hc, hidden, save, has_mask = cfg.hc, cfg.hidden, cfg.save_for_backward, cfg.has_mask
    nt, nc, vec = cfg.threads, cfg.chunks, cfg.vec
    npb = cfg.persistent_blocks
    nw = nt // 32
    ve = CUDA_VEC
    guard = (hidden // ve) % nt != 0  # the last chunk of some threads is past the row
    inv_hidden = 1.0 / hidden
    scale = hidden**-0.5
    f32, bf16 = T.float32, T.bfloat16

    num_tokens = T.dynamic('num_tokens')
    k_st = T.dynamic('k_stride_t')
    k_sh = T.dynamic('k_stride_h')
    v_st = T.dynamic('v_stride_t')

    @T.macro
    def store_gated(out, x_l, v_l, st, t, h, col, c):
        for j0 in T.unroll(ve // vec):
            for j in T.vectorized(vec):
                out[t, h, col + j0 * vec + j] = T.cast(
                    T.cast(x_l[c * ve + j0 * vec + j], f32) + st[3] * T.cast(v_l[c * ve + j0 * vec + j], f32),
                    bf16,
                )

    @T.macro
    def body(x, k, v, w, image_token_mask, out, dot_o, g_o, rx_o, rk_o, eps, clamp_value):
        with T.Kernel(hc * npb, threads=nt) as bid:
            # `red` is double-buffered by token parity: the one barrier below is all it needs.
            T.annotate_pass_configs({'tl.disable_thread_storage_sync': True})
            T.annotate_min_blocks_per_sm(cfg.blocks_per_core)
            T.evaluate(T.assume(k_st % vec == 0))
            T.evaluate(T.assume(k_sh % vec == 0))
            T.evaluate(T.assume(v_st % vec == 0))
            tid = T.get_thread_binding()
            h = bid % hc
            b = bid // hc
            w_l = T.alloc_local((nc * ve,), f32)
            x_l = T.alloc_local((nc * ve,), bf16)
            k_l = T.alloc_local((nc * ve,), bf16)
            v_l = T.alloc_local((nc * ve,), bf16)
            acc = T.alloc_local((3,), f32)
            tot = T.alloc_local((3,), f32)
            st = T.alloc_local((4,), f32)  # rstd_x, rstd_k, d, g
            red = T.alloc_shared((2, 3, nw), f32)

            # The weight row of branch h, once per block (kept in registers).
            for c in T.unroll(nc):
                col = (tid + c * nt) * ve
                if not guard or col < hidden:
                    for j in T.vectorized(ve):
                        w_l[c * ve + j] = w[h, col + j]
                else:
                    for j in T.unroll(ve):
                        w_l[c * ve + j] = 0.0

            for i in T.serial(T.ceildiv(num_tokens - b, npb)):
                t = b + i * npb
                # Issue every load of the row (x, k and v) before any use.
                for c in T.unroll(nc):
                    col = (tid + c * nt) * ve
                    if not guard or col < hidden:
                        for j0 in T.unroll(ve // vec):
                            for j in T.vectorized(vec):
                                x_l[c * ve + j0 * vec + j] = x[t, h, col + j0 * vec + j]
                        for j0 in T.unroll(ve // vec):
                            for j in T.vectorized(vec):
                                k_l[c * ve + j0 * vec + j] = k[t, h, col + j0 * vec + j]
                        for j0 in T.unroll(ve // vec):
                            for j in T.vectorized(vec):
                                v_l[c * ve + j0 * vec + j] = v[t, col + j0 * vec + j]
                    else:
                        for j in T.unroll(ve):
                            x_l[c * ve + j] = T.cast(0, bf16)
                            k_l[c * ve + j] = T.cast(0, bf16)
                            v_l[c * ve + j] = T.cast(0, bf16)
                acc[0] = 0.0
                acc[1] = 0.0
                acc[2] = 0.0
                for c in T.unroll(nc):
                    for j in T.unroll(ve):
                        xf = T.cast(x_l[c * ve + j], f32)
                        kf = T.cast(k_l[c * ve + j], f32)
                        acc[0] += xf * xf
                        acc[1] += kf * kf
                        acc[2] += xf * w_l[c * ve + j] * kf
                for r in T.unroll(3):
                    tot[r] = T.warp_reduce_sum(acc[r])
                # Cross-warp reduction; `red` alternates by token parity so one barrier suffices.
                if tid % 32 == 0:
                    for r in T.unroll(3):
                        red[i % 2, r, tid // 32] = tot[r]
                T.sync_threads()
                for r in T.unroll(3):
                    tot[r] = red[i % 2, r, 0]
                    for q in T.unroll(1, nw):
                        tot[r] += red[i % 2, r, q]
                st[0] = T.rsqrt(tot[0] * inv_hidden + eps)
                st[1] = T.rsqrt(tot[1] * inv_hidden + eps)
                st[2] = tot[2] * st[0] * st[1] * scale
                st[3] = T.sqrt(T.max(T.abs(st[2]), clamp_value))
                st[3] = T.if_then_else(st[2] > 0, st[3], T.if_then_else(st[2] < 0, -st[3], T.float32(0)))
                st[3] = 1.0 / (1.0 + T.exp(-st[3]))
                if has_mask:  # noqa: SIM102 (a Python-level switch around a device-side condition)
                    if image_token_mask[t]:  # an image token: saved tensors 0, out = x (below)
                        tot[2] = 0.0
                        for r in T.unroll(4):
                            st[r] = 0.0
                if save:  # noqa: SIM102
                    if tid == 0:
                        dot_o[t, h] = tot[2]
                        g_o[t, h] = st[3]
                        rx_o[t, h] = st[0]
                        rk_o[t, h] = st[1]
                for c in T.unroll(nc):
                    col = (tid + c * nt) * ve
                    if not guard or col < hidden:
                        if has_mask:
                            if image_token_mask[t]:  # x itself, bit for bit (x + 0 * v would not be: -0, inf)
                                for j0 in T.unroll(ve // vec):
                                    for j in T.vectorized(vec):
                                        out[t, h, col + j0 * vec + j] = x_l[c * ve + j0 * vec + j]
                            else:
                                store_gated(out, x_l, v_l, st, t, h, col, c)
                        else:
                            store_gated(out, x_l, v_l, st, t, h, col, c)

    return _engram_gate_fwd_prim_func(
        T,
        body,
        hc=hc,
        hidden=hidden,
        save=save,
        has_mask=cfg.has_mask,
        num_tokens=num_tokens,
        strides=(k_st, k_sh, v_st),
    )


# ==============================================================================================
# Ascend 950
# ==============================================================================================


def _ascend_engram_gate_fwd_kernel(cfg: EngramGateFwdConfig):
    """SIMD kernel. A task is (token t, group of `group` branches); tasks go round-robin over the vector
    cores (T.Persistent, `stages` buffer versions so the DMA of the next task overlaps the vector work).

    Per task: v[t] (H), x and k rows of the group ((group, H) bf16, strided k rows by the tensor strides)
    and, unless it stays resident for the whole kernel, the fp32 weight rows land in UB; one vector pass
    per branch accumulates x*x, k*k and x*w*k in three 64-lane registers, folds them (vcadd) and computes
    rstd_x, rstd_k and the gate in lane 0; a second pass writes out = x + g*v over the x tile in place
    (bf16), which then goes back to GM.
    """
    import tilelang.ascend.language as T

    hc, hidden, save, has_mask = cfg.hc, cfg.hidden, cfg.save_for_backward, cfg.has_mask
    grp, stages, resident = cfg.group, cfg.stages, cfg.weight_resident
    ngrp = hc // grp
    lanes = ASCEND_LANES
    nchunk = hidden // lanes
    inv_hidden = 1.0 / hidden
    scale = hidden**-0.5
    num_cores = cfg.num_cores
    f32, bf16 = T.float32, T.bfloat16

    num_tokens = T.dynamic('num_tokens')
    k_st = T.dynamic('k_stride_t')
    k_sh = T.dynamic('k_stride_h')
    v_st = T.dynamic('v_stride_t')

    @T.macro
    def gate_vf(x_ub, k_ub, v_ub, w_ub, s_ub, h0, eps, clamp_value):
        with T.SimdVF():
            one = T.simd.vdup(1.0, f32)
            zero = T.simd.vdup(0.0, f32)
            for i in T.serial(grp):
                wr = h0 + i if resident else i
                axx = T.simd.alloc_var(f32)
                akk = T.simd.alloc_var(f32)
                adt = T.simd.alloc_var(f32)
                axx = T.simd.vdup(0.0, f32)
                akk = T.simd.vdup(0.0, f32)
                adt = T.simd.vdup(0.0, f32)
                for c in T.serial(nchunk):
                    xv = T.simd.vcvt(T.simd.vld(x_ub[i, c * lanes], dist='UNPK_B16'), f32)
                    kv = T.simd.vcvt(T.simd.vld(k_ub[i, c * lanes], dist='UNPK_B16'), f32)
                    wv = T.simd.vld(w_ub[wr, c * lanes])
                    T.simd.vmula(axx, xv, xv)
                    T.simd.vmula(akk, kv, kv)
                    T.simd.vmula(adt, T.simd.vmul(xv, wv), kv)
                sdt = T.simd.vcadd(adt)
                rx = T.simd.vdiv(one, T.simd.vsqrt(T.simd.vadds(T.simd.vmuls(T.simd.vcadd(axx), inv_hidden), eps)))
                rk = T.simd.vdiv(one, T.simd.vsqrt(T.simd.vadds(T.simd.vmuls(T.simd.vcadd(akk), inv_hidden), eps)))
                d = T.simd.vmuls(T.simd.vmul(T.simd.vmul(sdt, rx), rk), scale)
                z = T.simd.vsqrt(T.simd.vmaxs(T.simd.vabs(d), clamp_value))
                z = T.simd.vsel(
                    z,
                    T.simd.vsel(T.simd.vneg(z), zero, T.simd.vcmps(d, 0.0, op='lt')),
                    T.simd.vcmps(d, 0.0, op='gt'),
                )
                g = T.simd.vdiv(one, T.simd.vadds(T.simd.vexp(T.simd.vneg(z)), 1.0))
                if save:
                    T.simd.vsts(s_ub[0, i], sdt, dist='ONEPT_B32')
                    T.simd.vsts(s_ub[1, i], g, dist='ONEPT_B32')
                    T.simd.vsts(s_ub[2, i], rx, dist='ONEPT_B32')
                    T.simd.vsts(s_ub[3, i], rk, dist='ONEPT_B32')
                gb = T.simd.vdupv(g)
                for c in T.serial(nchunk):
                    o = T.simd.alloc_var(f32)
                    o = T.simd.vcvt(T.simd.vld(x_ub[i, c * lanes], dist='UNPK_B16'), f32)
                    vv = T.simd.vcvt(T.simd.vld(v_ub[c * lanes], dist='UNPK_B16'), f32)
                    T.simd.vmula(o, gb, vv)
                    T.simd.vsts(x_ub[i, c * lanes], T.simd.vcvt(o, bf16), dist='PK_B32')

    @T.macro
    def body(x, k, v, w, image_token_mask, out, dot_o, g_o, rx_o, rk_o, eps, clamp_value):
        with T.Kernel(num_cores) as cid:
            x_ub = T.alloc_shared((grp, hidden), bf16)  # x, then out (in place)
            k_ub = T.alloc_shared((grp, hidden), bf16)
            v_ub = T.alloc_shared((hidden,), bf16)
            w_ub = T.alloc_shared((hc if resident else grp, hidden), f32)
            s_ub = T.alloc_shared((4, 8), f32)  # dot, g, rstd_x, rstd_k of the group (32-byte rows)
            if resident:
                T.copy(w, w_ub)
                T.annotate_buffer_versions({x_ub: stages, k_ub: stages, v_ub: stages, w_ub: 1})
            else:
                T.annotate_buffer_versions({x_ub: stages, k_ub: stages, v_ub: stages, w_ub: stages})
            for task in T.Persistent([num_tokens * ngrp], num_cores, cid, group_size=1, num_stages=stages):
                t = task // ngrp
                h0 = (task % ngrp) * grp
                # One scheduler task per pipe (MTE2 loads, vector, MTE3 stores) keeps the Z3
                # modulo scheduling of the loop small (lowering time).
                with T.Task():
                    T.copy(x[t, h0 : h0 + grp, :], x_ub)
                    T.copy(k[t, h0 : h0 + grp, :], k_ub)
                    T.copy(v[t, :], v_ub)
                    if not resident:
                        T.copy(w[h0 : h0 + grp, :], w_ub)
                if has_mask:
                    # An image token: out = x (x_ub goes back unchanged, bit for bit), saved tensors 0.
                    if image_token_mask[t]:
                        if save:
                            with T.SimdVF():
                                zero = T.simd.vdup(0.0, f32)
                                for i in T.serial(grp):
                                    for r in T.serial(4):
                                        T.simd.vsts(s_ub[r, i], zero, dist='ONEPT_B32')
                    else:
                        gate_vf(x_ub, k_ub, v_ub, w_ub, s_ub, h0, eps, clamp_value)
                else:
                    gate_vf(x_ub, k_ub, v_ub, w_ub, s_ub, h0, eps, clamp_value)
                with T.Task():
                    T.copy(x_ub, out[t, h0 : h0 + grp, :])
                    if save:
                        T.copy(s_ub[0, 0:grp], dot_o[t, h0 : h0 + grp])
                        T.copy(s_ub[1, 0:grp], g_o[t, h0 : h0 + grp])
                        T.copy(s_ub[2, 0:grp], rx_o[t, h0 : h0 + grp])
                        T.copy(s_ub[3, 0:grp], rk_o[t, h0 : h0 + grp])

    return _engram_gate_fwd_prim_func(
        T,
        body,
        hc=hc,
        hidden=hidden,
        save=save,
        has_mask=cfg.has_mask,
        num_tokens=num_tokens,
        strides=(k_st, k_sh, v_st),
    )
