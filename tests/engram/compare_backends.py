"""The same inputs through the Ascend kernels on the Ascend C emulator (CPU tensors) and through the CUDA
kernels (a GPU), every public operator, and how far the two agree.

    python -m tests.engram.compare_backends [--tokens 257] [--hidden 1088] [--hc 4]

Needs a CUDA GPU and this repository's packages/ on sys.path (the emulator). Results computed on the CPU are
"Ascend C emulated on CPU"; the GPU's are CUDA's. Per-core partial sums (grad_w_partial, col_sumsq_partial)
have one slice per core on each backend (64 emulated vector cores, one per SM or two on CUDA), so they are
compared summed over their first dimension.
"""

from __future__ import annotations

import argparse
import os

import torch

import cann_ops_tilelang as ops
from cann_ops_tilelang.config import ASCEND_EMULATOR_ENV

EPS, CLAMP = 1e-6, 1e-6


def _inputs(num_tokens: int, hc: int, hidden: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)

    def randn(*shape, dtype=torch.bfloat16):
        return torch.randn(*shape, generator=g).to(dtype)

    rows, head_dim = 1001, 256
    mask = torch.rand(num_tokens, generator=g) < 0.3
    return {
        'wh': (1 + 0.5 * randn(hc, hidden).float()).bfloat16(),
        'we': (1 + 0.5 * randn(hc, hidden).float()).bfloat16(),
        'x': randn(num_tokens, hc, hidden),
        'kv': randn(num_tokens, hc + 1, hidden),
        'grad_out': randn(num_tokens, hc, hidden),
        'mask': mask,
        'partials': randn(7, hc, hidden, dtype=torch.float32),
        'ids': torch.randint(0, 50000, (num_tokens, 3), generator=g, dtype=torch.int32),
        'mult': torch.randint(1, 2**31, (2, 3), generator=g, dtype=torch.int64),
        'vocab': torch.randint(1000, 100000, (2, 2, 8), generator=g, dtype=torch.int32),
        'offsets': torch.randint(0, 10**6, (2, 16), generator=g, dtype=torch.int32),
        'grad': randn(rows * head_dim),
        'momentum': randn(rows * head_dim, dtype=torch.float32),
        'matrix': randn(rows, head_dim, dtype=torch.float32).abs() + 0.1,
        'row_scale': torch.rand(rows, generator=g) + 0.5,
        'col_scale': torch.rand(head_dim, generator=g) + 0.5,
    }


def _run(inputs: dict[str, torch.Tensor], device: str) -> dict[str, torch.Tensor]:
    t = {k: v.to(device) for k, v in inputs.items()}
    out = {'fused_weight': ops.engram_fused_weight(t['wh'], t['we'])}
    w = out['fused_weight']
    fwd = ops.engram_gate_fwd(t['x'], t['kv'], w, EPS, CLAMP)
    for name, value in zip(('output', 'dot', 'gate_score', 'rstd_x', 'rstd_k'), fwd, strict=True):
        out[f'gate_fwd.{name}'] = value
    out['gate_fwd[mask].output'] = ops.engram_gate_fwd(t['x'], t['kv'], w, EPS, CLAMP, image_token_mask=t['mask'])[0]
    grad_x, grad_kv, grad_w_partial = ops.engram_gate_bwd(t['grad_out'], t['x'], t['kv'], w, *fwd[1:], CLAMP)
    out |= {
        'gate_bwd.grad_x': grad_x,
        'gate_bwd.grad_kv': grad_kv,
        'gate_bwd.sum_p(grad_w_partial)': grad_w_partial.sum(0),
    }
    gh, ge = torch.zeros_like(w), torch.zeros_like(w)
    ops.engram_grad_w_reduce(t['partials'], t['wh'], t['we'], gh, ge)
    out |= {'grad_w_reduce.grad_weight_hidden': gh, 'grad_w_reduce.grad_weight_embed': ge}
    out['hash'] = ops.engram_hash(t['ids'], t['mult'], t['vocab'], t['offsets'])
    out['hash[mask]'] = ops.engram_hash(t['ids'], t['mult'], t['vocab'], t['offsets'], t['mask'])
    momentum = t['momentum'].clone()
    out['sinkhorn_momentum_update'] = ops.engram_sinkhorn_momentum_update(t['grad'], momentum, 0.9)
    out['sinkhorn_momentum_update.buffer'] = momentum
    row_scale = t['row_scale'].clone()
    row_norm, partial = ops.engram_sinkhorn_step(t['matrix'], row_scale, t['col_scale'], EPS)
    col_sumsq = torch.empty_like(t['col_scale'])
    ops.engram_sinkhorn_step_reduce(partial, col_sumsq)
    out |= {'sinkhorn_step.row_norm': row_norm, 'sinkhorn_step.row_scale': row_scale}
    out['sinkhorn_step_reduce.col_sumsq'] = col_sumsq
    out['sinkhorn_finalize'] = ops.engram_sinkhorn_finalize(t['matrix'], t['row_scale'], t['col_scale'], EPS, 1.0)
    return {k: v.cpu() for k, v in out.items()}


def _agreement(a: torch.Tensor, b: torch.Tensor) -> str:
    if a.dtype in (torch.int32, torch.int64):
        return f'{int((a != b).sum())} of {a.numel()} differ'
    a64, b64 = a.double(), b.double()
    same = int((a.view(-1) == b.view(-1)).sum()) if a.numel() else 0
    diff = (a64 - b64).abs()
    rel = float((diff / b64.abs().clamp_min(1e-30)).max()) if a.numel() else 0.0
    return f'{same / max(a.numel(), 1):7.2%} bit-identical, max |diff| {float(diff.max()):.3g}, max rel {rel:.3g}'


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--tokens', type=int, default=257)
    parser.add_argument('--hidden', type=int, default=1088)
    parser.add_argument('--hc', type=int, default=4)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        parser.exit(4, 'compare_backends: needs a CUDA GPU\n')
    inputs = _inputs(args.tokens, args.hc, args.hidden)
    cuda = _run(inputs, 'cuda')
    import cann_ops_ascend_emu  # noqa: F401  (registers the emulator with the wheel)

    os.environ[ASCEND_EMULATOR_ENV] = '1'
    emulated = _run(inputs, 'cpu')
    where = f'Ascend C emulated on CPU vs CUDA on {torch.cuda.get_device_name()}'
    print(f'T = {args.tokens}, hc = {args.hc}, H = {args.hidden}; {where}')
    for name, value in emulated.items():
        print(f'{name:40s} {_agreement(value, cuda[name])}')


if __name__ == '__main__':
    main()
