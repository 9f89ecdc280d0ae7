// RUN: kforge-opt %s --kforge-form-regions | FileCheck %s --check-prefix=ALL
// RUN: kforge-opt %s --kforge-form-regions="consumers=none" | FileCheck %s --check-prefix=NONE
// RUN: kforge-opt %s --kforge-form-regions="consumers=elementwise" | FileCheck %s --check-prefix=EW
// RUN: kforge-opt %s --kforge-form-regions="max-ops=2" | FileCheck %s --check-prefix=MAX2
// RUN: kforge-opt %s --kforge-form-regions="consumers=none standalone=false" | FileCheck %s --check-prefix=NOSTANDALONE
// RUN: kforge-opt %s --kforge-form-regions="fuse-producers=false" | FileCheck %s --check-prefix=NOPRODUCERS
// RUN: not kforge-opt %s --kforge-form-regions="consumers=elementwise,softmax" 2>&1 | FileCheck %s --check-prefix=BADKIND
// RUN: not kforge-opt %s --kforge-form-regions="max-ops=0" 2>&1 | FileCheck %s --check-prefix=BADMAX

// matmul -> scale -> row sum: which consumers join is up to the options.
// ALL: kforge.fusion_region "contraction" {{.*}}fused = ["matmul", "scale", "reduce_sum"]
// ALL-NOT: kforge.fusion_region

// NONE: kforge.fusion_region "contraction" {{.*}}fused = ["matmul"]
// NONE: kforge.fusion_region "elementwise" {{.*}}fused = ["scale"]
// NONE: kforge.fusion_region "reduction" {{.*}}fused = ["reduce_sum"]

// EW: kforge.fusion_region "contraction" {{.*}}fused = ["matmul", "scale"]
// EW: kforge.fusion_region "reduction" {{.*}}fused = ["reduce_sum"]

// MAX2: kforge.fusion_region "contraction" {{.*}}fused = ["matmul", "scale"]
// MAX2: kforge.fusion_region "reduction" {{.*}}fused = ["reduce_sum"]

// NOSTANDALONE: kforge.fusion_region "contraction" {{.*}}fused = ["matmul"]
// NOSTANDALONE-NOT: kforge.fusion_region
// NOSTANDALONE: linalg.generic
// NOSTANDALONE: linalg.generic
// NOSTANDALONE-NOT: kforge.fusion_region

// Without producer fusion the transposed weight is a region input; empties and scalars are
// still recomputed.
// NOPRODUCERS: %[[T:.*]] = linalg.transpose
// NOPRODUCERS: kforge.fusion_region "contraction" ({{.*}}%[[T]]{{.*}})
// NOPRODUCERS-NOT: linalg.transpose
// NOPRODUCERS: return

// BADKIND: error: kforge-form-regions: unknown consumer kind 'softmax' in consumers="elementwise,softmax"; use a comma-separated list of elementwise, reduction, reshape (or none)
// BADMAX: error: kforge-form-regions: max-ops must be at least 1
#map = affine_map<(d0, d1) -> (d0, d1)>
#row = affine_map<(d0, d1) -> (d0)>
func.func @chain(%x: tensor<4x8xf32>, %w: tensor<16x8xf32>, %acc: tensor<4xf32>) -> tensor<4xf32> {
  %zero = arith.constant 0.0 : f32
  %two = arith.constant 2.0 : f32
  %et = tensor.empty() : tensor<8x16xf32>
  %t = linalg.transpose ins(%w : tensor<16x8xf32>) outs(%et : tensor<8x16xf32>) permutation = [1, 0]
  %e = tensor.empty() : tensor<4x16xf32>
  %f = linalg.fill ins(%zero : f32) outs(%e : tensor<4x16xf32>) -> tensor<4x16xf32>
  %m = linalg.matmul ins(%x, %t : tensor<4x8xf32>, tensor<8x16xf32>) outs(%f : tensor<4x16xf32>) -> tensor<4x16xf32>
  %s = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel"]}
      ins(%m : tensor<4x16xf32>) outs(%e : tensor<4x16xf32>) {
  ^bb0(%in: f32, %out: f32):
    %y = arith.mulf %in, %two : f32
    linalg.yield %y : f32
  } -> tensor<4x16xf32>
  %r = linalg.generic {indexing_maps = [#map, #row], iterator_types = ["parallel", "reduction"]}
      ins(%s : tensor<4x16xf32>) outs(%acc : tensor<4xf32>) {
  ^bb0(%in: f32, %a: f32):
    %y = arith.addf %in, %a : f32
    linalg.yield %y : f32
  } -> tensor<4xf32>
  return %r : tensor<4xf32>
}
