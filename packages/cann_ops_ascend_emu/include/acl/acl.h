// Stand-in for CANN's acl/acl.h (Ascend C emulated on CPU): the names TileLang's common.h uses.
#pragma once
#include <cassert>
#include <cstdio>

#include "emu/asc_emu.h"
typedef int aclError;
#define ACL_SUCCESS 0
#define ACL_RT_THREAD_LEVEL 0
inline aclError aclrtGetLastError(int) { return ACL_SUCCESS; }
