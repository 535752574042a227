// Stand-in for CANN's simt_api/asc_bf16.h (Ascend C emulated on CPU).
#pragma once
#include "emu/asc_emu.h"
