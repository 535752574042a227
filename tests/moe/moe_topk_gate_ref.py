"""PyTorch reference of moe_topk_gate: the correctness oracle of its tests, in float64 (the selection on float64
keys: the tests give inputs whose keys are apart by more than fp32 rounding). Never imported by runtime code;
it takes the kernels' published constants (the replica stride, the hash) from the package."""

import torch

from cann_ops_tilelang.moe._scoring import WEIGHT_SUM_EPS
from cann_ops_tilelang.moe._topk_select import HASH_GOLDEN, HASH_MULTIPLIERS, REPLICA_STRIDE

from .moe_topk_ref import stable_topk_ref

_WORD = 0xFFFFFFFF
# Keys closer than this (relative) are a near tie: the kernels rank fp32 keys, a few roundings off these.
NEAR_TIE = 1e-6


def near_tie(values: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
    """(T,) bool: some two consecutive values of each row's `order` (indices, best first) are apart by more
    than 0 but at most NEAR_TIE relative (exact ties are decided by index, as in the kernels)."""
    ranked = values.gather(1, order)
    gap = (ranked[:, 1:] - ranked[:, :-1]).abs()
    scale = ranked[:, 1:].abs().clamp(min=1.0)
    return ((gap > 0) & (gap <= NEAR_TIE * scale)).any(dim=1)


def _mix32(word: int) -> int:
    word &= _WORD
    word ^= word >> 16
    word = (word * HASH_MULTIPLIERS[0]) & _WORD
    word ^= word >> 15
    word = (word * HASH_MULTIPLIERS[1]) & _WORD
    return word ^ (word >> 16)


def hash_draw_ref(token: int, ep_rank: int, lane: int, stream: int) -> int:
    """The kernels' 32 random bits of (token, ep_rank, lane, stream)."""
    return _mix32(_mix32(token) + ep_rank * HASH_GOLDEN + lane * 2 + stream)


def random_experts_ref(token: int, ep_rank: int, num_slots: int, num_physical: int) -> tuple[list[int], list[float]]:
    """force_random's experts and weights of one token: lane l draws r_l in [0, N - l); in rounds of the
    smallest undecided (r, lane) that lane keeps r, every later undecided lane at or above it moves up one."""
    draws = [hash_draw_ref(token, ep_rank, lane, 0) % max(num_physical - lane, 1) for lane in range(num_slots)]
    weights = [(hash_draw_ref(token, ep_rank, lane, 1) >> 8) * 2.0**-24 for lane in range(num_slots)]
    experts = [-1] * num_slots
    undecided = set(range(num_slots))
    while undecided:
        low = min(draws[lane] for lane in undecided)
        first = min(lane for lane in undecided if draws[lane] == low)
        experts[first] = low
        undecided.remove(first)
        for lane in undecided:
            if lane > first and draws[lane] >= low:
                draws[lane] += 1
    return experts, weights


def score_ref(logits: torch.Tensor, scoring_func: str) -> torch.Tensor:
    """u in float64, IEEE rules for NaN and inf (softmax: the max over the non-NaN logits)."""
    x = logits.double()
    if scoring_func == 'sqrtsoftplus':
        return (x.clamp(min=0) + torch.log1p(torch.exp(-x.abs()))).sqrt()
    if scoring_func == 'sigmoid':
        return 1.0 / (1.0 + torch.exp(-x))
    nan = x.isnan()
    row_max = x.masked_fill(nan, -torch.inf).amax(dim=1, keepdim=True)
    row_max = row_max.masked_fill(nan.all(dim=1, keepdim=True), torch.nan)
    e = torch.exp(x - row_max)
    return e / e.sum(dim=1, keepdim=True)


def moe_topk_gate_ref(
    logits, num_topk, use_shared_as_routed, num_shared_experts, routed_scaling_factor, ep_rank,
    scoring_func='sqrtsoftplus', mask=None, bias=None, image_bias=None, image_token_mask=None,
    fix_routing_mask=None, to_physical_map=None, logical_count=None, unmapped_topk_idx=None, force_random=None,
    num_groups=1, topk_groups=1,
):  # fmt: skip
    """(topk_idx int64, topk_weights float64, unmapped (T, K) int64, scores float64, ambiguous (T,) bool) on the
    CPU: the contract of moe_topk_gate (its docstring). unmapped_topk_idx is read, not written. `ambiguous`
    marks the tokens whose choice of experts or groups hangs on a near tie (NEAR_TIE): fp32 may order those
    otherwise."""
    logits = logits.cpu()
    T, E = logits.shape
    K, S = num_topk, (num_shared_experts if use_shared_as_routed else 0)
    P = K + S
    u = score_ref(logits, scoring_func)
    keys = u.clone()
    if bias is not None:
        keys = keys + bias.cpu().double()
    if image_bias is not None:
        keys = torch.where(image_token_mask.cpu()[:, None], u + image_bias.cpu().double(), keys)
    excluded = None
    ambiguous = torch.zeros(T, dtype=torch.bool)
    if num_groups > 1:
        size = E // num_groups
        grouped = keys.view(T * num_groups, size)
        best = stable_topk_ref(grouped, min(2, size))
        group_score = grouped.gather(1, best).sum(dim=1).view(T, num_groups)
        kept = torch.zeros(T, num_groups, dtype=torch.bool).scatter_(1, stable_topk_ref(group_score, topk_groups), True)
        ambiguous |= near_tie(group_score, stable_topk_ref(group_score, min(topk_groups + 1, num_groups)))
        excluded = ~kept.repeat_interleave(size, dim=1)
    idx = stable_topk_ref(keys, K, excluded)
    candidates = E if excluded is None else topk_groups * (E // num_groups)
    ambiguous |= near_tie(keys, stable_topk_ref(keys, min(K + 1, candidates), excluded))
    if fix_routing_mask is not None:
        given = unmapped_topk_idx.cpu()
        given = torch.where((given >= 0) & (given < E), given, -1)
        idx = torch.where(fix_routing_mask.cpu()[:, None], given, idx)
    chosen = torch.where(idx >= 0, u.gather(1, idx.clamp(min=0)), 0.0)
    chosen = torch.where(chosen.isfinite(), chosen, 0.0)
    weights = routed_scaling_factor * chosen / (chosen.sum(dim=1, keepdim=True) + WEIGHT_SUM_EPS)
    unmapped = idx.clone()
    shared = torch.arange(E, E + S).expand(T, S)
    idx = torch.cat([idx, shared], dim=1)
    weights = torch.cat([weights, torch.ones(T, S, dtype=torch.float64)], dim=1)
    if to_physical_map is not None:
        replicas = to_physical_map.shape[1]
        count = logical_count.cpu().long().clamp(1, replicas)
        seed = ep_rank + torch.arange(T, dtype=torch.int64)[:, None] * REPLICA_STRIDE
        safe = idx.clamp(min=0)
        replica = seed % count[safe]
        idx = torch.where(idx >= 0, to_physical_map.cpu().long()[safe, replica], -1)
    scores = u.clone()
    if force_random is not None:
        num_physical = (
            int(logical_count.cpu().long().clamp(1, to_physical_map.shape[1]).sum())
            if to_physical_map is not None
            else E + S
        )
        for t in force_random.cpu().nonzero().flatten().tolist():
            experts, draws = random_experts_ref(t, ep_rank, P, num_physical)
            idx[t] = torch.tensor(experts)
            weights[t] = torch.tensor(draws, dtype=torch.float64)
            unmapped[t] = -1
            scores[t] = 0.0
            ambiguous[t] = False
    if mask is not None:
        off = ~mask.cpu()
        idx[off] = -1
        weights[off] = 0.0
        unmapped[off] = -1
        scores[off] = 0.0
        ambiguous[off] = False
    if fix_routing_mask is not None:
        ambiguous &= ~fix_routing_mask.cpu()
    return idx, weights, unmapped, scores, ambiguous
