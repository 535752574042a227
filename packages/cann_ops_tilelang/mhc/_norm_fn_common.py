"""What the norm_fn family (mhc_fn_normw_merge_fwd / _bwd, mhc_reduce_partials_and_rmsnorm_fwd / _bwd) shares:
the sizes its contract takes and the vector geometry its Ascend kernels build on (docs/mhc.md).

No kernel module imports an operator module: the backends and the kernel modules import this one only.
"""

from __future__ import annotations

LANES = 64  # fp32 lanes of one 256-byte Ascend vector register
ROW_ALIGN = 8  # fp32 elements of 32 bytes: each UB row starts on a 32-byte boundary, as vector loads need
CUDA_VEC = 4  # fp32 elements of one 16-byte CUDA access

MAX_MHC_MULT = 8
# Rows of the mix projection fn: mhc_mult pre + mhc_mult post + mhc_mult**2 residual mixes.
MAX_MHC_MULT3 = MAX_MHC_MULT * (MAX_MHC_MULT + 2)
HIDDEN_ALIGN = LANES  # fn's columns come in whole vector registers (and whole 16-byte CUDA accesses)
MAX_RMS_GROUPS = 16  # RMS groups per token (one UB row each in the reduce kernels' per-task tiles)
INDEX_LIMIT = 2**31 - 1  # int32 element indices of every tensor the kernels address


def padded_row(n: int) -> int:
    """`n` fp32 elements rounded up to a 32-byte UB row."""
    return -(-n // ROW_ALIGN) * ROW_ALIGN


def check_mhc_mult3(name: str, mhc_mult3: int) -> None:
    if not 1 <= mhc_mult3 <= MAX_MHC_MULT3:
        raise ValueError(f'{name}: mhc_mult3 (rows of fn) must be in [1, {MAX_MHC_MULT3}], got {mhc_mult3}')


def check_fn_shape(name: str, M3: int, K: int) -> None:
    """fn (M3, K): the limits of both fn/normw merge kernels."""
    check_mhc_mult3(name, M3)
    if K < HIDDEN_ALIGN or K % HIDDEN_ALIGN:
        raise ValueError(f'{name}: the hidden size of fn must be a positive multiple of {HIDDEN_ALIGN}, got {K}')
    if M3 * K > INDEX_LIMIT:
        raise ValueError(f'{name}: fn must have fewer than 2**31 elements, got {M3 * K}')


def check_rms_sizes(name: str, S: int, T: int, G: int, M3: int) -> None:
    """The reduce kernels' sizes: S splits of T tokens, G RMS groups of M3 mixes each."""
    check_mhc_mult3(name, M3)
    if not 1 <= G <= MAX_RMS_GROUPS:
        raise ValueError(f'{name}: the number of RMS groups must be in [1, {MAX_RMS_GROUPS}], got {G}')
    if S < 1:
        raise ValueError(f'{name}: at least one split, got {S}')
    if S * (T + 1) * G * padded_row(M3) > INDEX_LIMIT:  # one more tile of tokens: the tail task's addresses
        raise ValueError(f'{name}: {S} x {T} x {G} x {M3} partials exceed the int32 index range')


def check_rms_scalars(name: str, rms_group_size, rms_eps) -> None:
    if rms_group_size < 1:
        raise ValueError(f'{name}: rms_group_size must be >= 1, got {rms_group_size}')
    if rms_eps < 0:
        raise ValueError(f'{name}: rms_eps must be >= 0, got {rms_eps}')
