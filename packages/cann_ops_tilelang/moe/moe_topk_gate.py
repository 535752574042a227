"""moe_topk_gate: the MoE router's forward, logits (T, E) fp32 -> (topk_idx, topk_weights) (T, K + S)
(TileKernels 2.1.0's `moe_topk_gate_forward`, alias `moe_topk_gate`, plus 'sigmoid' / 'softmax' scoring and
group-limited routing)."""

from __future__ import annotations

import torch

from cann_ops_tilelang.kernel_target import placeholder
from cann_ops_tilelang.operator import Operator, new_output, outs, scalar, tensor
from cann_ops_tilelang.validation import ALIGN_BYTES

from ._scoring import SCORING_FUNCS
from .moe_topk_gate_kernel import (
    check_gate_sizes,
    choose_moe_topk_gate_config,
    get_moe_topk_gate_kernel,
)
from .moe_topk_kernel import MAX_ELEMENTS

MAX_EP_RANK = 2**31 - 1


def _limits(name, T, E):
    if T * E > MAX_ELEMENTS:
        raise ValueError(f'{name}: logits must have at most {MAX_ELEMENTS} elements (int32 offsets), got {T} x {E}')


def _shared(use_shared_as_routed, num_shared_experts):
    """S: the shared experts routed as slots K..K+S-1 (TileKernels ignores num_shared_experts without the flag)."""
    return num_shared_experts if use_shared_as_routed else 0


def _replicas(to_physical_map):
    return 0 if to_physical_map is None else to_physical_map.shape[1]


def _contract(name, T, E, num_topk, use_shared_as_routed, num_shared_experts, ep_rank, scoring_func, image_bias,
              image_token_mask, fix_routing_mask, to_physical_map, logical_count, unmapped_topk_idx, num_groups,
              topk_groups):  # fmt: skip
    """The rules the declaration's table cannot say (ValueError)."""
    if scoring_func not in SCORING_FUNCS:
        raise ValueError(f'{name}: scoring_func must be one of {SCORING_FUNCS}, got {scoring_func!r}')
    if num_shared_experts < 0:
        raise ValueError(f'{name}: num_shared_experts must be >= 0, got {num_shared_experts}')
    S = _shared(use_shared_as_routed, num_shared_experts)
    if use_shared_as_routed and S == 0:
        raise ValueError(f'{name}: use_shared_as_routed needs num_shared_experts 1 or 2, got 0')
    if not 0 <= ep_rank <= MAX_EP_RANK:
        raise ValueError(f'{name}: ep_rank must be in 0..{MAX_EP_RANK}, got {ep_rank}')
    if (image_bias is None) != (image_token_mask is None):
        raise ValueError(f'{name}: image_bias and image_token_mask must be given together')
    if (to_physical_map is None) != (logical_count is None):
        raise ValueError(f'{name}: to_physical_map and logical_count must be given together')
    if fix_routing_mask is not None and unmapped_topk_idx is None:
        raise ValueError(f'{name}: fix_routing_mask needs unmapped_topk_idx (the fixed experts are read from it)')
    L = E + S
    if to_physical_map is not None:
        if to_physical_map.dim() != 2 or to_physical_map.shape[0] != L or to_physical_map.shape[1] < 1:
            raise ValueError(
                f'{name}: to_physical_map must have shape ({L}, R) (routed + shared experts, R replicas), '
                f'got {tuple(to_physical_map.shape)}'
            )
        if logical_count.shape != (L,):
            raise ValueError(f'{name}: logical_count must have shape ({L},), got {tuple(logical_count.shape)}')
    if unmapped_topk_idx is not None and unmapped_topk_idx.shape != (T, num_topk):
        raise ValueError(
            f'{name}: unmapped_topk_idx must have shape ({T}, {num_topk}), got {tuple(unmapped_topk_idx.shape)}'
        )
    check_gate_sizes(name, E, num_topk, S, num_groups, topk_groups, _replicas(to_physical_map))


def _results(logits, num_topk, use_shared_as_routed, num_shared_experts):
    T, P = logits.shape[0], num_topk + _shared(use_shared_as_routed, num_shared_experts)
    return ((T, P), torch.int64), ((T, P), torch.float32)


def _choice(logits, num_topk, use_shared_as_routed, num_shared_experts, scoring_func, mask, bias, image_bias,
            fix_routing_mask, to_physical_map, unmapped_topk_idx, force_random, scores, num_groups,
            topk_groups):  # fmt: skip
    return {
        'num_experts': logits.shape[1],
        'num_topk': num_topk,
        'num_shared_experts': _shared(use_shared_as_routed, num_shared_experts),
        'scoring_func': scoring_func,
        'num_groups': num_groups,
        'topk_groups': topk_groups,
        'replicas': _replicas(to_physical_map),
        'has_mask': mask is not None,
        'has_bias': bias is not None,
        'has_image': image_bias is not None,
        'has_fixed': fix_routing_mask is not None,
        'has_unmapped': unmapped_topk_idx is not None,
        'has_random': force_random is not None,
        'has_scores': scores is not None,
        'aligned': logits.data_ptr() % ALIGN_BYTES == 0,
    }


# The contract, checked in the mechanism's order: types and dtypes (TypeError), shapes and layouts (ValueError),
# the scalars, the rules of `_contract`, the out= buffers, written tensors apart from the others, the device.
OP = Operator(
    'moe_topk_gate',
    tensor('logits', torch.float32, 'T, E'),
    scalar('num_topk', 'int'),
    scalar('use_shared_as_routed', 'bool'),
    scalar('num_shared_experts', 'int'),
    scalar('routed_scaling_factor', 'float'),
    scalar('ep_rank', 'int'),
    scalar('scoring_func', 'str'),
    tensor('mask', torch.bool, 'T', optional=True),
    tensor('bias', torch.float32, 'E', optional=True),
    tensor('image_bias', torch.float32, 'E', optional=True),
    tensor('image_token_mask', torch.bool, 'T', optional=True),
    tensor('fix_routing_mask', torch.bool, 'T', optional=True),
    tensor('to_physical_map', torch.int32, optional=True),  # (E + S, R): checked in _contract
    tensor('logical_count', torch.int32, optional=True),  # (E + S,)
    tensor('unmapped_topk_idx', torch.int64, layout='rows', optional=True, written='updated', fast_when_given=True),
    tensor('force_random', torch.bool, 'T', optional=True),
    tensor('scores', torch.float32, 'T, E', optional=True, written='written', fast_when_given=True),
    scalar('num_groups', 'int'),
    scalar('topk_groups', 'int'),
    outs('out', 'topk_idx', 'topk_weights'),
    limits=_limits,
    extra=_contract,
    results=_results,
    choice=_choice,
    choose_config=choose_moe_topk_gate_config,
    get_kernel=get_moe_topk_gate_kernel,
)


_PLACEHOLDERS: dict[torch.device, tuple[torch.Tensor, ...]] = {}


def _placeholders(device: torch.device) -> tuple[torch.Tensor, ...]:
    """The tensors a launch passes for absent optional ones (fp32 table, bool, int32 map, int32 table, int64
    rows, fp32 rows; in the ranks of gate_shapes), one lookup per call: the host path of a small batch."""
    fill = _PLACEHOLDERS.get(device)
    if fill is None:
        table = 1 if device.type == 'cuda' else 2  # Ascend: each expert table as one row
        kinds = ((torch.float32, table), (torch.bool, 1), (torch.int32, 2), (torch.int32, table), (torch.int64, 2),
                 (torch.float32, 2))  # fmt: skip
        fill = _PLACEHOLDERS[device] = tuple(placeholder(device, dtype, ndim) for dtype, ndim in kinds)
    return fill


def _eager(logits, num_topk, use_shared_as_routed, num_shared_experts, routed_scaling_factor, ep_rank,
           scoring_func, mask, bias, image_bias, image_token_mask, fix_routing_mask, to_physical_map, logical_count,
           unmapped_topk_idx, force_random, scores, num_groups, topk_groups, out):  # fmt: skip
    """A call on real tensors (also the kernel of the torch.library forms): every check, then the launch. Fast
    path, without out=: by every value the configuration and the contract's rules read (the presence of each
    optional tensor among them), the ranks of the tensors passed as rows (the entry sees their flat views), the
    alignment of logits and the CUDA index; T = 0 takes the checked path and launches nothing."""
    args = (logits, num_topk, use_shared_as_routed, num_shared_experts, routed_scaling_factor, ep_rank, scoring_func,
            mask, bias, image_bias, image_token_mask, fix_routing_mask, to_physical_map, logical_count,
            unmapped_topk_idx, force_random, scores, num_groups, topk_groups, out)  # fmt: skip
    key = None
    shape = OP.fast_ok(*args)
    if (
        shape is not None
        and shape[0]
        and 0 <= ep_rank <= MAX_EP_RANK
        and (bias is None or bias.dim() == 1)
        and (image_bias is None or image_bias.dim() == 1)
        and (to_physical_map is None or to_physical_map.dim() == 2)
        and (logical_count is None or logical_count.dim() == 1)
    ):
        # one flat tuple (the presence of each optional tensor among its items): one build and one hash per call
        key = (shape[1], num_topk, use_shared_as_routed, num_shared_experts, scoring_func, num_groups, topk_groups,
               mask is not None, bias is not None, image_bias is not None, image_token_mask is not None,
               fix_routing_mask is not None, logical_count is not None, unmapped_topk_idx is not None,
               force_random is not None, scores is not None, _replicas(to_physical_map),
               logits.data_ptr() % ALIGN_BYTES == 0, logits.get_device())  # fmt: skip
    launcher, fast = OP.prepare(key, args)
    if out is None:
        idx_layout, weights_layout = _results(logits, num_topk, use_shared_as_routed, num_shared_experts)
        out = (new_output(logits, idx_layout), new_output(logits, weights_layout))
    if key is None and not logits.shape[0]:  # no tokens: nothing to launch (a fast-path key has tokens)
        return out
    fill = _placeholders(launcher.device)  # logits' device, without the torch.device that logits.device makes
    if not logits.is_cuda:  # Ascend takes the expert tables as rows (gate_shapes); CUDA as they are
        bias, image_bias, to_physical_map, logical_count = (
            t if t is None else t.view(1, -1) for t in (bias, image_bias, to_physical_map, logical_count)
        )
    # The kernel takes unmapped_topk_idx contiguous: a strided one (last dimension contiguous) goes through a copy.
    unmapped = unmapped_topk_idx
    if unmapped is not None and not unmapped.is_contiguous():
        unmapped = unmapped.contiguous()
    launch_args = (
        logits,
        fill[0] if bias is None else bias,
        fill[0] if image_bias is None else image_bias,
        fill[1] if image_token_mask is None else image_token_mask,
        fill[1] if mask is None else mask,
        fill[1] if fix_routing_mask is None else fix_routing_mask,
        fill[1] if force_random is None else force_random,
        fill[2] if to_physical_map is None else to_physical_map,
        fill[3] if logical_count is None else logical_count,
        fill[4] if unmapped is None else unmapped,
        fill[5] if scores is None else scores,
        out[0],
        out[1],
        float(routed_scaling_factor),
        ep_rank,
    )
    OP.finish(launcher, fast, key, launch_args, args, empty=False)
    if unmapped is not unmapped_topk_idx:
        unmapped_topk_idx.copy_(unmapped)
    return out


@OP.public(_eager)
def moe_topk_gate(
    logits: torch.Tensor,
    num_topk: int,
    use_shared_as_routed: bool,
    num_shared_experts: int,
    routed_scaling_factor: float,
    ep_rank: int,
    scoring_func: str = 'sqrtsoftplus',
    mask: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    image_bias: torch.Tensor | None = None,
    image_token_mask: torch.Tensor | None = None,
    fix_routing_mask: torch.Tensor | None = None,
    to_physical_map: torch.Tensor | None = None,
    logical_count: torch.Tensor | None = None,
    unmapped_topk_idx: torch.Tensor | None = None,
    force_random: torch.Tensor | None = None,
    *,
    scores: torch.Tensor | None = None,
    num_groups: int = 1,
    topk_groups: int = 1,
    out: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Route each token to num_topk experts (and S = num_shared_experts shared slots with use_shared_as_routed).

    Per token t (K = num_topk, P = K + S, s = routed_scaling_factor):

    1. mask[t] False: topk_idx[t] = -1, topk_weights[t] = 0, unmapped_topk_idx[t] = -1, scores[t] = 0.
    2. force_random[t] True (after mask): P distinct random physical experts in 0..N-1 (N = sum of logical_count,
       or E + S without a map) with weights uniform in [0, 1), deterministic in (t, ep_rank) (a counter-based
       hash; TileKernels' curand draws differ); unmapped_topk_idx[t] = -1, scores[t] = 0.
    3. Otherwise u = score(logits[t]): 'sqrtsoftplus' sqrt(softplus(x)), 'sigmoid', or 'softmax' over the row;
       scores[t] = u when `scores` is given (the backward's input). Ranking key u + bias (image_bias where
       image_token_mask[t]); with num_groups G > 1 the experts form G groups of E / G, each scored by the sum of
       its two best keys, and only the topk_groups best groups compete. The K experts: unmapped_topk_idx[t] where
       fix_routing_mask[t] (an index outside 0..E-1 gives -1, weight 0), else the K largest keys in descending
       order, ties to the lower index. topk_weights = s * u_k / (sum_k u_k + 1e-20); unmapped_topk_idx[t] = the
       K experts. Slots K..P-1: experts E..E+S-1, weight 1. With to_physical_map (E + S, R) and logical_count
       (E + S,): each expert e >= 0 becomes to_physical_map[e, (ep_rank + t * 23333) % c], c = logical_count[e]
       clamped into 1..R (int64 arithmetic: every t is safe).

    NaN and inf (no host sync, no device assert): u follows IEEE arithmetic (sqrtsoftplus(+inf) = inf, a NaN
    logit gives u NaN, softmax of a row with +inf or only NaN/-inf gives NaN); a NaN key ranks below every
    number, -inf included; a non-finite u counts 0 in the weights, which therefore stay finite.

    Args:
        logits: (T, E) fp32, contiguous; 1 <= E <= 512, T >= 0 (T = 0: empty results, no launch), T * E < 2**31.
        num_topk: K, 1 <= K <= 32 - S, and K <= topk_groups * E / num_groups.
        use_shared_as_routed: route the shared experts as slots (then num_shared_experts is 1 or 2).
        num_shared_experts: S where use_shared_as_routed, else ignored (as TileKernels).
        routed_scaling_factor: s, a finite float.
        ep_rank: this rank, 0 <= ep_rank < 2**31 (the replica choice and the random draws).
        scoring_func: 'sqrtsoftplus' (default), 'sigmoid' or 'softmax'.
        mask, image_token_mask, fix_routing_mask, force_random: optional (T,) bool, contiguous.
        bias, image_bias: optional (E,) fp32, contiguous; image_bias and image_token_mask go together.
        to_physical_map: optional (E + S, R) int32, contiguous, 1 <= R <= 16; logical_count: (E + S,) int32,
            contiguous; the two go together.
        unmapped_topk_idx: optional (T, K) int64, last dimension contiguous, written (and read where
            fix_routing_mask[t]); fix_routing_mask needs it.
        scores: optional (T, E) fp32 output buffer, contiguous, receiving u.
        num_groups, topk_groups: group-limited routing, G in 1..32 dividing E, 1 <= topk_groups <= G.
        out: optional (topk_idx (T, P) int64, topk_weights (T, P) fp32) buffers, contiguous.
        Every tensor on logits' device; written tensors overlap nothing else.

    Returns:
        (topk_idx, topk_weights), `out` when given.
    """
