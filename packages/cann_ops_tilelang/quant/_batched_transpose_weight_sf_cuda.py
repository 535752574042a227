"""CUDA kernel of batched_transpose_weight_sf (math and task split: batched_transpose_weight_sf_kernel.py).

One thread block per task, CUDA_THREADS threads. The task's scales (at most 4 rows of chunk_cols values, 2 KiB)
are read once into shared memory as exponent bytes (one uint32 each, zero outside the weight), then every output
word of the task is assembled from four of them: sf1's chunk_cols * bs words of one row, then sf0's rows of
4 * bs words. Consecutive threads write consecutive words (each warp's stores are 128 contiguous bytes); the
work is a stream of writes of bs / 4 bytes per scale byte read, so the reads are not what limits it.
"""

# No `from __future__ import annotations`: TileLang evaluates the prim_func annotations, which
# refer to the generator's local shape variables.


def cuda_batched_transpose_weight_sf_kernel(cfg):
    """`cfg` is a BatchedTransposeWeightSfConfig (backend "cuda")."""
    import tilelang.language as T

    u32 = T.uint32
    bs, cc, threads = cfg.block_size, cfg.chunk_cols, cfg.threads
    rows_max = cfg.rows_per_task
    sf1_passes = -(-cc * bs // threads)
    sf0_passes = -(-(cc // rows_max) * rows_max * bs // threads)
    load_passes = -(-rows_max * cc // threads)

    num_sf = T.dynamic('num_sf')
    num_weights = T.dynamic('num_weights')
    num_tasks = T.dynamic('num_tasks')
    num_words = T.dynamic('num_words')

    @T.prim_func
    def batched_transpose_weight_sf_kernel(
        sf_flat: T.Tensor((num_sf,), T.float32),
        weights: T.Tensor((num_weights, cfg.weight_columns), T.int32),
        task_weight: T.Tensor((num_tasks,), T.int32),
        out_flat: T.Tensor((num_words,), T.int32),
    ):
        with T.Kernel(num_tasks, threads=threads) as task:
            tid = T.get_thread_binding()
            exps = T.alloc_shared((rows_max, cc), u32)
            w = task_weight[task]
            local = task - weights[w, 0]
            sf_rows = weights[w, 2]
            sf_cols = weights[w, 3]
            # What the interface builds (lets the index arithmetic simplify).
            T.assume(local >= 0 and sf_rows > 0 and sf_cols > 0)
            chunks = T.ceildiv(sf_cols, cc)
            quads = T.ceildiv(sf_rows, rows_max)
            g = local // (quads * chunks)
            q = local % (quads * chunks) // chunks
            c0 = local % chunks * cc
            rows = T.min(rows_max, sf_rows - q * rows_max)
            cols = T.min(cc, sf_cols - c0)
            n = sf_rows * bs
            k = sf_cols * bs
            sf_base = weights[w, 4] + g * sf_rows * sf_cols + q * rows_max * sf_cols + c0
            sf0_base = weights[w, 5] + g * T.ceildiv(sf_cols, rows_max) * n + c0 // rows_max * n + q * rows_max * bs
            sf1_base = weights[w, 6] + g * quads * k + q * k + c0 * bs

            for it in T.serial(load_passes):
                i = it * threads + tid
                if i < rows_max * cc:
                    j = i // cc
                    c = i % cc
                    if j < rows and c < cols:
                        exps[j, c] = (T.reinterpret(sf_flat[sf_base + j * sf_cols + c], u32) >> u32(23)) & u32(0xFF)
                    else:
                        exps[j, c] = u32(0)
            T.sync_threads()

            # sf1: word c * bs + i of the row is scale column c's four row bytes.
            for it in T.serial(sf1_passes):
                i = it * threads + tid
                if i < cols * bs:
                    c = i // bs
                    word = exps[0, c] | (exps[1, c] << u32(8)) | (exps[2, c] << u32(16)) | (exps[3, c] << u32(24))
                    out_flat[sf1_base + i] = T.reinterpret(word, T.int32)
            # sf0: row p of the chunk, word j * bs + i is scale row j's four column bytes 4p .. 4p + 3.
            for it in T.serial(sf0_passes):
                i = it * threads + tid
                p = i // (rows_max * bs)
                r = i % (rows_max * bs)
                if p * rows_max < cols and r < rows * bs:
                    j = r // bs
                    c = p * rows_max
                    word = exps[j, c] | (exps[j, c + 1] << u32(8)) | (exps[j, c + 2] << u32(16))
                    word = word | (exps[j, c + 3] << u32(24))
                    out_flat[sf0_base + p * n + r] = T.reinterpret(word, T.int32)

    return batched_transpose_weight_sf_kernel
