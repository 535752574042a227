// Stand-in for CANN's simt_api/asc_fp8.h (Ascend C emulated on CPU).
#pragma once
#include "emu/asc_emu.h"
