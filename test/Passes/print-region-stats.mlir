// RUN: kforge-opt %s --kforge-print-region-stats -o /dev/null 2>&1 | FileCheck %s
// RUN: kforge-opt %s --kforge-print-region-stats=json=true -o /dev/null 2>&1 | FileCheck %s --check-prefix=JSON
// RUN: kforge-opt %s --kforge-print-region-stats="to-stdout=true include-empty=true" | FileCheck %s --check-prefix=STDOUT
// The analysis leaves the IR unchanged.
// RUN: kforge-opt %s --kforge-print-region-stats 2>/dev/null | FileCheck %s --check-prefix=IR

#map = affine_map<(d0, d1) -> (d0, d1)>
#map1 = affine_map<(d0, d1) -> (d1)>

// CHECK-LABEL: kforge region stats: @mlp
// CHECK-NEXT:   linalg ops: 4 (contractions: 1, convolutions: 0, reductions: 0, elementwise: 3)
// 2*4*8*16 (matmul) + 0 (fill: no arithmetic) + 4*16 (bias add) + 4*16 (relu)
// CHECK-NEXT:   flops: 1152
// CHECK-NEXT:   linalg.fill: 1
// CHECK-NEXT:   linalg.generic: 2
// CHECK-NEXT:   linalg.matmul: 1
// JSON: {"contractions":1,"convolutions":0,"elementwise":3,"flops":1152,"function":"mlp","linalg_ops":4,"ops":{"linalg.fill":1,"linalg.generic":2,"linalg.matmul":1},"reductions":0}
// IR-LABEL: func.func @mlp
// IR: linalg.matmul
func.func @mlp(%x: tensor<4x8xf32>, %w: tensor<8x16xf32>, %b: tensor<16xf32>) -> tensor<4x16xf32> {
  %zero = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<4x16xf32>
  %f = linalg.fill ins(%zero : f32) outs(%e : tensor<4x16xf32>) -> tensor<4x16xf32>
  %m = linalg.matmul ins(%x, %w : tensor<4x8xf32>, tensor<8x16xf32>) outs(%f : tensor<4x16xf32>) -> tensor<4x16xf32>
  %add = linalg.generic {indexing_maps = [#map, #map1, #map], iterator_types = ["parallel", "parallel"]}
      ins(%m, %b : tensor<4x16xf32>, tensor<16xf32>) outs(%e : tensor<4x16xf32>) {
  ^bb0(%in: f32, %bias: f32, %out: f32):
    %s = arith.addf %in, %bias : f32
    linalg.yield %s : f32
  } -> tensor<4x16xf32>
  %relu = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel"]}
      ins(%add : tensor<4x16xf32>) outs(%e : tensor<4x16xf32>) {
  ^bb0(%in: f32, %out: f32):
    %c0 = arith.constant 0.0 : f32
    %r = arith.maximumf %in, %c0 : f32
    linalg.yield %r : f32
  } -> tensor<4x16xf32>
  return %relu : tensor<4x16xf32>
}

// CHECK-LABEL: kforge region stats: @row_sum_dynamic
// CHECK-NEXT:   linalg ops: 1 (contractions: 0, convolutions: 0, reductions: 1, elementwise: 0)
// A dynamic dimension counts as 1: 1*32 points, one addf each.
// CHECK-NEXT:   flops: 32
func.func @row_sum_dynamic(%x: tensor<?x32xf32>, %init: tensor<?xf32>) -> tensor<?xf32> {
  %r = linalg.reduce ins(%x : tensor<?x32xf32>) outs(%init : tensor<?xf32>) dimensions = [1]
    (%in: f32, %acc: f32) {
      %s = arith.addf %in, %acc : f32
      linalg.yield %s : f32
    }
  return %r : tensor<?xf32>
}

// CHECK-LABEL: kforge region stats: @conv
// CHECK-NEXT:   linalg ops: 1 (contractions: 0, convolutions: 1, reductions: 0, elementwise: 0)
// 2 * (1*8*6*6 output points) * (3*3*3 window): 2*288*27
// CHECK-NEXT:   flops: 15552
func.func @conv(%x: tensor<1x3x8x8xf32>, %w: tensor<8x3x3x3xf32>, %o: tensor<1x8x6x6xf32>) -> tensor<1x8x6x6xf32> {
  %c = linalg.conv_2d_nchw_fchw {dilations = dense<1> : vector<2xi64>, strides = dense<1> : vector<2xi64>}
    ins(%x, %w : tensor<1x3x8x8xf32>, tensor<8x3x3x3xf32>) outs(%o : tensor<1x8x6x6xf32>) -> tensor<1x8x6x6xf32>
  return %c : tensor<1x8x6x6xf32>
}

// Functions without linalg ops are skipped unless include-empty is set.
// CHECK-NOT: @empty
// STDOUT: kforge region stats: @empty
// STDOUT-NEXT: linalg ops: 0
func.func @empty(%x: tensor<4xf32>) -> tensor<4xf32> {
  return %x : tensor<4xf32>
}
