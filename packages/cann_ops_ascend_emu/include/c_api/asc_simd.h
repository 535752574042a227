// Stand-in for CANN's c_api/asc_simd.h (Ascend C emulated on CPU).
#pragma once
#include "emu/asc_emu.h"
