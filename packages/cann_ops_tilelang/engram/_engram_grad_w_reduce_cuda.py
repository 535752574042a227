"""CUDA kernel of engram_grad_w_reduce (math, summation order and config: engram_grad_w_reduce_kernel.py)."""

# No `from __future__ import annotations`: TileLang evaluates the prim_func annotations, which
# refer to the generator's local shape variables.

# Imported by engram_grad_w_reduce_kernel.py, never the other way round (no import circle): the config comes
# as `cfg`, and the access width, which the config checks too, lives here.
CUDA_VEC = 4  # fp32 elements of one 16-byte CUDA access


def cuda_engram_grad_w_reduce_kernel(cfg):
    """`cfg` is an EngramGradWReduceConfig (backend "cuda")."""
    import tilelang.language as T

    hc, hidden, W, R, nt = cfg.hc, cfg.hidden, cfg.block_cols, cfg.block_rows, cfg.threads
    n_d = hidden // W
    G = W // CUDA_VEC  # column groups (16-byte fp32 vectors) of a tile
    L = nt // G  # row lanes: thread (lane, group) sums rows lane, lane + L, ... of its group
    U = R // L  # independent row loads per lane and step
    f32 = T.float32
    num_partials = T.dynamic('num_partials')

    @T.prim_func
    def engram_grad_w_reduce_kernel(
        grad_w_partial: T.Tensor((num_partials, hc, hidden), T.float32),
        weight_hidden: T.Tensor((hc, hidden), T.bfloat16),
        weight_embed: T.Tensor((hc, hidden), T.bfloat16),
        grad_weight_hidden: T.Tensor((hc, hidden), T.float32),
        grad_weight_embed: T.Tensor((hc, hidden), T.float32),
    ):
        with T.Kernel(cfg.num_tiles, threads=nt) as bx:
            tid = T.get_thread_binding()
            h = bx // n_d
            col = (bx % n_d) * W + (tid % G) * CUDA_VEC
            lane = tid // G
            acc = T.alloc_local((CUDA_VEC,), f32)
            rows = T.alloc_local((U * CUDA_VEC,), f32)
            lane_sums = T.alloc_shared((L, W), f32)
            s = T.alloc_local((CUDA_VEC,), f32)
            wh = T.alloc_local((CUDA_VEC,), T.bfloat16)
            we = T.alloc_local((CUDA_VEC,), T.bfloat16)
            gh = T.alloc_local((CUDA_VEC,), f32)
            ge = T.alloc_local((CUDA_VEC,), f32)
            for j in T.vectorized(CUDA_VEC):
                acc[j] = 0.0
            if lane == 0:  # the threads that finish the tile: these loads fly while the partials stream in
                for j in T.vectorized(CUDA_VEC):
                    wh[j] = weight_hidden[h, col + j]
                for j in T.vectorized(CUDA_VEC):
                    we[j] = weight_embed[h, col + j]
                for j in T.vectorized(CUDA_VEC):
                    gh[j] = grad_weight_hidden[h, col + j]
                for j in T.vectorized(CUDA_VEC):
                    ge[j] = grad_weight_embed[h, col + j]
            # All U loads of a step are issued before the first add (one memory round trip per step); rows
            # past P load zeros. The lane's running sum takes its rows in increasing p.
            for k in T.serial(T.ceildiv(num_partials, R)):
                for u in T.unroll(U):
                    p = k * R + u * L + lane
                    if p < num_partials:
                        for j in T.vectorized(CUDA_VEC):
                            rows[u * CUDA_VEC + j] = grad_w_partial[p, h, col + j]
                    else:
                        for j in T.vectorized(CUDA_VEC):
                            rows[u * CUDA_VEC + j] = 0.0
                for u in T.unroll(U):
                    for j in T.unroll(CUDA_VEC):
                        acc[j] += rows[u * CUDA_VEC + j]
            # One barrier: the L lane sums of each column meet in shared memory, lane 0 adds them in order.
            for j in T.vectorized(CUDA_VEC):
                lane_sums[lane, (tid % G) * CUDA_VEC + j] = acc[j]
            T.sync_threads()
            if lane == 0:
                for j in T.vectorized(CUDA_VEC):
                    s[j] = lane_sums[0, tid * CUDA_VEC + j]
                for r in T.unroll(1, L):
                    for j in T.unroll(CUDA_VEC):
                        s[j] += lane_sums[r, tid * CUDA_VEC + j]
                for j in T.unroll(CUDA_VEC):
                    gh[j] += s[j] * T.cast(we[j], f32)
                    ge[j] += s[j] * T.cast(wh[j], f32)
                for j in T.vectorized(CUDA_VEC):
                    grad_weight_hidden[h, col + j] = gh[j]
                for j in T.vectorized(CUDA_VEC):
                    grad_weight_embed[h, col + j] = ge[j]

    return engram_grad_w_reduce_kernel
