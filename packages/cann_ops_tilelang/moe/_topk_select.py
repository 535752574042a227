"""Stable top-k selection of one row by one warp, shared by moe_topk and moe_topk_gate on both backends.

A row of E fp32 values is spread over the 32 lanes of a warp (CUDA) or of a SIMT VF (Ascend): lane `lane` holds
`slots` of them in registers, slot i being expert `slot_expert(i, lane, vector)` (chunks of `vector` consecutive
experts, lanes side by side), so that a lane's experts ascend with its slot. Each value becomes an int32 key whose
integer order is the value's order (`order_key`), with -0.0 equal to +0.0 and every NaN below -inf; padding and
already chosen slots hold KEY_TAKEN, below every key. Round k: each lane's best (the first maximum of its slots,
strictly greater wins, so the lowest expert among equals), the warp's maximum key, then the lowest expert
holding it: ties go to the lower index, the order of torch.sort(descending=True, stable=True). Lane k keeps
round k's expert; the winner's slot becomes KEY_TAKEN.

Integer keys make the comparisons exact and independent of fast-math flags (no float compare, no NaN test on
floats) and let one warp reduction of int32 serve the maximum on both backends.

The second half, `make_gate_row`, is moe_topk_gate's routine for one token on that selection: scoring, biases,
group-limited routing, fixed and random routing, the weights, the shared slots and the replica map.

The functions take the TileLang language module (`tilelang.language` or `tilelang.ascend.language`) as `T`.
"""

# No `from __future__ import annotations`: TileLang evaluates the macros' annotations.

from ._scoring import WEIGHT_SUM_EPS

WARP = 32  # lanes per row: one warp on CUDA, 32 SIMT threads on Ascend
KEY_TAKEN = -(2**31)  # a chosen or padding slot: below every value's key
KEY_NAN = -(2**31) + 1  # any NaN: below -inf (whose key is -2139095040), above a taken slot
NO_EXPERT = 2**31 - 1  # a lane without a candidate in the index reduction
_MAGNITUDE = 0x7FFFFFFF  # the bits of an fp32 below its sign
_INF_BITS = 0x7F800000  # +inf; magnitudes above it are NaN


def lane_slots(num_experts: int, vector: int) -> int:
    """Slots per lane for a row of num_experts values in chunks of `vector` (a multiple of vector)."""
    chunk = WARP * vector
    return -(-num_experts // chunk) * vector


def make_select(T):
    """The macros of the selection for language module T: (order_key, slot_expert, select_topk)."""

    @T.macro
    def order_key(value):
        """int32 key of an fp32 value, ordered as the value (-0.0 as +0.0, NaN lowest: KEY_NAN)."""
        bits = T.reinterpret(value, 'int32')
        magnitude = bits & _MAGNITUDE
        # Negative values: the magnitude's order reversed; -0.0 (magnitude 0) lands on 0, the key of +0.0.
        signed = T.if_then_else(bits < 0, -magnitude, magnitude)
        return T.if_then_else(magnitude > _INF_BITS, T.int32(KEY_NAN), signed)

    @T.macro
    def slot_expert(slot, lane, vector):
        """The expert of slot `slot` of lane `lane` for chunks of `vector` experts."""
        return (slot // vector) * (WARP * vector) + lane * vector + slot % vector

    @T.macro
    def select_topk(keys, slots, vector, num_topk, lane, chosen):
        """Rounds 0..num_topk-1 over the lane's `keys` (a local int32 array of `slots`): lane k gets round k's
        expert in `chosen[0]` (a local int32 array of one); every lane of the warp takes part (warp reductions)."""
        for k in T.serial(num_topk):
            best = T.alloc_var(T.int32, init=KEY_TAKEN)
            best_expert = T.alloc_var(T.int32, init=NO_EXPERT)
            for i in T.unroll(slots):
                if keys[i] > best:
                    best = keys[i]
                    best_expert = slot_expert(i, lane, vector)
            top = T.warp_reduce_max(best)
            winner = T.warp_reduce_min(T.if_then_else(best == top, best_expert, T.int32(NO_EXPERT)))
            if lane == k:
                chosen[0] = winner
            for i in T.unroll(slots):
                if slot_expert(i, lane, vector) == winner:
                    keys[i] = T.int32(KEY_TAKEN)

    return order_key, slot_expert, select_topk


# ---------------------------------------------------------------- moe_topk_gate's row routine on the selection

REPLICA_STRIDE = 23333  # the replica rule (ep_rank + token * REPLICA_STRIDE) % count, TileKernels' convention
HASH_MULTIPLIERS = (0x7FEB352D, 0x846CA68B)  # an invertible 32-bit mixer (xor-shift-multiply, public domain)
HASH_GOLDEN = 0x9E3779B9  # 2**32 / golden ratio: spreads ep_rank over the 32-bit words
_SIGN_BIT = -(2**31)  # an fp32's sign bit, as int32


def make_gate_row(T, cfg, scoring):
    """The macro `route_row` of moe_topk_gate for one token and one warp (see moe_topk_gate_kernel.py for the
    semantics), on language module T, for a MoeTopkGateConfig `cfg`; `scoring` is the element-wise scoring
    macro (None for softmax). Sources and destinations are buffers indexed [row, column] (GM on CUDA, UB on
    Ascend); the caller passes each token's flags as values."""
    order_key, slot_expert, select_topk = make_select(T)
    E, K, S, V = cfg.num_experts, cfg.num_topk, cfg.num_shared_experts, cfg.vector
    P, slots, R = K + S, cfg.slots, cfg.replicas
    G, TG = cfg.num_groups, cfg.topk_groups
    group_size = E // G
    L = E + S

    @T.macro
    def key_value(key):
        """The fp32 value of an order key (KEY_NAN -> NaN); the inverse of order_key."""
        return T.reinterpret(T.if_then_else(key >= 0, key, (-key) | T.int32(_SIGN_BIT)), 'float32')

    @T.macro
    def hash_draw(token, ep_rank, lane, stream):
        """32 random bits: mix32(mix32(token) + ep_rank * HASH_GOLDEN + 2 * lane + stream), mix32 the
        xor-shift-multiply mixer of HASH_MULTIPLIERS (tests/moe/moe_topk_gate_ref.py has it in Python)."""
        w0 = T.cast(token, T.uint32)
        w1 = (w0 ^ (w0 >> 16)) * T.uint32(HASH_MULTIPLIERS[0])
        w2 = (w1 ^ (w1 >> 15)) * T.uint32(HASH_MULTIPLIERS[1])
        x0 = (w2 ^ (w2 >> 16)) + T.cast(ep_rank, T.uint32) * T.uint32(HASH_GOLDEN) + T.cast(lane * 2 + stream, T.uint32)
        x1 = (x0 ^ (x0 >> 16)) * T.uint32(HASH_MULTIPLIERS[0])
        x2 = (x1 ^ (x1 >> 15)) * T.uint32(HASH_MULTIPLIERS[1])
        return x2 ^ (x2 >> 16)

    rows = cfg.backend == 'ascend'  # the expert tables as one row each (gate_shapes)

    def table(values, expert):  # plain Python, called while TileLang parses the macros
        if rows:
            return values[0, expert]
        return values[expert]

    def physical(phys_map, expert, replica):
        if rows:
            return phys_map[0, expert * R + replica]
        return phys_map[expert, replica]

    @T.macro
    def lane_count(counts, expert):
        """Replicas of a logical expert: its count clamped into 1..R."""
        return T.min(T.max(table(counts, expert), 1), R)

    @T.macro
    def route_row(lane, token, masked, random_token, fixed, is_image, logits, lrow, bias, image_bias,
                  unmapped, urow, phys_map, counts, scores, srow, out_idx, out_weights, orow,
                  routed_scaling_factor, ep_rank):  # fmt: skip
        values = T.alloc_local((slots,), T.float32)
        keys = T.alloc_local((slots,), T.int32)
        chosen = T.alloc_local((1,), T.int32)
        idx = T.alloc_var(T.int32, init=-1)
        weight = T.alloc_var(T.float32, init=0.0)
        if masked:
            if cfg.has_unmapped and lane < K:
                unmapped[urow, lane] = T.int64(-1)
            if cfg.has_scores:
                for i in T.unroll(slots):
                    if slot_expert(i, lane, V) < E:
                        scores[srow, slot_expert(i, lane, V)] = T.float32(0.0)
        elif cfg.has_random and random_token:
            # Distinct physical experts: lane l draws r_l in [0, N - l); in rounds of the smallest undecided
            # (value, lane), that lane keeps its value and every later undecided lane at or above it moves up one.
            num_physical = T.alloc_var(T.int32, init=L)
            if cfg.replicas:
                part = T.alloc_var(T.int32, init=0)
                for c in T.unroll(-(-L // WARP)):
                    if c * WARP + lane < L:
                        part = part + lane_count(counts, c * WARP + lane)
                num_physical = T.warp_reduce_sum(part)
            draw = T.alloc_var(T.int32, init=NO_EXPERT)
            decided = T.alloc_var(T.int32, init=1)
            if lane < P:
                span = T.max(num_physical - lane, 1)
                draw = T.cast(hash_draw(token, ep_rank, lane, 0) % T.cast(span, T.uint32), T.int32)
                decided = 0
                weight = T.cast(hash_draw(token, ep_rank, lane, 1) >> 8, T.float32) * T.float32(2.0**-24)
            for _ in T.serial(P):
                low = T.warp_reduce_min(T.if_then_else(decided == 0, draw, T.int32(NO_EXPERT)))
                candidate = T.if_then_else(draw == low, lane, T.int32(NO_EXPERT))
                first = T.warp_reduce_min(T.if_then_else(decided == 0, candidate, T.int32(NO_EXPERT)))
                if decided == 0:
                    if lane == first:
                        idx = draw
                        decided = 1
                    elif lane > first and draw >= low:
                        draw = draw + 1
            if cfg.has_unmapped and lane < K:
                unmapped[urow, lane] = T.int64(-1)
            if cfg.has_scores:
                for i in T.unroll(slots):
                    if slot_expert(i, lane, V) < E:
                        scores[srow, slot_expert(i, lane, V)] = T.float32(0.0)
        else:
            for c in T.unroll(slots // V):
                first = slot_expert(c * V, lane, V)
                if first < E:  # V divides E: a chunk is wholly in or out
                    for v in T.vectorized(V):
                        values[c * V + v] = logits[lrow, first + v]
                else:
                    for v in T.unroll(V):
                        values[c * V + v] = -T.infinity(T.float32)
            if scoring is None:  # softmax over the row: m, the largest non-NaN logit, then the sum
                top = T.alloc_var(T.int32, init=KEY_TAKEN)
                for i in T.unroll(slots):
                    if slot_expert(i, lane, V) < E:
                        top = T.max(top, order_key(values[i]))
                row_max = key_value(T.warp_reduce_max(top))
                total = T.alloc_var(T.float32, init=0.0)
                for i in T.unroll(slots):
                    if slot_expert(i, lane, V) < E:
                        values[i] = T.exp(values[i] - row_max)
                        total = total + values[i]
                row_sum = T.warp_reduce_sum(total)
                for i in T.unroll(slots):
                    values[i] = values[i] / row_sum
            else:
                for i in T.unroll(slots):
                    values[i] = scoring(values[i])
            for i in T.unroll(slots):
                expert = slot_expert(i, lane, V)
                keys[i] = T.int32(KEY_TAKEN)
                if expert < E:
                    if cfg.has_scores:
                        scores[srow, expert] = values[i]
                    if cfg.has_image and is_image:
                        keys[i] = order_key(values[i] + table(image_bias, expert))
                    elif cfg.has_bias:
                        keys[i] = order_key(values[i] + table(bias, expert))
                    else:
                        keys[i] = order_key(values[i])
            if G > 1:
                # Group-limited routing: each group's score is the sum of its two best biased scores (one where
                # a group has one expert); the TG best groups (ties to the lower group) stay candidates.
                group_keys = T.alloc_local((G,), T.int32)
                for g in T.unroll(G):
                    group_sum = T.alloc_var(T.float32, init=0.0)
                    taken = T.alloc_var(T.int32, init=NO_EXPERT)
                    for _ in T.unroll(min(2, group_size)):
                        best = T.alloc_var(T.int32, init=KEY_TAKEN)
                        best_expert = T.alloc_var(T.int32, init=NO_EXPERT)
                        for i in T.unroll(slots):
                            expert = slot_expert(i, lane, V)
                            if expert // group_size == g and expert != taken and expert < E and keys[i] > best:
                                best = keys[i]
                                best_expert = expert
                        top_key = T.warp_reduce_max(best)
                        taken = T.warp_reduce_min(T.if_then_else(best == top_key, best_expert, T.int32(NO_EXPERT)))
                        group_sum = group_sum + key_value(top_key)
                    group_keys[g] = order_key(group_sum)
                kept = T.alloc_var(T.int32, init=0)
                for g in T.unroll(G):
                    ahead = T.alloc_var(T.int32, init=0)
                    for h in T.unroll(G):
                        if group_keys[h] > group_keys[g] or (group_keys[h] == group_keys[g] and h < g):
                            ahead = ahead + 1
                    if ahead < TG:
                        kept = kept | (1 << g)
                for i in T.unroll(slots):
                    if ((kept >> (slot_expert(i, lane, V) // group_size)) & 1) == 0:
                        keys[i] = T.int32(KEY_TAKEN)
            if cfg.has_fixed and fixed:
                if lane < K:
                    given = unmapped[urow, lane]
                    if given >= 0 and given < E:  # another index is no expert: -1, weight 0
                        idx = T.cast(given, T.int32)
            else:
                select_topk(keys, slots, V, K, lane, chosen)
                if lane < K:
                    idx = chosen[0]
            # The unbiased score of lane k's expert, from the lane that holds it.
            mine = T.alloc_var(T.float32, init=0.0)
            if cfg.backend == 'cuda':
                # One shuffle per slot: every lane reads slot i of the lane holding its expert, keeps its own slot.
                source = T.if_then_else(idx >= 0, (idx // V) % WARP, lane)
                wanted = T.if_then_else(idx >= 0, idx // (WARP * V) * V + idx % V, -1)
                for i in T.unroll(slots):
                    fetched = T.shfl_sync(values[i], source)
                    if i == wanted:
                        mine = fetched
            else:
                # The SIMT VF has no indexed shuffle: a broadcast of lane k's expert, then its holder's score as an
                # order key (exact: keys map back to values), two warp reductions per k.
                for k in T.serial(K):
                    target = T.warp_reduce_max(T.if_then_else(lane == k, idx, -1))
                    held = T.alloc_var(T.int32, init=KEY_TAKEN)
                    for i in T.unroll(slots):
                        if slot_expert(i, lane, V) == target:
                            held = order_key(values[i])
                    found = T.warp_reduce_max(held)
                    if lane == k and found >= KEY_NAN:  # a held expert (>=: no 2**31 in the simplifier)
                        mine = key_value(found)
            # Non-finite scores count 0 in the weights, which stay finite.
            mine = T.if_then_else((T.reinterpret(mine, 'int32') & _MAGNITUDE) < _INF_BITS, mine, T.float32(0.0))
            denominator = T.warp_reduce_sum(T.if_then_else(lane < K, mine, T.float32(0.0))) + T.float32(WEIGHT_SUM_EPS)
            if lane < K:
                weight = mine / denominator * routed_scaling_factor
                if cfg.has_unmapped:
                    unmapped[urow, lane] = T.cast(idx, T.int64)
            elif lane < P:
                weight = T.float32(1.0)
                idx = E + lane - K
            if cfg.replicas:  # noqa: SIM102  (compile time, then a device branch)
                if lane < P and idx >= 0:
                    seed = T.cast(ep_rank, T.int64) + T.cast(token, T.int64) * REPLICA_STRIDE
                    replica = T.cast(seed % T.cast(lane_count(counts, idx), T.int64), T.int32)
                    idx = physical(phys_map, idx, replica)
        if lane < P:
            out_idx[orow, lane] = T.cast(idx, T.int64)
            out_weights[orow, lane] = weight

    return route_row


def gate_shapes(cfg, num_tokens):
    """Shapes of the kernel's tensor arguments (absent ones: placeholders of one element). The expert tables:
    on Ascend each as one row (the UB copies' layout), on CUDA as the caller passes them (no view per call)."""
    E, K, P, L, R = cfg.num_experts, cfg.num_topk, cfg.num_physical_topk, cfg.num_logical_experts, cfg.replicas
    tokens = (num_tokens,)
    if cfg.backend == 'ascend':
        bias, physical_map, count = (1, E), (1, L * R), (1, L)
        absent = (1, 1)
    else:
        bias, physical_map, count = (E,), (L, R), (L,)
        absent = (1,)
    return {
        'logits': (num_tokens, E),
        'bias': bias if cfg.has_bias else absent,
        'image_bias': bias if cfg.has_image else absent,
        'image_token_mask': tokens if cfg.has_image else (1,),
        'mask': tokens if cfg.has_mask else (1,),
        'fix_routing_mask': tokens if cfg.has_fixed else (1,),
        'force_random': tokens if cfg.has_random else (1,),
        'to_physical_map': physical_map if R else (1, 1),
        'logical_count': count if R else absent,
        'unmapped_topk_idx': (num_tokens, K) if cfg.has_unmapped else (1, 1),
        'scores': (num_tokens, E) if cfg.has_scores else (1, 1),
        'topk_idx': (num_tokens, P),
        'topk_weights': (num_tokens, P),
    }
