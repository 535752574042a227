// Stand-in for CANN's simt_api/asc_simt.h (Ascend C emulated on CPU).
#pragma once
#include "emu/asc_emu.h"
