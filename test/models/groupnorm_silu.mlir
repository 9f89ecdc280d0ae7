// A torch-mlir export (torch 2.13, torch-mlir 20261001, linalg-on-tensors; weights as
// arguments marked kforge.weight): GroupNorm(4, 16) + SiLU on 2x16x4x4, no GEMM: one region.
// As for LayerNorm (layernorm.mlir), the f32 mean is a chain of its own beside the f64
// variance, reducing the same rows (a group's 4x16 values); the analysis merges it into the
// region that reads it, with the reshapes to and from groups and the SiLU.
// RUN: kforge-opt %s --kforge-pipeline | FileCheck %s
// The pipeline is idempotent.
// RUN: kforge-opt %s --kforge-pipeline -o %t.once.mlir
// RUN: kforge-opt %t.once.mlir --kforge-pipeline -o %t.twice.mlir
// RUN: diff %t.once.mlir %t.twice.mlir
// Every region exports; what is exported reads back in the Python half.
// RUN: rm -rf %t.dir && kforge-opt %s --kforge-pipeline="dir=%t.dir" -o /dev/null
// RUN: %if kforge-python %{ env PYTHONPATH=%kforge_pythonpath %python %S/../Inputs/read_with_python.py %t.dir/*.json | FileCheck %s --check-prefix=READ %}

// CHECK-LABEL: func.func @main
// CHECK-NEXT: call @kforge_region_
// CHECK-NEXT: return
// CHECK: kforge.fused = {{\[}}"reduce_sum", "div", "sub", "mul", "reduce_sum", "div", "truncf", "reduce_sum", "div", "truncf_addf", "rsqrt", "mul", "negf", "mul", "add", "mul", "add", "sigmoid", "mul"{{\]}}, kforge.hash = "{{[0-9a-f]+}}", kforge.min_bytes = {{[0-9]+}} : i64, kforge.root_kind = "reduction"
// CHECK-NOT: func.func private @kforge_region_

// READ: plan main: 3 inputs, 1 steps, 1 outputs
#map = affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>
#map1 = affine_map<(d0, d1, d2, d3) -> (d0, d1, 0, 0)>
#map2 = affine_map<(d0, d1, d2, d3) -> (d0, d1, 0, d3)>
#map3 = affine_map<(d0, d1, d2, d3) -> (0, d1, d2, d3)>
module {
  func.func @main(%arg0: tensor<2x16x4x4xf32>, %arg1: tensor<16xf32> {kforge.weight = "norm.weight"}, %arg2: tensor<16xf32> {kforge.weight = "norm.bias"}) -> tensor<2x16x4x4xf32> {
    %cst = arith.constant 0.000000e+00 : f64
    %cst_0 = arith.constant 0.000000e+00 : f32
    %cst_1 = arith.constant 1.000000e+00 : f32
    %cst_2 = arith.constant 1.000000e-05 : f64
    %cst_3 = arith.constant 6.400000e+01 : f64
    %cst_4 = arith.constant 6.400000e+01 : f32
    %collapsed = tensor.collapse_shape %arg0 [[0], [1], [2, 3]] : tensor<2x16x4x4xf32> into tensor<2x16x16xf32>
    %expanded = tensor.expand_shape %collapsed [[0], [1, 2], [3]] output_shape [2, 4, 4, 16] : tensor<2x16x16xf32> into tensor<2x4x4x16xf32>
    %0 = tensor.empty() : tensor<2x4x4x16xf64>
    %1 = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel", "parallel", "parallel"]} ins(%expanded : tensor<2x4x4x16xf32>) outs(%0 : tensor<2x4x4x16xf64>) {
    ^bb0(%in: f32, %out: f64):
      %27 = arith.extf %in : f32 to f64
      linalg.yield %27 : f64
    } -> tensor<2x4x4x16xf64>
    %2 = tensor.empty() : tensor<2x4x1x1xf64>
    %3 = linalg.fill ins(%cst : f64) outs(%2 : tensor<2x4x1x1xf64>) -> tensor<2x4x1x1xf64>
    %4 = linalg.generic {indexing_maps = [#map, #map1], iterator_types = ["parallel", "parallel", "reduction", "reduction"]} ins(%1 : tensor<2x4x4x16xf64>) outs(%3 : tensor<2x4x1x1xf64>) {
    ^bb0(%in: f64, %out: f64):
      %27 = arith.addf %in, %out : f64
      linalg.yield %27 : f64
    } -> tensor<2x4x1x1xf64>
    %5 = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel", "parallel", "parallel"]} ins(%4 : tensor<2x4x1x1xf64>) outs(%2 : tensor<2x4x1x1xf64>) {
    ^bb0(%in: f64, %out: f64):
      %27 = arith.divf %in, %cst_3 : f64
      linalg.yield %27 : f64
    } -> tensor<2x4x1x1xf64>
    %6 = linalg.generic {indexing_maps = [#map, #map1, #map], iterator_types = ["parallel", "parallel", "parallel", "parallel"]} ins(%1, %5 : tensor<2x4x4x16xf64>, tensor<2x4x1x1xf64>) outs(%0 : tensor<2x4x4x16xf64>) {
    ^bb0(%in: f64, %in_11: f64, %out: f64):
      %27 = arith.subf %in, %in_11 : f64
      linalg.yield %27 : f64
    } -> tensor<2x4x4x16xf64>
    %7 = linalg.generic {indexing_maps = [#map, #map, #map], iterator_types = ["parallel", "parallel", "parallel", "parallel"]} ins(%6, %6 : tensor<2x4x4x16xf64>, tensor<2x4x4x16xf64>) outs(%0 : tensor<2x4x4x16xf64>) {
    ^bb0(%in: f64, %in_11: f64, %out: f64):
      %27 = arith.mulf %in, %in_11 : f64
      linalg.yield %27 : f64
    } -> tensor<2x4x4x16xf64>
    %8 = linalg.generic {indexing_maps = [#map, #map1], iterator_types = ["parallel", "parallel", "reduction", "reduction"]} ins(%7 : tensor<2x4x4x16xf64>) outs(%3 : tensor<2x4x1x1xf64>) {
    ^bb0(%in: f64, %out: f64):
      %27 = arith.addf %in, %out : f64
      linalg.yield %27 : f64
    } -> tensor<2x4x1x1xf64>
    %9 = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel", "parallel", "parallel"]} ins(%8 : tensor<2x4x1x1xf64>) outs(%2 : tensor<2x4x1x1xf64>) {
    ^bb0(%in: f64, %out: f64):
      %27 = arith.divf %in, %cst_3 : f64
      linalg.yield %27 : f64
    } -> tensor<2x4x1x1xf64>
    %10 = tensor.empty() : tensor<2x4x1x1xf32>
    %11 = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel", "parallel", "parallel"]} ins(%9 : tensor<2x4x1x1xf64>) outs(%10 : tensor<2x4x1x1xf32>) {
    ^bb0(%in: f64, %out: f32):
      %27 = arith.truncf %in : f64 to f32
      linalg.yield %27 : f32
    } -> tensor<2x4x1x1xf32>
    %12 = linalg.fill ins(%cst_0 : f32) outs(%10 : tensor<2x4x1x1xf32>) -> tensor<2x4x1x1xf32>
    %13 = linalg.generic {indexing_maps = [#map, #map1], iterator_types = ["parallel", "parallel", "reduction", "reduction"]} ins(%expanded : tensor<2x4x4x16xf32>) outs(%12 : tensor<2x4x1x1xf32>) {
    ^bb0(%in: f32, %out: f32):
      %27 = arith.addf %in, %out : f32
      linalg.yield %27 : f32
    } -> tensor<2x4x1x1xf32>
    %14 = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel", "parallel", "parallel"]} ins(%13 : tensor<2x4x1x1xf32>) outs(%10 : tensor<2x4x1x1xf32>) {
    ^bb0(%in: f32, %out: f32):
      %27 = arith.divf %in, %cst_4 : f32
      linalg.yield %27 : f32
    } -> tensor<2x4x1x1xf32>
    %15 = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel", "parallel", "parallel"]} ins(%11 : tensor<2x4x1x1xf32>) outs(%10 : tensor<2x4x1x1xf32>) {
    ^bb0(%in: f32, %out: f32):
      %27 = arith.truncf %cst_2 : f64 to f32
      %28 = arith.addf %in, %27 : f32
      linalg.yield %28 : f32
    } -> tensor<2x4x1x1xf32>
    %16 = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel", "parallel", "parallel"]} ins(%15 : tensor<2x4x1x1xf32>) outs(%10 : tensor<2x4x1x1xf32>) {
    ^bb0(%in: f32, %out: f32):
      %27 = math.rsqrt %in : f32
      linalg.yield %27 : f32
    } -> tensor<2x4x1x1xf32>
    %expanded_5 = tensor.expand_shape %arg1 [[0, 1, 2, 3]] output_shape [1, 4, 4, 1] : tensor<16xf32> into tensor<1x4x4x1xf32>
    %17 = tensor.empty() : tensor<2x4x4x1xf32>
    %18 = linalg.generic {indexing_maps = [#map2, #map3, #map], iterator_types = ["parallel", "parallel", "parallel", "parallel"]} ins(%16, %expanded_5 : tensor<2x4x1x1xf32>, tensor<1x4x4x1xf32>) outs(%17 : tensor<2x4x4x1xf32>) {
    ^bb0(%in: f32, %in_11: f32, %out: f32):
      %27 = arith.mulf %in, %in_11 : f32
      linalg.yield %27 : f32
    } -> tensor<2x4x4x1xf32>
    %19 = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel", "parallel", "parallel"]} ins(%14 : tensor<2x4x1x1xf32>) outs(%10 : tensor<2x4x1x1xf32>) {
    ^bb0(%in: f32, %out: f32):
      %27 = arith.negf %in : f32
      linalg.yield %27 : f32
    } -> tensor<2x4x1x1xf32>
    %20 = linalg.generic {indexing_maps = [#map2, #map, #map], iterator_types = ["parallel", "parallel", "parallel", "parallel"]} ins(%19, %18 : tensor<2x4x1x1xf32>, tensor<2x4x4x1xf32>) outs(%17 : tensor<2x4x4x1xf32>) {
    ^bb0(%in: f32, %in_11: f32, %out: f32):
      %27 = arith.mulf %in, %in_11 : f32
      linalg.yield %27 : f32
    } -> tensor<2x4x4x1xf32>
    %expanded_6 = tensor.expand_shape %arg2 [[0, 1, 2, 3]] output_shape [1, 4, 4, 1] : tensor<16xf32> into tensor<1x4x4x1xf32>
    %21 = linalg.generic {indexing_maps = [#map, #map3, #map], iterator_types = ["parallel", "parallel", "parallel", "parallel"]} ins(%20, %expanded_6 : tensor<2x4x4x1xf32>, tensor<1x4x4x1xf32>) outs(%17 : tensor<2x4x4x1xf32>) {
    ^bb0(%in: f32, %in_11: f32, %out: f32):
      %27 = arith.addf %in, %in_11 : f32
      linalg.yield %27 : f32
    } -> tensor<2x4x4x1xf32>
    %collapsed_7 = tensor.collapse_shape %18 [[0], [1, 2], [3]] : tensor<2x4x4x1xf32> into tensor<2x16x1xf32>
    %expanded_8 = tensor.expand_shape %collapsed_7 [[0], [1], [2, 3]] output_shape [2, 16, 1, 1] : tensor<2x16x1xf32> into tensor<2x16x1x1xf32>
    %collapsed_9 = tensor.collapse_shape %21 [[0], [1, 2], [3]] : tensor<2x4x4x1xf32> into tensor<2x16x1xf32>
    %expanded_10 = tensor.expand_shape %collapsed_9 [[0], [1], [2, 3]] output_shape [2, 16, 1, 1] : tensor<2x16x1xf32> into tensor<2x16x1x1xf32>
    %22 = tensor.empty() : tensor<2x16x4x4xf32>
    %23 = linalg.generic {indexing_maps = [#map, #map1, #map], iterator_types = ["parallel", "parallel", "parallel", "parallel"]} ins(%arg0, %expanded_8 : tensor<2x16x4x4xf32>, tensor<2x16x1x1xf32>) outs(%22 : tensor<2x16x4x4xf32>) {
    ^bb0(%in: f32, %in_11: f32, %out: f32):
      %27 = arith.mulf %in, %in_11 : f32
      linalg.yield %27 : f32
    } -> tensor<2x16x4x4xf32>
    %24 = linalg.generic {indexing_maps = [#map, #map1, #map], iterator_types = ["parallel", "parallel", "parallel", "parallel"]} ins(%23, %expanded_10 : tensor<2x16x4x4xf32>, tensor<2x16x1x1xf32>) outs(%22 : tensor<2x16x4x4xf32>) {
    ^bb0(%in: f32, %in_11: f32, %out: f32):
      %27 = arith.addf %in, %in_11 : f32
      linalg.yield %27 : f32
    } -> tensor<2x16x4x4xf32>
    %25 = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel", "parallel", "parallel"]} ins(%24 : tensor<2x16x4x4xf32>) outs(%22 : tensor<2x16x4x4xf32>) {
    ^bb0(%in: f32, %out: f32):
      %27 = arith.negf %in : f32
      %28 = math.exp %27 : f32
      %29 = arith.addf %28, %cst_1 : f32
      %30 = arith.divf %cst_1, %29 : f32
      linalg.yield %30 : f32
    } -> tensor<2x16x4x4xf32>
    %26 = linalg.generic {indexing_maps = [#map, #map, #map], iterator_types = ["parallel", "parallel", "parallel", "parallel"]} ins(%24, %25 : tensor<2x16x4x4xf32>, tensor<2x16x4x4xf32>) outs(%22 : tensor<2x16x4x4xf32>) {
    ^bb0(%in: f32, %in_11: f32, %out: f32):
      %27 = arith.mulf %in, %in_11 : f32
      linalg.yield %27 : f32
    } -> tensor<2x16x4x4xf32>
    return %26 : tensor<2x16x4x4xf32>
  }
}
