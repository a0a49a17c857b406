// matmul/wgmma_shapes_host.h: the host's handles of the tiles matmul_wgmma.kernel.cu's module
// defines (wgmma_shape.h says what each is), for its two host launchers: matmul_wgmma.cu (the 2-d
// routes) and matmul_wgmma_batched.cu (a batch in one launch). Read with wb::global<&kShape>.
#pragma once

#include "wb/module.h"

namespace wb::matmul {

WB_DEVICE_TEMPLATE(kShape, "matmul_wgmma.kernel.cu", "wb::matmul::wgmma_shape");
WB_DEVICE_TEMPLATE(kSplitShape, "matmul_wgmma.kernel.cu", "wb::matmul::wgmma_split_shape");
WB_DEVICE_TEMPLATE(kWideShape, "matmul_wgmma.kernel.cu", "wb::matmul::wgmma_wide_split_shape");
WB_DEVICE_TEMPLATE(kMidShape, "matmul_wgmma.kernel.cu", "wb::matmul::wgmma_mid_shape");
WB_DEVICE_TEMPLATE(kSquareShape, "matmul_wgmma.kernel.cu", "wb::matmul::wgmma_square_shape");
WB_DEVICE_TEMPLATE(kSquare192Shape, "matmul_wgmma.kernel.cu", "wb::matmul::wgmma_square192_shape");
WB_DEVICE_TEMPLATE(kSquare256Shape, "matmul_wgmma.kernel.cu", "wb::matmul::wgmma_square256_shape");

}  // namespace wb::matmul
