// Ascend C emulated on CPU: functions that TileLang's simd_inst.h / ascend_fp8.h / reduce.h or its code generator
// can name but this emulator does not emulate. Each is declared so that every kernel compiles; reaching one
// ends the launch with an EmulatorError naming it.
#pragma once
#include "emu/types.h"

#define EMU_UNEMULATED(NAME) \
  template <class... A> inline void NAME(A &&...) { emu::unemulated(#NAME); }

// register C API (reg/*.md) without an emulation here
EMU_UNEMULATED(asc_addc)
EMU_UNEMULATED(asc_subc)
EMU_UNEMULATED(asc_mull)
EMU_UNEMULATED(asc_intlv_b8)
EMU_UNEMULATED(asc_intlv_b16)
EMU_UNEMULATED(asc_intlv_b32)
EMU_UNEMULATED(asc_deintlv_b8)
EMU_UNEMULATED(asc_deintlv_b16)
EMU_UNEMULATED(asc_deintlv_b32)
EMU_UNEMULATED(asc_gather_datablock)
EMU_UNEMULATED(asc_squeeze)
EMU_UNEMULATED(asc_unsqueeze)
EMU_UNEMULATED(asc_pair_reduce_sum)
EMU_UNEMULATED(asc_pack_to_high)
EMU_UNEMULATED(asc_pack_to_low)
EMU_UNEMULATED(asc_unpack_upper)
EMU_UNEMULATED(asc_unpack_lower)
EMU_UNEMULATED(asc_frequency_histogram_bin0)
EMU_UNEMULATED(asc_frequency_histogram_bin1)
EMU_UNEMULATED(asc_cumulative_histogram_bin0)
EMU_UNEMULATED(asc_cumulative_histogram_bin1)
EMU_UNEMULATED(asc_loadalign_upsample)
EMU_UNEMULATED(asc_loadalign_downsample)
EMU_UNEMULATED(asc_loadalign_brc_datablock)
EMU_UNEMULATED(asc_loadalign_brc_elem2datablock)
EMU_UNEMULATED(asc_loadalign_deintlv)
EMU_UNEMULATED(asc_loadalign_postupdate)
EMU_UNEMULATED(asc_loadalign_brc_elem_postupdate)
EMU_UNEMULATED(asc_loadalign_upsample_postupdate)
EMU_UNEMULATED(asc_loadalign_downsample_postupdate)
EMU_UNEMULATED(asc_loadalign_unpack_postupdate)
EMU_UNEMULATED(asc_loadalign_unpack4_postupdate)
EMU_UNEMULATED(asc_loadalign_brc_datablock_postupdate)
EMU_UNEMULATED(asc_loadalign_brc_elem2datablock_postupdate)
EMU_UNEMULATED(asc_storealign_intlv)
EMU_UNEMULATED(asc_storealign_postupdate)
// Carry forms of asc_add / asc_sub (vaddc / vsubc).
inline void asc_add(vector_bool &, vector_u32 &, vector_u32, vector_u32, vector_bool) { emu::unemulated("asc_add (carry form)"); }
inline void asc_sub(vector_bool &, vector_u32 &, vector_u32, vector_u32, vector_bool) { emu::unemulated("asc_sub (carry form)"); }
// Strided store (vsstb) and predicate pack / predicate up/down-sample.
template <emu::vreg V, class T> inline void asc_storealign(T *, V, uint16_t, uint16_t, vector_bool) {
  emu::unemulated("asc_storealign (block-stride form)");
}
inline void asc_storealign_pack(uint32_t *, vector_bool, int32_t = 0) { emu::unemulated("asc_storealign_pack (vector_bool)"); }
inline void asc_loadalign_upsample(vector_bool &, uint32_t *, int32_t = 0) { emu::unemulated("asc_loadalign_upsample (vector_bool)"); }
inline void asc_loadalign_downsample(vector_bool &, uint32_t *, int32_t = 0) { emu::unemulated("asc_loadalign_downsample (vector_bool)"); }

// scalar-side C API names TileLang's code generator can emit (cube, atomics, locks, loop-mode DMA, ...)
EMU_UNEMULATED(asc_set_atomic_add)
EMU_UNEMULATED(asc_set_atomic_max)
EMU_UNEMULATED(asc_set_atomic_min)
EMU_UNEMULATED(asc_set_atomic_none)
EMU_UNEMULATED(asc_lock)
EMU_UNEMULATED(asc_unlock)
EMU_UNEMULATED(asc_mmad)
EMU_UNEMULATED(asc_mmad_mx)
EMU_UNEMULATED(asc_copy_gm2l1_nd2nz)
EMU_UNEMULATED(asc_copy_gm2l1_dn2nz)
EMU_UNEMULATED(asc_copy_l12l0a)
EMU_UNEMULATED(asc_copy_l12l0b)
EMU_UNEMULATED(asc_copy_l12l0a_transpose)
EMU_UNEMULATED(asc_copy_l12l0b_transpose)
EMU_UNEMULATED(asc_copy_l12l0a_mx)
EMU_UNEMULATED(asc_copy_l12l0b_mx)
EMU_UNEMULATED(asc_copy_ub2l1)
EMU_UNEMULATED(asc_fill_l1)
EMU_UNEMULATED(asc_set_gm2ub_loop_size)
EMU_UNEMULATED(asc_set_gm2ub_loop1_stride)
EMU_UNEMULATED(asc_set_gm2ub_loop2_stride)
EMU_UNEMULATED(asc_set_ub2gm_loop_size)
EMU_UNEMULATED(asc_set_ub2gm_loop1_stride)
EMU_UNEMULATED(asc_set_ub2gm_loop2_stride)
EMU_UNEMULATED(asc_set_gm2l1_nz_para)
EMU_UNEMULATED(asc_set_l0c_copy_nz_para)
EMU_UNEMULATED(asc_enable_hf32)
EMU_UNEMULATED(asc_disable_hf32)
EMU_UNEMULATED(asc_set_hf32_round_mode)
EMU_UNEMULATED(asc_set_ctrl)
inline int64_t asc_get_sub_block_id() { emu::unemulated("asc_get_sub_block_id"); }
#undef EMU_UNEMULATED
