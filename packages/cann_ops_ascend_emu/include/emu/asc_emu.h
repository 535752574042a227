// Ascend C emulated on CPU: everything the stand-in CANN headers provide, in dependency order.
#pragma once
#include "emu/state.h"
#include "emu/types.h"
#include "emu/sync_dma.h"
#include "emu/vector.h"
#include "emu/simt.h"
#include "emu/unemulated.h"

// Scalar helpers the generated code calls unqualified.
template <class A, class B> inline auto min(A a, B b) { return b < a ? b : a; }
template <class A, class B> inline auto max(A a, B b) { return a < b ? b : a; }
