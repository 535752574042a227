"""Hashes of the lowered Ascend and CUDA sources of every Engram kernel configuration the tests lower.

A check for refactorings of the kernel files: run it before and after and diff the outputs; every line
must stay the same. One line per configuration, in a fixed order:

    <op> <backend> sha256=<hex> <config repr>

The configurations are those of the CPU tier's lowering tests in tests/engram/test_*.py at every level
(level 2's grids contain those of levels 0 and 1), their variants (masks, save_for_backward, access
widths, fixed / claimed token ranges, resident / chunked, the CUDA row layouts the H200 sweep tries), and
the Ascend kernels of tests/ascend_emu/test_engram_kernels.py. Sources are lowered as the CPU tier lowers
them (tests/testing/lowering.py: kernel_target.lower_to_source for sm_90a / Ascend 950, the same core
counts), without its UB checks. Only the kernel modules are imported, not the operator interfaces.

    python -m tests.engram.lowered_sources [--out FILE] [--jobs N] [--level L] [--tvmscript]

Point TILELANG_CACHE_DIR at an empty directory to lower every source afresh rather than read the
lowered-source disk cache.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import hashlib
import multiprocessing
import sys
from collections.abc import Callable

# The lists of parameters are the tests' own (tests/testing/generator.py, tests/engram/lowering_grids.py);
# no test module is imported (that would import the operator interfaces too).
from tests.engram.lowering_grids import (
    FINALIZE_CUDA_VARIANTS,
    GATE_BWD_CHUNKED_CUDA_SHAPES,
    GATE_BWD_CLUSTER_CUDA_SHAPES,
    STEP_CUDA_VARIANTS,
    gen_hash_configs,
    gen_sinkhorn_head_dim,
)
from tests.testing.generator import gen_hc, gen_hidden, generate_samples
from tests.testing.lowering import ASCEND_950_VECTOR_CORES, CPU_TIER_CUDA_ARCH, H200_SMS

EMU_CORES = 64  # tests/ascend_emu/test_engram_kernels.py: CORES


@dataclasses.dataclass(frozen=True)
class Entry:
    op: str
    backend: str
    cfg: object
    make: Callable[[object], object]  # the kernel module's make_<op>_kernel


def _cores(backend: str) -> int:
    return ASCEND_950_VECTOR_CORES if backend == 'ascend' else H200_SMS


def configurations(level: int = 2) -> list[Entry]:
    """Every configuration the lowering tests of `level` (and the emulator's kernel tests) lower, once each,
    in a fixed order."""
    import cann_ops_tilelang.engram.engram_fused_weight_kernel as fw
    import cann_ops_tilelang.engram.engram_gate_bwd_kernel as gb
    import cann_ops_tilelang.engram.engram_gate_fwd_kernel as gf
    import cann_ops_tilelang.engram.engram_grad_w_reduce_kernel as gw
    import cann_ops_tilelang.engram.engram_hash_kernel as hk
    import cann_ops_tilelang.engram.engram_sinkhorn_finalize_kernel as sf
    import cann_ops_tilelang.engram.engram_sinkhorn_momentum_update_kernel as sm
    import cann_ops_tilelang.engram.engram_sinkhorn_step_kernel as ss
    import cann_ops_tilelang.engram.engram_sinkhorn_step_reduce_kernel as sr

    entries: list[Entry] = []

    def add(op: str, make, cfg) -> None:
        entries.append(Entry(op, cfg.backend, cfg, make))

    shapes = generate_samples(level, hc=gen_hc, hidden=gen_hidden)
    backends = ('ascend', 'cuda')

    # engram_fused_weight: the (hc, H) grid; the emulator's shapes.
    for b in backends:
        for p in shapes:
            add(
                'engram_fused_weight',
                fw.make_engram_fused_weight_kernel,
                fw.choose_engram_fused_weight_config(backend=b, **p, num_cores=_cores(b)),
            )
    for hc, hidden in ((4, 256), (3, 192)):
        add(
            'engram_fused_weight',
            fw.make_engram_fused_weight_kernel,
            fw.choose_engram_fused_weight_config(backend='ascend', hc=hc, hidden=hidden, num_cores=EMU_CORES),
        )

    # engram_gate_fwd: the grid; no saved tensors; the mask with and without them; narrower CUDA accesses.
    op, make = 'engram_gate_fwd', gf.make_engram_gate_fwd_kernel
    for b in backends:
        for p in shapes:
            add(op, make, gf.choose_engram_gate_fwd_config(backend=b, **p, num_cores=_cores(b)))
        add(
            op,
            make,
            gf.choose_engram_gate_fwd_config(
                backend=b, hc=4, hidden=4096, num_cores=_cores(b), save_for_backward=False
            ),
        )
        for save in (True, False):
            add(
                op,
                make,
                gf.choose_engram_gate_fwd_config(
                    backend=b, hc=4, hidden=4096, num_cores=_cores(b), save_for_backward=save, has_mask=True
                ),
            )
    for vec in (4, 1):
        add(op, make, gf.choose_engram_gate_fwd_config(backend='cuda', hc=3, hidden=192, num_cores=H200_SMS, vec=vec))
    for save in (True, False):
        add(
            op,
            make,
            gf.choose_engram_gate_fwd_config(
                backend='ascend', hc=4, hidden=256, num_cores=EMU_CORES, save_for_backward=save
            ),
        )

    # engram_gate_bwd: the grid; fixed token ranges beside claimed ones (resident CUDA); the split (cluster) and
    # chunked CUDA shapes; the mask variant, its plain twin and (CUDA) its schedules; the emulator's shape.
    op, make = 'engram_gate_bwd', gb.make_engram_gate_bwd_kernel
    for b in backends:
        for p in shapes:
            cfg = gb.choose_engram_gate_bwd_config(backend=b, **p, num_cores=_cores(b))
            add(op, make, cfg)
            if b == 'cuda' and cfg.variant == 'resident':
                add(op, make, gb.choose_engram_gate_bwd_config(backend=b, **p, num_cores=_cores(b), deterministic=True))
    for p in GATE_BWD_CLUSTER_CUDA_SHAPES + GATE_BWD_CHUNKED_CUDA_SHAPES:
        add(op, make, gb.choose_engram_gate_bwd_config(backend='cuda', **p, num_cores=H200_SMS))
    mask_cases = [
        ('cuda', {'hc': 4, 'hidden': 4096}),
        ('cuda', {'hc': 3, 'hidden': 192}),
        ('cuda', GATE_BWD_CHUNKED_CUDA_SHAPES[0]),
        *(('cuda', p) for p in GATE_BWD_CLUSTER_CUDA_SHAPES),
        ('ascend', {'hc': 4, 'hidden': 4096}),
        ('ascend', {'hc': 3, 'hidden': 1088}),
    ]
    for b, p in mask_cases:
        cfg = gb.choose_engram_gate_bwd_config(backend=b, **p, num_cores=_cores(b), has_mask=True)
        add(op, make, cfg)
        add(op, make, dataclasses.replace(cfg, has_mask=False))
        if b == 'cuda':  # the mask's schedules (test_engram_gate_bwd_mask_schedules_lower)
            add(op, make, dataclasses.replace(cfg, mask_ahead=True))
            if cfg.variant == 'resident':
                for results in ('select', 'bitwise'):
                    add(op, make, dataclasses.replace(cfg, mask_results=results))
                add(op, make, dataclasses.replace(cfg, mask_ahead=True, mask_results='bitwise'))
    add(op, make, gb.choose_engram_gate_bwd_config(backend='ascend', hc=4, hidden=256, num_cores=EMU_CORES))

    # engram_grad_w_reduce: the grid; the emulator's shape.
    for b in backends:
        for p in shapes:
            add(
                'engram_grad_w_reduce',
                gw.make_engram_grad_w_reduce_kernel,
                gw.choose_engram_grad_w_reduce_config(backend=b, **p, num_cores=_cores(b)),
            )
    add(
        'engram_grad_w_reduce',
        gw.make_engram_grad_w_reduce_kernel,
        gw.choose_engram_grad_w_reduce_config(backend='ascend', hc=4, hidden=256, num_cores=EMU_CORES),
    )

    # engram_hash: the compile-time sizes; the mask variant of the first two.
    op, make = 'engram_hash', hk.make_engram_hash_kernel
    sizes = gen_hash_configs(level)
    for b in backends:
        for p in sizes:
            add(op, make, hk.choose_engram_hash_config(backend=b, **p, num_cores=_cores(b)))
        for p in sizes[:2]:
            add(op, make, hk.choose_engram_hash_config(backend=b, **p, num_cores=_cores(b), has_mask=True))

    # The Sinkhorn family: the head_dim grid; the CUDA row layouts of the variant tests.
    head_dims = gen_sinkhorn_head_dim(level)
    for op, choose, make, variants in (
        (
            'engram_sinkhorn_step',
            ss.choose_engram_sinkhorn_step_config,
            ss.make_engram_sinkhorn_step_kernel,
            STEP_CUDA_VARIANTS,
        ),
        (
            'engram_sinkhorn_finalize',
            sf.choose_engram_sinkhorn_finalize_config,
            sf.make_engram_sinkhorn_finalize_kernel,
            FINALIZE_CUDA_VARIANTS,
        ),
        (
            'engram_sinkhorn_step_reduce',
            sr.choose_engram_sinkhorn_step_reduce_config,
            sr.make_engram_sinkhorn_step_reduce_kernel,
            [],
        ),
    ):
        for b in backends:
            for d in head_dims:
                add(op, make, choose(backend=b, head_dim=d, num_cores=_cores(b)))
        for variant in variants:
            variant = dict(variant)
            base = choose(backend='cuda', head_dim=variant.pop('head_dim'), num_cores=H200_SMS)
            add(op, make, dataclasses.replace(base, **variant))

    # engram_sinkhorn_momentum_update: dtype pairings x nesterov; on CUDA the wide and the streaming blocks
    # (numel just within and just beyond the wide blocks' reach).
    op, make = 'engram_sinkhorn_momentum_update', sm.make_engram_sinkhorn_momentum_update_kernel
    pairings = [(g, m) for g in ('bfloat16', 'float32') for m in ('bfloat16', 'float32')]
    wide_max = sm.cuda_wide_block_max_numel(H200_SMS)
    for b in backends:
        for nesterov in (True, False):
            for g, m in pairings:
                for numel in (1,) if b == 'ascend' else (wide_max, wide_max + 1):
                    add(
                        op,
                        make,
                        sm.choose_engram_sinkhorn_momentum_update_config(
                            backend=b,
                            grad_dtype=g,
                            momentum_dtype=m,
                            nesterov=nesterov,
                            num_cores=_cores(b),
                            numel=numel,
                        ),
                    )

    # One line per configuration: a config lowered by two tests is listed once.
    seen: set = set()
    unique = []
    for e in entries:
        if (e.op, e.cfg) not in seen:
            seen.add((e.op, e.cfg))
            unique.append(e)
    return unique


_worker_entries: list[Entry] | None = None


def _lower_one(level: int, index: int, script: bool = False) -> str:
    """The output line of configuration `index` (a worker rebuilds the list once; configs pickle badly
    across TileLang's objects, indices do not)."""
    global _worker_entries
    from cann_ops_tilelang.kernel_target import lower_to_source, tilelang_target

    if _worker_entries is None:
        _worker_entries = configurations(level)
    e = _worker_entries[index]
    if script:
        # The prim_func's TVMScript: what the lowered-source cache keys on (with the TileLang version and the
        # target), so equal scripts lower to equal sources; seconds for all configurations instead of minutes.
        text = e.make(e.cfg).script()
    else:
        text, _ = lower_to_source(e.make(e.cfg), tilelang_target(e.backend, cuda_arch=CPU_TIER_CUDA_ARCH))
    digest = hashlib.sha256(text.encode()).hexdigest()
    return f'{e.op} {e.backend} sha256={digest} {e.cfg!r}'


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--out', help='write the lines to this file (default: stdout)')
    parser.add_argument('--jobs', type=int, default=1, help='worker processes (default 1)')
    parser.add_argument('--level', type=int, default=2, choices=(0, 1, 2), help='test level (default 2: all)')
    parser.add_argument(
        '--tvmscript', action='store_true', help="hash the prim_funcs' TVMScript instead of lowering (a quick check)"
    )
    args = parser.parse_args(argv)
    count = len(configurations(args.level))
    if args.jobs > 1:
        # spawn: a forked child would inherit TVM's threads and locks mid-flight.
        ctx = multiprocessing.get_context('spawn')
        with concurrent.futures.ProcessPoolExecutor(args.jobs, mp_context=ctx) as pool:
            lines = list(pool.map(_lower_one, [args.level] * count, range(count), [args.tvmscript] * count))
    else:
        lines = [_lower_one(args.level, i, args.tvmscript) for i in range(count)]
    text = ''.join(line + '\n' for line in lines)
    if args.out:
        with open(args.out, 'w') as f:
            f.write(text)
        print(f'{count} configurations -> {args.out}', file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == '__main__':
    sys.exit(main())
