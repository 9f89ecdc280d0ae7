// A torch-mlir export (torch 2.13, torch-mlir 20261001, linalg-on-tensors; weights as
// arguments marked kforge.weight): nn.Linear + InstanceNorm over a view: one region.
// RUN: kforge-opt %s --kforge-pipeline | FileCheck %s
// The pipeline is idempotent.
// RUN: kforge-opt %s --kforge-pipeline -o %t.once.mlir
// RUN: kforge-opt %t.once.mlir --kforge-pipeline -o %t.twice.mlir
// RUN: diff %t.once.mlir %t.twice.mlir
// Every region exports; what is exported reads back in the Python half.
// RUN: rm -rf %t.dir && kforge-opt %s --kforge-pipeline="dir=%t.dir" -o /dev/null
// RUN: %if kforge-python %{ env PYTHONPATH=%kforge_pythonpath %python %S/../Inputs/read_with_python.py %t.dir/*.json %}

// CHECK-LABEL: func.func @main
// CHECK: call @kforge_region_
// CHECK: return
// CHECK-DAG: kforge.fused = {{\[}}"matmul", "bias", "extf", "reduce_sum", "div", "sub", "mul", "reduce_sum", "div", "truncf", "reduce_sum", "div", "truncf_addf", "rsqrt", "sub", "mul"{{\]}}, kforge.hash = "{{[0-9a-f]+}}", kforge.min_bytes = {{[0-9]+}} : i64, kforge.root_kind = "contraction"

#map = affine_map<(d0, d1) -> (d0, d1)>
#map1 = affine_map<(d0, d1) -> (d1)>
#map2 = affine_map<(d0, d1, d2) -> (d0, d1, d2)>
#map3 = affine_map<(d0, d1, d2) -> (0, d1, 0)>
#map4 = affine_map<(d0, d1, d2) -> (d0, d1, 0)>
module {
  func.func @main(%arg0: tensor<8x64xf32>, %arg1: tensor<32x64xf32>, %arg2: tensor<32xf32>) -> tensor<8x32xf32> {
    %cst = arith.constant 0.000000e+00 : f32
    %cst_0 = arith.constant 0.000000e+00 : f64
    %cst_1 = arith.constant 1.000000e-05 : f64
    %cst_2 = arith.constant 8.000000e+00 : f64
    %cst_3 = arith.constant 8.000000e+00 : f32
    %0 = tensor.empty() : tensor<64x32xf32>
    %transposed = linalg.transpose ins(%arg1 : tensor<32x64xf32>) outs(%0 : tensor<64x32xf32>) permutation = [1, 0] 
    %1 = tensor.empty() : tensor<8x32xf32>
    %2 = linalg.fill ins(%cst : f32) outs(%1 : tensor<8x32xf32>) -> tensor<8x32xf32>
    %3 = linalg.matmul ins(%arg0, %transposed : tensor<8x64xf32>, tensor<64x32xf32>) outs(%2 : tensor<8x32xf32>) -> tensor<8x32xf32>
    %4 = linalg.generic {indexing_maps = [#map, #map1, #map], iterator_types = ["parallel", "parallel"]} ins(%3, %arg2 : tensor<8x32xf32>, tensor<32xf32>) outs(%1 : tensor<8x32xf32>) {
    ^bb0(%in: f32, %in_8: f32, %out: f32):
      %25 = arith.addf %in, %in_8 : f32
      linalg.yield %25 : f32
    } -> tensor<8x32xf32>
    %expanded = tensor.expand_shape %4 [[0], [1, 2]] output_shape [8, 4, 8] : tensor<8x32xf32> into tensor<8x4x8xf32>
    %collapsed = tensor.collapse_shape %expanded [[0, 1], [2]] : tensor<8x4x8xf32> into tensor<32x8xf32>
    %expanded_4 = tensor.expand_shape %collapsed [[0, 1], [2]] output_shape [1, 32, 8] : tensor<32x8xf32> into tensor<1x32x8xf32>
    %5 = tensor.empty() : tensor<1x32x8xf64>
    %6 = linalg.generic {indexing_maps = [#map2, #map2], iterator_types = ["parallel", "parallel", "parallel"]} ins(%expanded_4 : tensor<1x32x8xf32>) outs(%5 : tensor<1x32x8xf64>) {
    ^bb0(%in: f32, %out: f64):
      %25 = arith.extf %in : f32 to f64
      linalg.yield %25 : f64
    } -> tensor<1x32x8xf64>
    %7 = tensor.empty() : tensor<1x32x1xf64>
    %8 = linalg.fill ins(%cst_0 : f64) outs(%7 : tensor<1x32x1xf64>) -> tensor<1x32x1xf64>
    %9 = linalg.generic {indexing_maps = [#map2, #map3], iterator_types = ["reduction", "parallel", "reduction"]} ins(%6 : tensor<1x32x8xf64>) outs(%8 : tensor<1x32x1xf64>) {
    ^bb0(%in: f64, %out: f64):
      %25 = arith.addf %in, %out : f64
      linalg.yield %25 : f64
    } -> tensor<1x32x1xf64>
    %10 = linalg.generic {indexing_maps = [#map2, #map2], iterator_types = ["parallel", "parallel", "parallel"]} ins(%9 : tensor<1x32x1xf64>) outs(%7 : tensor<1x32x1xf64>) {
    ^bb0(%in: f64, %out: f64):
      %25 = arith.divf %in, %cst_2 : f64
      linalg.yield %25 : f64
    } -> tensor<1x32x1xf64>
    %11 = linalg.generic {indexing_maps = [#map2, #map4, #map2], iterator_types = ["parallel", "parallel", "parallel"]} ins(%6, %10 : tensor<1x32x8xf64>, tensor<1x32x1xf64>) outs(%5 : tensor<1x32x8xf64>) {
    ^bb0(%in: f64, %in_8: f64, %out: f64):
      %25 = arith.subf %in, %in_8 : f64
      linalg.yield %25 : f64
    } -> tensor<1x32x8xf64>
    %12 = linalg.generic {indexing_maps = [#map2, #map2, #map2], iterator_types = ["parallel", "parallel", "parallel"]} ins(%11, %11 : tensor<1x32x8xf64>, tensor<1x32x8xf64>) outs(%5 : tensor<1x32x8xf64>) {
    ^bb0(%in: f64, %in_8: f64, %out: f64):
      %25 = arith.mulf %in, %in_8 : f64
      linalg.yield %25 : f64
    } -> tensor<1x32x8xf64>
    %13 = linalg.generic {indexing_maps = [#map2, #map3], iterator_types = ["reduction", "parallel", "reduction"]} ins(%12 : tensor<1x32x8xf64>) outs(%8 : tensor<1x32x1xf64>) {
    ^bb0(%in: f64, %out: f64):
      %25 = arith.addf %in, %out : f64
      linalg.yield %25 : f64
    } -> tensor<1x32x1xf64>
    %14 = linalg.generic {indexing_maps = [#map2, #map2], iterator_types = ["parallel", "parallel", "parallel"]} ins(%13 : tensor<1x32x1xf64>) outs(%7 : tensor<1x32x1xf64>) {
    ^bb0(%in: f64, %out: f64):
      %25 = arith.divf %in, %cst_2 : f64
      linalg.yield %25 : f64
    } -> tensor<1x32x1xf64>
    %15 = tensor.empty() : tensor<1x32x1xf32>
    %16 = linalg.generic {indexing_maps = [#map2, #map2], iterator_types = ["parallel", "parallel", "parallel"]} ins(%14 : tensor<1x32x1xf64>) outs(%15 : tensor<1x32x1xf32>) {
    ^bb0(%in: f64, %out: f32):
      %25 = arith.truncf %in : f64 to f32
      linalg.yield %25 : f32
    } -> tensor<1x32x1xf32>
    %17 = linalg.fill ins(%cst : f32) outs(%15 : tensor<1x32x1xf32>) -> tensor<1x32x1xf32>
    %18 = linalg.generic {indexing_maps = [#map2, #map3], iterator_types = ["reduction", "parallel", "reduction"]} ins(%expanded_4 : tensor<1x32x8xf32>) outs(%17 : tensor<1x32x1xf32>) {
    ^bb0(%in: f32, %out: f32):
      %25 = arith.addf %in, %out : f32
      linalg.yield %25 : f32
    } -> tensor<1x32x1xf32>
    %19 = linalg.generic {indexing_maps = [#map2, #map2], iterator_types = ["parallel", "parallel", "parallel"]} ins(%18 : tensor<1x32x1xf32>) outs(%15 : tensor<1x32x1xf32>) {
    ^bb0(%in: f32, %out: f32):
      %25 = arith.divf %in, %cst_3 : f32
      linalg.yield %25 : f32
    } -> tensor<1x32x1xf32>
    %20 = linalg.generic {indexing_maps = [#map2, #map2], iterator_types = ["parallel", "parallel", "parallel"]} ins(%16 : tensor<1x32x1xf32>) outs(%15 : tensor<1x32x1xf32>) {
    ^bb0(%in: f32, %out: f32):
      %25 = arith.truncf %cst_1 : f64 to f32
      %26 = arith.addf %in, %25 : f32
      linalg.yield %26 : f32
    } -> tensor<1x32x1xf32>
    %21 = linalg.generic {indexing_maps = [#map2, #map2], iterator_types = ["parallel", "parallel", "parallel"]} ins(%20 : tensor<1x32x1xf32>) outs(%15 : tensor<1x32x1xf32>) {
    ^bb0(%in: f32, %out: f32):
      %25 = math.rsqrt %in : f32
      linalg.yield %25 : f32
    } -> tensor<1x32x1xf32>
    %22 = tensor.empty() : tensor<1x32x8xf32>
    %23 = linalg.generic {indexing_maps = [#map2, #map4, #map2], iterator_types = ["parallel", "parallel", "parallel"]} ins(%expanded_4, %19 : tensor<1x32x8xf32>, tensor<1x32x1xf32>) outs(%22 : tensor<1x32x8xf32>) {
    ^bb0(%in: f32, %in_8: f32, %out: f32):
      %25 = arith.subf %in, %in_8 : f32
      linalg.yield %25 : f32
    } -> tensor<1x32x8xf32>
    %24 = linalg.generic {indexing_maps = [#map2, #map4, #map2], iterator_types = ["parallel", "parallel", "parallel"]} ins(%23, %21 : tensor<1x32x8xf32>, tensor<1x32x1xf32>) outs(%22 : tensor<1x32x8xf32>) {
    ^bb0(%in: f32, %in_8: f32, %out: f32):
      %25 = arith.mulf %in, %in_8 : f32
      linalg.yield %25 : f32
    } -> tensor<1x32x8xf32>
    %collapsed_5 = tensor.collapse_shape %24 [[0, 1], [2]] : tensor<1x32x8xf32> into tensor<32x8xf32>
    %expanded_6 = tensor.expand_shape %collapsed_5 [[0, 1], [2]] output_shape [8, 4, 8] : tensor<32x8xf32> into tensor<8x4x8xf32>
    %collapsed_7 = tensor.collapse_shape %expanded_6 [[0], [1, 2]] : tensor<8x4x8xf32> into tensor<8x32xf32>
    return %collapsed_7 : tensor<8x32xf32>
  }
}
