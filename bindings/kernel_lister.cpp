// kernel_lister.cpp: the kernels a family's host launchers name, read without torch or a GPU.
//
// `wb smoke` compiles device-only TUs for every target architecture on machines that cannot link
// a CUDA library (a CPU build of torch). It links the family's compiled CUDA launchers with this
// file alone into a small shared library, loads it in a child process, and reads the names the
// launchers registered while it loaded (wb/module.h), as the real library would report them.
// Nothing here launches: a launch answers with an error.
#include "wb/registry_modules.h"

#define WB_EXPORT extern "C" __attribute__((visibility("default")))

WB_EXPORT int wb_kernel_count() { return wb::detail::kernel_count(); }
WB_EXPORT const char* wb_kernel_name(int i) { return wb::detail::kernel_name(i); }
