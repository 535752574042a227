"""CUDA kernel bodies of engram_gate_bwd (math and the grad_w_partial contract: engram_gate_bwd_kernel.py).

CUDA, variant 'resident' (the fast path, one pass over memory): block p starts with tokens p, P + p and
2 P + p and then claims one token at a time from token_counter[0] (atomicAdd, three tokens ahead of the
one it computes, so the claim's round trip hides behind the work). Claiming is what makes this kernel
fast: with a fixed range per block, globaltimer traces showed the blocks drifting apart by a few tokens by
the end, at random from run to run, and the slowest block set the kernel's time (figures: README,
Performance). The launch must find the counter at zero, and the kernel leaves it so: a block claims once
per token it computes, so a launch makes exactly T claims, and the claim that gets T - 1 back is the last of
them; its thread stores 0 (a store after its own atomic, so later in the word's coherence order, and no claim
follows). No block counts itself done at the end, where an acq_rel atomic delayed each block's exit (figures:
docs/engram.md, "Gate backward: claims and fixed ranges"). So the caller can keep one counter
per CUDA stream (launches on a stream run one after another) instead of zero-filling a fresh one per call,
a fill launch that cost about as much host time as the kernel's own launch (engram_gate_bwd._token_counter).
Under cfg.dynamic_tokens = False (deterministic mode) block p keeps its contiguous range of T // P or
T // P + 1 tokens instead, so that grad_w_partial is reproducible bit for bit, and the counter is not
touched. Thread i owns column groups c = j * threads + i (8 bf16 = 16 bytes, all hc
branches) for the whole kernel: its slice of the weight gradient lives in registers, its slice of
weight_fused in shared memory where it fits (else it is read through L1/L2 per token), and every staging
slot in shared memory is private to the thread that fills it with cp.async, so no barrier guards the data:
the only block barrier per token is the dL/dg reduction (it also publishes the claimed token). With c_i
the block's i-th token: wait grad_out/v(c_i) -> dL/dg partials and grad_v (grad_out kept in registers as
packed bf16 pairs) -> issue grad_out/v(c_(i+1)) and the saved scalars of c_(i+2) -> block reduction -> r
-> wait x/k(c_i) -> grad_x, grad_k, weight-gradient slice -> issue x/k(c_(i+1)). About one token of loads
is in flight while the current one is computed. The staging slots take (3 hc + 1) * H * 2 bytes of shared
memory and the registers ~12 * hc * H / threads per thread, which bounds one CTA to hc * H of ~32K
(choose_engram_gate_bwd_config checks both).
Where the weight slice does not fit (hc = 4, H = 7168: 182 KB of slots), two ways to keep it on chip were
measured and dropped (README, Performance): x/k staged per (group, branch) unit in a ring of 2-3 slots (the
weight in shared memory; slower: the shorter x/k prefetch costs more than the L2 reads of the weight save)
and H split over the two CTAs of a cluster (no faster there). The whole-token prefetch depth is what this
kernel's bandwidth rests on.

Split tokens (cfg.cluster = 2, wider tokens): the same body on a cluster of 2 CTAs per token, each with half
of every branch's column groups (rank r: groups r * G .. (r + 1) * G - 1 of the token, G = H / 16), so slots
and registers per CTA halve and hc * H reaches 64K on one pass over memory. After its block reduction each
CTA pushes its per-warp dL/dg partials into both CTAs' shared memory (distributed shared memory stores), and
a cluster barrier (arrive with release, wait with acquire) publishes them; every thread then sums all
2 x warps partials, so both CTAs compute the same r. Slot sl % 2 is safe to rewrite: a CTA writes it for
token i + 2 only after the cluster barrier of token i + 1, which its peer reaches after reading it for token
i. Clusters take fixed token ranges (cluster p: the T // P or T // P + 1 tokens of _token_range, P = the
clusters): claimed tokens measured slower there (docs/engram.md, "Gate backward: wide tokens"); grad_w_partial
has one slice per cluster, each CTA writing its half of the columns.

The mask variant (image_token_mask given) has schedules beside the measured one, chosen by config fields:
mask_ahead (the mask read two tokens ahead into a ring in shared memory, as the saved scalars) and mask_results
(phase B's image-token results as ternaries or bit masks after every value is computed); docs/engram.md, "Image
tokens: the mask's schedule".

CUDA, variant 'chunked' (where neither fits: hc >= 5 at the widest H), also the scheme of the Ascend kernel:
tokens in chunks of `token_chunk`; phase A computes dL/dg (and grad_v) of every token of the chunk, phase B
walks the column tiles and, per tile, the chunk's tokens, keeping the tile's weight-gradient accumulator on
chip and adding it to the block's slice of grad_w_partial once per chunk. grad_out is read in both phases, so
this path moves hc * H * 2 more bytes per token (~20 % more traffic).
"""

# No `from __future__ import annotations`: TileLang evaluates the prim_func annotations, which refer to
# the generator's local shape variables.

# This module does not import engram_gate_bwd_kernel.py (which imports it): the config comes as `cfg`, the
# prim_func signature as `prim_func`, and the constant the config checks too lives here.
VEC = 8  # bf16 elements per 16-byte vector access


def _token_range(num_tokens, pid, num_blocks):
    """Block pid's contiguous tokens [t0, t1) = [pid * T // P, (pid + 1) * T // P): T // P or T // P + 1 each.

    Balanced to one token, unlike ceil(T / P) per block (at T = 4001 on 132 SMs that keeps 129 blocks busy
    for a 31st token and leaves 2 idle; measured gain: README, Performance). int64 products: pid * T
    overflows int32 beyond 16M tokens.
    """
    import tilelang.language as T

    def bound(p):
        return T.Cast('int32', T.Cast('int64', p) * T.Cast('int64', num_tokens) // num_blocks)

    return bound(pid), bound(pid + 1)


def cuda_resident_kernel(cfg, prim_func):
    """`cfg` is an EngramGateBwdConfig; `prim_func` the signature builder _engram_gate_bwd_prim_func."""
    import tilelang.language as T

    hc, hidden, P, has_mask, mask_ahead = cfg.hc, cfg.hidden, cfg.num_blocks, cfg.has_mask, cfg.mask_ahead
    mask_results = cfg.mask_results
    threads, g, w_in_smem, dynamic = cfg.threads, cfg.groups_per_thread, cfg.w_in_smem, cfg.dynamic_tokens
    C = cfg.cluster  # CTAs per token; each holds groups = 1 / C of the token's column groups
    groups = hidden // VEC // C
    nw = threads // 32
    tv = threads * VEC
    scale = hidden**-0.5
    inv_h = 1.0 / hidden
    num_tokens = T.dynamic('num_tokens')
    kv_stride_t, kv_stride_h = T.dynamic('kv_stride_t'), T.dynamic('kv_stride_h')

    def unpack(word, e, *, alt: bool):
        # bf16 element e (of a pair packed in a uint32) as fp32. `alt` spells the same bits with a byte
        # permute so that the compiler cannot merge the two conversions of grad_out (the phase-B one would
        # otherwise keep the fp32 values, 2x the registers, alive across the block reduction).
        if alt:
            sel = T.Cast('uint32', 0x1044 + (e % 2) * 0x2200)
            bits = T.call_extern('uint32', '__byte_perm', word, T.uint32(0), sel)
        else:
            bits = (word << T.Cast('uint32', 16 - (e % 2) * 16)) & T.uint32(0xFFFF0000)
        return T.reinterpret(bits, T.float32)

    @T.macro
    def issue_scalars(tt, sl, tid, sc_s, dot, gate_score, rstd_x, rstd_k):
        if tid < hc:
            T.ptx_cp_async(T.access_ptr(sc_s[sl, 0, tid], 'w', 1), T.access_ptr(dot[tt, tid], 'r', 1), 1)
            T.ptx_cp_async(T.access_ptr(sc_s[sl, 1, tid], 'w', 1), T.access_ptr(gate_score[tt, tid], 'r', 1), 1)
            T.ptx_cp_async(T.access_ptr(sc_s[sl, 2, tid], 'w', 1), T.access_ptr(rstd_x[tt, tid], 'r', 1), 1)
            T.ptx_cp_async(T.access_ptr(sc_s[sl, 3, tid], 'w', 1), T.access_ptr(rstd_k[tt, tid], 'r', 1), 1)

    @T.macro
    def issue_go_v(tt, tid, gid, go_s, v_s, grad_out, kv):
        for j in T.unroll(g):
            if j * threads + tid < groups:
                col = (j * threads + gid) * VEC
                for h in T.unroll(hc):
                    T.ptx_cp_async(
                        T.access_ptr(go_s[j, h, tid * VEC], 'w', VEC),
                        T.access_ptr(grad_out[tt, h, col], 'r', VEC),
                        VEC,
                    )
                T.ptx_cp_async(T.access_ptr(v_s[j, tid * VEC], 'w', VEC), T.access_ptr(kv[tt, hc, col], 'r', VEC), VEC)

    @T.macro
    def issue_x_k(tt, tid, gid, x_s, k_s, hidden_states, kv):
        for j in T.unroll(g):
            if j * threads + tid < groups:
                col = (j * threads + gid) * VEC
                for h in T.unroll(hc):
                    T.ptx_cp_async(
                        T.access_ptr(x_s[j, h, tid * VEC], 'w', VEC),
                        T.access_ptr(hidden_states[tt, h, col], 'r', VEC),
                        VEC,
                    )
                    T.ptx_cp_async(
                        T.access_ptr(k_s[j, h, tid * VEC], 'w', VEC),
                        T.access_ptr(kv[tt, h, col], 'r', VEC),
                        VEC,
                    )

    @T.macro
    def phase_b(
        tok, tid, gid, x_s, k_s, w_s, go_r, gw, rr, cx, ck, xb, kb, wf, xf, kf, ox, ok, gn,
        weight_fused, grad_x, grad_kv, img,
    ):  # fmt: skip
        # Phase B of one token: grad_x, grad_k and this thread's weight-gradient slice. The mask variant
        # (img: the token's mask, None without one) selects an image token's results instead of branching
        # around the text path: a second copy of the phase spilled registers at H = 7168 (docs/engram.md,
        # "Image tokens").
        for j in T.unroll(g):
            if j * threads + tid < groups:
                col = (j * threads + gid) * VEC
                for h in T.unroll(hc):
                    for e in T.vectorized(VEC):
                        xb[e] = x_s[j, h, tid * VEC + e]
                    for e in T.vectorized(VEC):
                        kb[e] = k_s[j, h, tid * VEC + e]
                    if w_in_smem:
                        for e in T.vectorized(VEC):
                            wf[e] = w_s[j, h, tid * VEC + e]
                    else:
                        for e in T.vectorized(VEC):
                            wf[e] = weight_fused[h, col + e]
                    if img is not None and mask_results != 'if_then_else':
                        # Every value computed first, then an image token's chosen: the if_then_else of the
                        # branch below come out of nvcc as branches around the arithmetic (sm_90a SASS: two copies
                        # of it, jumps in every branch h), which keeps ptxas from overlapping the branches h.
                        for e in T.unroll(VEC):
                            xf[e] = T.cast(xb[e], T.float32)
                            kf[e] = T.cast(kb[e], T.float32)
                            gn[e] = gw[j, h, e] + rr[h] * xf[e] * kf[e]
                            ox[e] = unpack(go_r[j, h, e // 2], e, alt=True) + rr[h] * (kf[e] * wf[e] - xf[e] * cx[h])
                            ok[e] = rr[h] * (xf[e] * wf[e] - kf[e] * ck[h])
                        for e in T.unroll(VEC):
                            xb[e] = T.cast(ox[e], T.bfloat16)
                            kb[e] = T.cast(ok[e], T.bfloat16)
                        if mask_results == 'select':
                            # ternaries of plain values (bf16 through its bits: a struct in CUDA C); nvcc still
                            # leaves a short branch per (group, branch h) around the chosen values
                            for e in T.unroll(VEC):
                                gw[j, h, e] = T.Select(img != 0, gw[j, h, e], gn[e])
                                go_bits = T.Cast('uint16', go_r[j, h, e // 2] >> T.uint32((e % 2) * 16))
                                xb[e] = T.reinterpret(
                                    T.Select(img != 0, go_bits, T.reinterpret(xb[e], T.uint16)), T.bfloat16
                                )
                                kb[e] = T.reinterpret(
                                    T.Select(img != 0, T.uint16(0), T.reinterpret(kb[e], T.uint16)), T.bfloat16
                                )
                        else:  # 'bitwise': no branch at all
                            # all ones for an image token, through a byte permute the compiler cannot see through
                            # (it would turn the masks back into selects, and those into branches)
                            ones = T.call_extern(
                                'uint32', '__byte_perm', T.uint32(0) - T.Cast('uint32', img), T.uint32(0),
                                T.uint32(0x3210),
                            )  # fmt: skip
                            ones16 = T.Cast('uint16', ones)
                            for e in T.unroll(VEC):
                                gw_bits = T.reinterpret(gw[j, h, e], T.uint32)
                                gn_bits = T.reinterpret(gn[e], T.uint32)
                                gw[j, h, e] = T.reinterpret((gw_bits & ones) | (gn_bits & ~ones), T.float32)
                                go_bits = T.Cast('uint16', go_r[j, h, e // 2] >> T.uint32((e % 2) * 16))
                                x_bits = T.reinterpret(xb[e], T.uint16)
                                xb[e] = T.reinterpret((go_bits & ones16) | (x_bits & ~ones16), T.bfloat16)
                                kb[e] = T.reinterpret(T.reinterpret(kb[e], T.uint16) & ~ones16, T.bfloat16)
                        for e in T.vectorized(VEC):
                            grad_x[tok, h, col + e] = xb[e]
                        for e in T.vectorized(VEC):
                            grad_kv[tok, h, col + e] = kb[e]
                    else:
                        for e in T.unroll(VEC):
                            xf[e] = T.cast(xb[e], T.float32)
                            kf[e] = T.cast(kb[e], T.float32)
                            if img is None:
                                gw[j, h, e] += rr[h] * xf[e] * kf[e]
                            else:  # an image token adds nothing, not even the NaN of an inf x or k
                                gw[j, h, e] = T.if_then_else(img != 0, gw[j, h, e], gw[j, h, e] + rr[h] * xf[e] * kf[e])
                            ox[e] = unpack(go_r[j, h, e // 2], e, alt=True) + rr[h] * (kf[e] * wf[e] - xf[e] * cx[h])
                            ok[e] = rr[h] * (xf[e] * wf[e] - kf[e] * ck[h])
                        if img is None:
                            for e in T.vectorized(VEC):
                                grad_x[tok, h, col + e] = T.cast(ox[e], T.bfloat16)
                            for e in T.vectorized(VEC):
                                grad_kv[tok, h, col + e] = T.cast(ok[e], T.bfloat16)
                        else:
                            # An image token: grad_x = grad_out bit for bit (the packed words held since phase A),
                            # grad_k = +0.
                            for e in T.unroll(VEC):
                                xb[e] = T.if_then_else(
                                    img != 0,
                                    T.reinterpret(
                                        T.Cast('uint16', go_r[j, h, e // 2] >> T.uint32((e % 2) * 16)), T.bfloat16
                                    ),
                                    T.cast(ox[e], T.bfloat16),
                                )
                                kb[e] = T.if_then_else(img != 0, T.cast(0, T.bfloat16), T.cast(ok[e], T.bfloat16))
                            for e in T.vectorized(VEC):
                                grad_x[tok, h, col + e] = xb[e]
                            for e in T.vectorized(VEC):
                                grad_kv[tok, h, col + e] = kb[e]

    @T.macro
    def body(
        grad_out,
        hidden_states,
        kv,
        weight_fused,
        dot,
        gate_score,
        rstd_x,
        rstd_k,
        image_token_mask,
        grad_x,
        grad_kv,
        grad_w_partial,
        clamp_value,
        token_counter,
    ):
        with T.Kernel(P * C, threads=threads, cluster_dims=C if C > 1 else None) as bid:
            tid = T.get_thread_binding()
            lane = tid % 32
            wid = tid // 32
            # pid: the token's block (the cluster where split); gid: the thread's first global column group
            pid, rank = (bid // C, bid % C) if C > 1 else (bid, 0)
            gid = rank * groups + tid if C > 1 else tid
            # Thread-private staging slots (slot [j, h, tid * 8 : tid * 8 + 8]): conflict-free 16-byte accesses.
            go_s = T.alloc_shared((g, hc, tv), T.bfloat16)
            go_u = T.view(go_s, (g, hc, threads * 4), T.uint32)
            v_s = T.alloc_shared((g, tv), T.bfloat16)
            x_s = T.alloc_shared((g, hc, tv), T.bfloat16)
            k_s = T.alloc_shared((g, hc, tv), T.bfloat16)
            w_s = T.alloc_shared((g, hc, tv) if w_in_smem else (4,), T.float32)
            # dot, gate, rstd_x, rstd_k of 4 tokens (ring): loaded two tokens ahead by threads 0..hc-1,
            # visible to all after the barrier of the token in between.
            sc_s = T.alloc_shared((4, 4, hc), T.float32)
            red_s = T.alloc_shared((2, nw, hc), T.float32)  # per-warp dL/dg partials (ring of 2)
            # Split tokens: every CTA's per-warp partials, pushed by each CTA into all CTAs of its cluster.
            xred_s = T.alloc_shared((2, C, nw, hc) if C > 1 else (4,), T.float32)

            go_r = T.alloc_local((g, hc, 4), T.uint32)  # grad_out of the current token, packed bf16 pairs
            gw = T.alloc_local((g, hc, VEC), T.float32)  # this thread's slice of the weight gradient
            vb = T.alloc_local((VEC,), T.bfloat16)
            xb = T.alloc_local((VEC,), T.bfloat16)
            kb = T.alloc_local((VEC,), T.bfloat16)
            wf = T.alloc_local((VEC,), T.float32)
            vf = T.alloc_local((VEC,), T.float32)
            xf = T.alloc_local((VEC,), T.float32)
            kf = T.alloc_local((VEC,), T.float32)
            ox = T.alloc_local((VEC,), T.float32)
            ok = T.alloc_local((VEC,), T.float32)
            ov = T.alloc_local((VEC,), T.float32)
            # mask_results other than 'if_then_else': an element's weight-gradient sum with the token
            gn = T.alloc_local((VEC,), T.float32) if mask_results != 'if_then_else' else None
            part = T.alloc_local((hc,), T.float32)
            rr = T.alloc_local((hc,), T.float32)
            cx = T.alloc_local((hc,), T.float32)
            ck = T.alloc_local((hc,), T.float32)

            # The block's tokens c_0, c_1, ...: iteration i computes c_i, streams in c_(i + 1) and the
            # scalars of c_(i + 2). Fixed range (deterministic): c_i = t0 + i is the loop counter itself.
            # Registers are tight (ptxas caps 448 threads at 128 each): at hc = 4, H = 7168 a while loop
            # with c_i, c_(i + 1), c_(i + 2) in variables spilled (32 bytes, measurably slower), the
            # counter spills nothing. Claimed: cur, nx1, nx2 = c_i, c_(i + 1), c_(i + 2), starting from pid,
            # pid + P, pid + 2 P; thread 0 claims c_(i + 3) from token_counter in iteration i and the block
            # barrier publishes it through tok_s; the block stops at the first c_i >= num_tokens.
            t0, t1 = _token_range(num_tokens, pid, P)
            tok_s = T.alloc_shared((2,), T.int32)
            img = T.alloc_var(T.int32)  # image_token_mask of the current token (mask variant)
            # mask_ahead: the masks of 4 tokens (ring, as sc_s), each loaded two tokens ahead by thread 0 into m2
            # and stored before the barrier in between
            msk_s = T.alloc_shared((4,), T.int32) if mask_ahead else None
            m2 = T.alloc_var(T.int32) if mask_ahead else None
            cur = T.alloc_var(T.int32)
            nx1 = T.alloc_var(T.int32)
            nx2 = T.alloc_var(T.int32)
            claim = T.alloc_var(T.int32)
            it = T.alloc_var(T.int32)
            if dynamic:
                cur = pid
                nx1 = pid + P
                nx2 = pid + 2 * P
                it = 0
            c0, c1 = (pid, pid + P) if dynamic else (t0, t0 + 1)
            has_c0, has_c1 = (c0 < num_tokens, c1 < num_tokens) if dynamic else (t0 < t1, t0 + 1 < t1)

            for j in T.unroll(g):
                for h in T.unroll(hc):
                    for e in T.unroll(VEC):
                        gw[j, h, e] = 0.0

            # Prologue. Group 1: grad_out/v of c_0, the scalars of c_0 and c_1, this thread's slice of
            # weight_fused; group 2: x/k of c_0, issued once group 1 has arrived: issued with it, they delayed
            # it by their own transfer, since every block starts at once (globaltimer traces: docs/engram.md,
            # "Gate backward: the first token"). Loop invariant at the top of iteration i: the pending groups
            # are [grad_out/v(c_i) (+ scalars(c_(i + 1)))], [x/k(c_i)], in that order (at i = 0 the first has
            # arrived).
            if has_c0:
                issue_go_v(c0, tid, gid, go_s, v_s, grad_out, kv)
                issue_scalars(c0, 0 if dynamic else c0 % 4, tid, sc_s, dot, gate_score, rstd_x, rstd_k)
                if w_in_smem:
                    for j in T.unroll(g):
                        if j * threads + tid < groups:
                            for h in T.unroll(hc):
                                for q in T.unroll(2):
                                    T.ptx_cp_async(
                                        T.access_ptr(w_s[j, h, tid * VEC + q * 4], 'w', 4),
                                        T.access_ptr(weight_fused[h, (j * threads + gid) * VEC + q * 4], 'r', 4),
                                        4,
                                    )
            if has_c1:
                issue_scalars(c1, 1 if dynamic else c1 % 4, tid, sc_s, dot, gate_score, rstd_x, rstd_k)
            if mask_ahead and tid == 0:
                # The masks of c_0 and c_1, published by iteration 0's barrier as their scalars. After the
                # copies of group 1 are issued: thread 0 waits for the loads while group 1 is in flight.
                if has_c0:
                    msk_s[0 if dynamic else c0 % 4] = T.Cast('int32', image_token_mask[c0])
                if has_c1:
                    msk_s[1 if dynamic else c1 % 4] = T.Cast('int32', image_token_mask[c1])
            T.ptx_commit_group()
            if has_c0:
                T.ptx_wait_group(0)
                issue_x_k(c0, tid, gid, x_s, k_s, hidden_states, kv)
            T.ptx_commit_group()

            for t in T.serial(num_tokens) if dynamic else T.serial(t0, t1):
                if dynamic:
                    if cur >= num_tokens:
                        T.loop_break()
                    tok, tok1, tok2 = cur, nx1, nx2
                    has1, has2 = nx1 < num_tokens, nx2 < num_tokens
                    sl, sl2, first = it % 4, (it + 2) % 4, it == 0
                else:
                    tok, tok1, tok2 = t, t + 1, t + 2
                    has1, has2 = t + 1 < t1, t + 2 < t1
                    sl, sl2, first = t % 4, (t + 2) % 4, t == t0
                if mask_ahead:
                    # The mask of c_(i + 2), loaded here and stored before the barrier (as the claim): its round
                    # trip overlaps phase A. Loaded for c_i itself, ptxas tests it right after the wait for
                    # grad_out (sm_90a SASS): every token then waited for the load before its phase A.
                    if tid == 0 and has2:
                        m2 = T.Cast('int32', image_token_mask[tok2])
                elif has_mask:
                    img = T.Cast('int32', image_token_mask[tok])
                if dynamic and tid == 0:  # noqa: SIM102
                    if rank == 0:
                        # Issued first, used at the barrier: the atomic's round trip overlaps phase A.
                        claim = T.atomic_add(token_counter[0], 1, return_prev=True)
                # ---- phase A: dL/dg partials and grad_v from grad_out and v of token c_i
                T.ptx_wait_group(1)
                if first:
                    T.sync_threads()  # publish the scalars of c_0 and c_1 (block-uniform condition)
                if mask_ahead:
                    img = msk_s[sl]
                for h in T.unroll(hc):
                    part[h] = 0.0
                for j in T.unroll(g):
                    if j * threads + tid < groups:
                        col = (j * threads + gid) * VEC
                        for e in T.vectorized(VEC):
                            vb[e] = v_s[j, tid * VEC + e]
                        for e in T.unroll(VEC):
                            vf[e] = T.cast(vb[e], T.float32)
                            ov[e] = 0.0
                        for h in T.unroll(hc):
                            for e in T.vectorized(4):
                                go_r[j, h, e] = go_u[j, h, tid * 4 + e]
                            gsc = sc_s[sl, 1, h]
                            for e in T.unroll(VEC):
                                gof = unpack(go_r[j, h, e // 2], e, alt=False)
                                part[h] += gof * vf[e]
                                ov[e] += gof * gsc
                        if has_mask:  # noqa: SIM102 (a Python-level switch around a device-side condition)
                            if img != 0:  # an image token: grad_v = 0
                                for e in T.unroll(VEC):
                                    ov[e] = 0.0
                        for e in T.vectorized(VEC):
                            grad_kv[tok, hc, col + e] = T.cast(ov[e], T.bfloat16)
                # ---- prefetch grad_out/v of c_(i + 1) (slots consumed above) and the scalars of c_(i + 2)
                # (ring slot (i + 2) % 4 was last read in iteration i - 2, before barrier i - 1)
                if has1:
                    issue_go_v(tok1, tid, gid, go_s, v_s, grad_out, kv)
                if has2:
                    issue_scalars(tok2, sl2, tid, sc_s, dot, gate_score, rstd_x, rstd_k)
                T.ptx_commit_group()
                # ---- block reduction of dL/dg: the only barrier per token (it also publishes c_(i + 3)); split
                # tokens add the cluster barrier of the exchange
                for h in T.unroll(hc):
                    part[h] = T.warp_reduce_sum(part[h])
                if lane == 0:
                    for h in T.unroll(hc):
                        red_s[sl % 2, wid, h] = part[h]
                if dynamic and tid == 0:  # noqa: SIM102 (a Python-level switch around a device-side condition)
                    if rank == 0:
                        # The atomic's value, first needed here. The last of the T claims resets the counter.
                        if claim == num_tokens - 1:
                            token_counter[0] = 0
                        tok_s[sl % 2] = claim + 3 * P
                if mask_ahead and tid == 0:  # noqa: SIM102
                    if has2:  # ring slot (i + 2) % 4 was last read in iteration i - 2, as sc_s's
                        msk_s[sl2] = m2
                T.sync_threads()
                if C > 1:
                    # Split tokens: this CTA's per-warp partials (and rank 0's claim) into every CTA of the
                    # cluster, itself included; the cluster barrier publishes them (slot sl % 2 is rewritten
                    # only after the next cluster barrier, which every CTA reaches after reading it).
                    for q in T.unroll(C):
                        T.copy_cluster(red_s[sl % 2, :, :], xred_s[sl % 2, rank, :, :], dst_block=q)
                    if dynamic and tid == 0:  # noqa: SIM102
                        if rank == 0:
                            for q in T.unroll(1, C):
                                T.copy_cluster(tok_s[sl % 2 : sl % 2 + 1], tok_s[sl % 2 : sl % 2 + 1], dst_block=q)
                    T.evaluate(T.call_extern('handle', '__cluster_barrier_arrive'))  # release
                    T.evaluate(T.call_extern('handle', '__cluster_barrier_wait'))  # acquire
                if dynamic:
                    claim = tok_s[sl % 2]  # read before barrier i + 1; rewritten after it
                for h in T.unroll(hc):
                    part[h] = 0.0
                if C > 1:
                    for c in T.unroll(C):
                        for q in T.unroll(nw):
                            for h in T.unroll(hc):
                                part[h] += xred_s[sl % 2, c, q, h]
                else:
                    for q in T.unroll(nw):
                        for h in T.unroll(hc):
                            part[h] += red_s[sl % 2, q, h]
                for h in T.unroll(hc):
                    dv = sc_s[sl, 0, h]
                    gv = sc_s[sl, 1, h]
                    rx = sc_s[sl, 2, h]
                    rk = sc_s[sl, 3, h]
                    rr[h] = T.if_then_else(
                        T.abs(dv * rx * rk * scale) < clamp_value,
                        T.float32(0.0),
                        part[h] * gv * (1.0 - gv) * 0.5 * T.sqrt(scale * rx * rk / T.abs(dv)),
                    )
                    cx[h] = dv * rx * rx * inv_h
                    ck[h] = dv * rk * rk * inv_h
                # ---- phase B: grads of token cur from x, k (staged one token ahead) and grad_out (registers)
                T.ptx_wait_group(1)
                phase_b(
                    tok,
                    tid,
                    gid,
                    x_s,
                    k_s,
                    w_s,
                    go_r,
                    gw,
                    rr,
                    cx,
                    ck,
                    xb,
                    kb,
                    wf,
                    xf,
                    kf,
                    ox,
                    ok,
                    gn,
                    weight_fused,
                    grad_x,
                    grad_kv,
                    img if has_mask else None,
                )
                # ---- prefetch x, k of c_(i + 1) (slots consumed above)
                if has1:
                    issue_x_k(tok1, tid, gid, x_s, k_s, hidden_states, kv)
                T.ptx_commit_group()
                if dynamic:
                    cur = nx1
                    nx1 = nx2
                    nx2 = claim
                    it = it + 1

            T.ptx_wait_group(0)
            for j in T.unroll(g):
                if j * threads + tid < groups:
                    for h in T.unroll(hc):
                        for e in T.vectorized(VEC):
                            grad_w_partial[pid, h, (j * threads + gid) * VEC + e] = gw[j, h, e]

    return prim_func(
        T,
        body,
        hc=hc,
        hidden=hidden,
        num_blocks=P,
        has_mask=has_mask,
        num_tokens=num_tokens,
        strides=(kv_stride_t, kv_stride_h),
    )


def cuda_chunked_kernel(cfg, prim_func):
    """`cfg` is an EngramGateBwdConfig; `prim_func` the signature builder _engram_gate_bwd_prim_func."""
    import tilelang.language as T

    hc, hidden, P, threads, TC = cfg.hc, cfg.hidden, cfg.num_blocks, cfg.threads, cfg.token_chunk
    has_mask, mask_ahead = cfg.has_mask, cfg.mask_ahead
    groups = hidden // VEC
    n_tiles = -(-groups // threads)
    nw = threads // 32
    scale = hidden**-0.5
    inv_h = 1.0 / hidden
    num_tokens = T.dynamic('num_tokens')
    kv_stride_t, kv_stride_h = T.dynamic('kv_stride_t'), T.dynamic('kv_stride_h')

    @T.macro
    def chunked_grads(t, h, c, r, cxv, ckv, gob, xb, kb, wf, xf, kf, ox, ok, gw, grad_x, grad_kv):
        # grad_x, grad_k of one text token's tile and its share of the weight-gradient tile.
        for e in T.unroll(VEC):
            xf[e] = T.cast(xb[e], T.float32)
            kf[e] = T.cast(kb[e], T.float32)
            gw[h, e] += r * xf[e] * kf[e]
            ox[e] = T.cast(gob[e], T.float32) + r * (kf[e] * wf[e] - xf[e] * cxv)
            ok[e] = r * (xf[e] * wf[e] - kf[e] * ckv)
        for e in T.vectorized(VEC):
            grad_x[t, h, c * VEC + e] = T.cast(ox[e], T.bfloat16)
        for e in T.vectorized(VEC):
            grad_kv[t, h, c * VEC + e] = T.cast(ok[e], T.bfloat16)

    @T.macro
    def token_tile(
        t, i, c, tid, k_s, rs_s, gob, xb, kb, wf, xf, kf, ox, ok, gw,
        grad_out, hidden_states, kv, weight_fused, grad_x, grad_kv, mask,
    ):  # fmt: skip
        # Phase B of token t (the chunk's i-th) on column group c, all branches. `mask`: image_token_mask where
        # the token's mask is tested here, per branch (None: a text token).
        for h in T.unroll(hc):
            T.ptx_cp_async(
                T.access_ptr(k_s[h, tid * VEC], 'w', VEC),
                T.access_ptr(kv[t, h, c * VEC], 'r', VEC),
                VEC,
            )
        T.ptx_commit_group()
        for h in T.unroll(hc):
            for e in T.vectorized(VEC):
                gob[e] = grad_out[t, h, c * VEC + e]
            for e in T.vectorized(VEC):
                xb[e] = hidden_states[t, h, c * VEC + e]
            for e in T.vectorized(VEC):
                wf[e] = weight_fused[h, c * VEC + e]
            T.ptx_wait_group(0)
            for e in T.vectorized(VEC):
                kb[e] = k_s[h, tid * VEC + e]
            r = rs_s[0, i, h]
            cxv = rs_s[1, i, h]
            ckv = rs_s[2, i, h]
            if mask is None:
                chunked_grads(t, h, c, r, cxv, ckv, gob, xb, kb, wf, xf, kf, ox, ok, gw, grad_x, grad_kv)
            elif mask[t]:
                # An image token: grad_x = grad_out bit for bit, grad_k = 0, no share of the weight gradient.
                for e in T.vectorized(VEC):
                    grad_x[t, h, c * VEC + e] = gob[e]
                for e in T.vectorized(VEC):
                    grad_kv[t, h, c * VEC + e] = T.cast(0, T.bfloat16)
            else:
                chunked_grads(t, h, c, r, cxv, ckv, gob, xb, kb, wf, xf, kf, ox, ok, gw, grad_x, grad_kv)

    @T.macro
    def body(
        grad_out,
        hidden_states,
        kv,
        weight_fused,
        dot,
        gate_score,
        rstd_x,
        rstd_k,
        image_token_mask,
        grad_x,
        grad_kv,
        grad_w_partial,
        clamp_value,
        token_counter,
    ):
        with T.Kernel(P, threads=threads) as pid:
            tid = T.get_thread_binding()
            lane = tid % 32
            wid = tid // 32
            red_s = T.alloc_shared((2, nw, hc), T.float32)
            rs_s = T.alloc_shared((3, TC, hc), T.float32)  # r, dot*rstd_x^2/H, dot*rstd_k^2/H per chunk token
            # Thread-private slots for the strided keys and value of kv: cp.async keeps their accesses 16 bytes wide.
            k_s = T.alloc_shared((hc, threads * VEC), T.bfloat16)
            v_s = T.alloc_shared((threads * VEC,), T.bfloat16)
            # mask_ahead: the chunk's image_token_mask, written in phase A, read once per token in phase B
            msk_s = T.alloc_shared((TC,), T.int32) if mask_ahead else None

            gob = T.alloc_local((VEC,), T.bfloat16)
            vb = T.alloc_local((VEC,), T.bfloat16)
            xb = T.alloc_local((VEC,), T.bfloat16)
            kb = T.alloc_local((VEC,), T.bfloat16)
            gof = T.alloc_local((VEC,), T.float32)
            xf = T.alloc_local((VEC,), T.float32)
            kf = T.alloc_local((VEC,), T.float32)
            ox = T.alloc_local((VEC,), T.float32)
            ok = T.alloc_local((VEC,), T.float32)
            ov = T.alloc_local((VEC,), T.float32)
            pw = T.alloc_local((VEC,), T.float32)
            wf = T.alloc_local((VEC,), T.float32)
            gw = T.alloc_local((hc, VEC), T.float32)
            part = T.alloc_local((hc,), T.float32)
            img = T.alloc_var(T.int32) if mask_ahead else None  # mask_ahead: the mask of phase A's token

            t0, t1 = _token_range(num_tokens, pid, P)

            if t0 >= t1:  # no token: the slice is zero
                for tile in T.serial(n_tiles):
                    c = tile * threads + tid
                    if c < groups:
                        for h in T.unroll(hc):
                            for e in T.vectorized(VEC):
                                grad_w_partial[pid, h, c * VEC + e] = T.float32(0.0)

            for ch in T.serial(T.ceildiv(t1 - t0, TC)):
                c0 = t0 + ch * TC
                nv = T.min(TC, t1 - c0)
                # ---- phase A: dL/dg -> r (into shared memory), grad_v
                for i in T.serial(nv):
                    t = c0 + i
                    for h in T.unroll(hc):
                        part[h] = 0.0
                    if mask_ahead:
                        img = T.Cast('int32', image_token_mask[t])  # once per token, not behind each tile's wait
                    for tile in T.serial(n_tiles):
                        c = tile * threads + tid
                        if c < groups:
                            T.ptx_cp_async(
                                T.access_ptr(v_s[tid * VEC], 'w', VEC), T.access_ptr(kv[t, hc, c * VEC], 'r', VEC), VEC
                            )
                            T.ptx_commit_group()
                            T.ptx_wait_group(0)
                            for e in T.vectorized(VEC):
                                vb[e] = v_s[tid * VEC + e]
                            for e in T.unroll(VEC):
                                ov[e] = 0.0
                            for h in T.unroll(hc):
                                for e in T.vectorized(VEC):
                                    gob[e] = grad_out[t, h, c * VEC + e]
                                gsc = gate_score[t, h]
                                for e in T.unroll(VEC):
                                    gof[e] = T.cast(gob[e], T.float32)
                                    part[h] += gof[e] * T.cast(vb[e], T.float32)
                                    ov[e] += gof[e] * gsc
                            if mask_ahead:
                                if img != 0:  # an image token: grad_v = 0
                                    for e in T.unroll(VEC):
                                        ov[e] = 0.0
                            elif has_mask:  # noqa: SIM102
                                if image_token_mask[t]:  # an image token: grad_v = 0
                                    for e in T.unroll(VEC):
                                        ov[e] = 0.0
                            for e in T.vectorized(VEC):
                                grad_kv[t, hc, c * VEC + e] = T.cast(ov[e], T.bfloat16)
                    for h in T.unroll(hc):
                        part[h] = T.warp_reduce_sum(part[h])
                    if lane == 0:
                        for h in T.unroll(hc):
                            red_s[i % 2, wid, h] = part[h]
                    T.sync_threads()
                    if tid == 0:
                        if mask_ahead:
                            msk_s[i] = img
                        for h in T.unroll(hc):
                            part[h] = 0.0
                            for q in T.unroll(nw):
                                part[h] += red_s[i % 2, q, h]
                            dv = dot[t, h]
                            gv = gate_score[t, h]
                            rx = rstd_x[t, h]
                            rk = rstd_k[t, h]
                            rs_s[0, i, h] = T.if_then_else(
                                T.abs(dv * rx * rk * scale) < clamp_value,
                                T.float32(0.0),
                                part[h] * gv * (1.0 - gv) * 0.5 * T.sqrt(scale * rx * rk / T.abs(dv)),
                            )
                            rs_s[1, i, h] = dv * rx * rx * inv_h
                            rs_s[2, i, h] = dv * rk * rk * inv_h
                T.sync_threads()
                # ---- phase B: per column tile, the chunk's tokens; weight-gradient tile in registers
                for tile in T.serial(n_tiles):
                    c = tile * threads + tid
                    if c < groups:
                        for h in T.unroll(hc):
                            for e in T.unroll(VEC):
                                gw[h, e] = 0.0
                        for i in T.serial(nv):
                            t = c0 + i
                            if mask_ahead:
                                # One uniform branch per token: a text token runs the unmasked kernel's
                                # instructions, whose loads ptxas batches over the branches h (the branch per h
                                # behind each h's wait issued them one h at a time: sm_90a SASS).
                                if msk_s[i] != 0:
                                    for h in T.unroll(hc):
                                        for e in T.vectorized(VEC):
                                            gob[e] = grad_out[t, h, c * VEC + e]
                                        for e in T.vectorized(VEC):
                                            grad_x[t, h, c * VEC + e] = gob[e]
                                        for e in T.vectorized(VEC):
                                            grad_kv[t, h, c * VEC + e] = T.cast(0, T.bfloat16)
                                else:
                                    token_tile(
                                        t, i, c, tid, k_s, rs_s, gob, xb, kb, wf, xf, kf, ox, ok, gw,
                                        grad_out, hidden_states, kv, weight_fused, grad_x, grad_kv, None,
                                    )  # fmt: skip
                            else:
                                token_tile(
                                    t, i, c, tid, k_s, rs_s, gob, xb, kb, wf, xf, kf, ox, ok, gw,
                                    grad_out, hidden_states, kv, weight_fused, grad_x, grad_kv, image_token_mask,
                                )  # fmt: skip
                        for h in T.unroll(hc):
                            if ch == 0:
                                for e in T.vectorized(VEC):
                                    grad_w_partial[pid, h, c * VEC + e] = gw[h, e]
                            else:
                                for e in T.vectorized(VEC):
                                    pw[e] = grad_w_partial[pid, h, c * VEC + e]
                                for e in T.vectorized(VEC):
                                    grad_w_partial[pid, h, c * VEC + e] = pw[e] + gw[h, e]
                T.sync_threads()  # rs_s is rewritten by the next chunk

    return prim_func(
        T,
        body,
        hc=hc,
        hidden=hidden,
        num_blocks=P,
        has_mask=has_mask,
        num_tokens=num_tokens,
        strides=(kv_stride_t, kv_stride_h),
    )
