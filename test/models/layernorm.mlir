// A torch-mlir export (torch 2.13, torch-mlir 20261001, linalg-on-tensors; weights as
// arguments marked kforge.weight): LayerNorm(32) on 8x32, no GEMM: one region. torch-mlir
// computes the variance from an f64 mean and, beside it, the f32 mean that is subtracted: two
// chains that share only the input, each a row reduction over the same rows. The analysis
// merges the later-grouped one into the region that reads it: one region, one rows kernel.
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
// CHECK: kforge.fused = {{\[}}"reduce_sum", "div", "sub", "mul", "reduce_sum", "div", "truncf", "reduce_sum", "div", "truncf_addf", "rsqrt", "sub", "mul", "scale", "bias"{{\]}}, kforge.hash = "{{[0-9a-f]+}}", kforge.min_bytes = {{[0-9]+}} : i64, kforge.root_kind = "reduction"
// CHECK-NOT: func.func private @kforge_region_

// READ: plan main: 3 inputs, 1 steps, 1 outputs
#map = affine_map<(d0, d1) -> (d0, d1)>
#map1 = affine_map<(d0, d1) -> (d0, 0)>
#map2 = affine_map<(d0, d1) -> (d1)>
module {
  func.func @main(%arg0: tensor<8x32xf32>, %arg1: tensor<32xf32> {kforge.weight = "norm.weight"}, %arg2: tensor<32xf32> {kforge.weight = "norm.bias"}) -> tensor<8x32xf32> {
    %cst = arith.constant 0.000000e+00 : f64
    %cst_0 = arith.constant 0.000000e+00 : f32
    %cst_1 = arith.constant 1.000000e-05 : f64
    %cst_2 = arith.constant 3.200000e+01 : f64
    %cst_3 = arith.constant 3.200000e+01 : f32
    %0 = tensor.empty() : tensor<8x32xf64>
    %1 = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel"]} ins(%arg0 : tensor<8x32xf32>) outs(%0 : tensor<8x32xf64>) {
    ^bb0(%in: f32, %out: f64):
      %22 = arith.extf %in : f32 to f64
      linalg.yield %22 : f64
    } -> tensor<8x32xf64>
    %2 = tensor.empty() : tensor<8x1xf64>
    %3 = linalg.fill ins(%cst : f64) outs(%2 : tensor<8x1xf64>) -> tensor<8x1xf64>
    %4 = linalg.generic {indexing_maps = [#map, #map1], iterator_types = ["parallel", "reduction"]} ins(%1 : tensor<8x32xf64>) outs(%3 : tensor<8x1xf64>) {
    ^bb0(%in: f64, %out: f64):
      %22 = arith.addf %in, %out : f64
      linalg.yield %22 : f64
    } -> tensor<8x1xf64>
    %5 = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel"]} ins(%4 : tensor<8x1xf64>) outs(%2 : tensor<8x1xf64>) {
    ^bb0(%in: f64, %out: f64):
      %22 = arith.divf %in, %cst_2 : f64
      linalg.yield %22 : f64
    } -> tensor<8x1xf64>
    %6 = linalg.generic {indexing_maps = [#map, #map1, #map], iterator_types = ["parallel", "parallel"]} ins(%1, %5 : tensor<8x32xf64>, tensor<8x1xf64>) outs(%0 : tensor<8x32xf64>) {
    ^bb0(%in: f64, %in_4: f64, %out: f64):
      %22 = arith.subf %in, %in_4 : f64
      linalg.yield %22 : f64
    } -> tensor<8x32xf64>
    %7 = linalg.generic {indexing_maps = [#map, #map, #map], iterator_types = ["parallel", "parallel"]} ins(%6, %6 : tensor<8x32xf64>, tensor<8x32xf64>) outs(%0 : tensor<8x32xf64>) {
    ^bb0(%in: f64, %in_4: f64, %out: f64):
      %22 = arith.mulf %in, %in_4 : f64
      linalg.yield %22 : f64
    } -> tensor<8x32xf64>
    %8 = linalg.generic {indexing_maps = [#map, #map1], iterator_types = ["parallel", "reduction"]} ins(%7 : tensor<8x32xf64>) outs(%3 : tensor<8x1xf64>) {
    ^bb0(%in: f64, %out: f64):
      %22 = arith.addf %in, %out : f64
      linalg.yield %22 : f64
    } -> tensor<8x1xf64>
    %9 = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel"]} ins(%8 : tensor<8x1xf64>) outs(%2 : tensor<8x1xf64>) {
    ^bb0(%in: f64, %out: f64):
      %22 = arith.divf %in, %cst_2 : f64
      linalg.yield %22 : f64
    } -> tensor<8x1xf64>
    %10 = tensor.empty() : tensor<8x1xf32>
    %11 = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel"]} ins(%9 : tensor<8x1xf64>) outs(%10 : tensor<8x1xf32>) {
    ^bb0(%in: f64, %out: f32):
      %22 = arith.truncf %in : f64 to f32
      linalg.yield %22 : f32
    } -> tensor<8x1xf32>
    %12 = linalg.fill ins(%cst_0 : f32) outs(%10 : tensor<8x1xf32>) -> tensor<8x1xf32>
    %13 = linalg.generic {indexing_maps = [#map, #map1], iterator_types = ["parallel", "reduction"]} ins(%arg0 : tensor<8x32xf32>) outs(%12 : tensor<8x1xf32>) {
    ^bb0(%in: f32, %out: f32):
      %22 = arith.addf %in, %out : f32
      linalg.yield %22 : f32
    } -> tensor<8x1xf32>
    %14 = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel"]} ins(%13 : tensor<8x1xf32>) outs(%10 : tensor<8x1xf32>) {
    ^bb0(%in: f32, %out: f32):
      %22 = arith.divf %in, %cst_3 : f32
      linalg.yield %22 : f32
    } -> tensor<8x1xf32>
    %15 = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel"]} ins(%11 : tensor<8x1xf32>) outs(%10 : tensor<8x1xf32>) {
    ^bb0(%in: f32, %out: f32):
      %22 = arith.truncf %cst_1 : f64 to f32
      %23 = arith.addf %in, %22 : f32
      linalg.yield %23 : f32
    } -> tensor<8x1xf32>
    %16 = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel"]} ins(%15 : tensor<8x1xf32>) outs(%10 : tensor<8x1xf32>) {
    ^bb0(%in: f32, %out: f32):
      %22 = math.rsqrt %in : f32
      linalg.yield %22 : f32
    } -> tensor<8x1xf32>
    %17 = tensor.empty() : tensor<8x32xf32>
    %18 = linalg.generic {indexing_maps = [#map, #map1, #map], iterator_types = ["parallel", "parallel"]} ins(%arg0, %14 : tensor<8x32xf32>, tensor<8x1xf32>) outs(%17 : tensor<8x32xf32>) {
    ^bb0(%in: f32, %in_4: f32, %out: f32):
      %22 = arith.subf %in, %in_4 : f32
      linalg.yield %22 : f32
    } -> tensor<8x32xf32>
    %19 = linalg.generic {indexing_maps = [#map, #map1, #map], iterator_types = ["parallel", "parallel"]} ins(%18, %16 : tensor<8x32xf32>, tensor<8x1xf32>) outs(%17 : tensor<8x32xf32>) {
    ^bb0(%in: f32, %in_4: f32, %out: f32):
      %22 = arith.mulf %in, %in_4 : f32
      linalg.yield %22 : f32
    } -> tensor<8x32xf32>
    %20 = linalg.generic {indexing_maps = [#map, #map2, #map], iterator_types = ["parallel", "parallel"]} ins(%19, %arg1 : tensor<8x32xf32>, tensor<32xf32>) outs(%17 : tensor<8x32xf32>) {
    ^bb0(%in: f32, %in_4: f32, %out: f32):
      %22 = arith.mulf %in, %in_4 : f32
      linalg.yield %22 : f32
    } -> tensor<8x32xf32>
    %21 = linalg.generic {indexing_maps = [#map, #map2, #map], iterator_types = ["parallel", "parallel"]} ins(%20, %arg2 : tensor<8x32xf32>, tensor<32xf32>) outs(%17 : tensor<8x32xf32>) {
    ^bb0(%in: f32, %in_4: f32, %out: f32):
      %22 = arith.addf %in, %in_4 : f32
      linalg.yield %22 : f32
    } -> tensor<8x32xf32>
    return %21 : tensor<8x32xf32>
  }
}
