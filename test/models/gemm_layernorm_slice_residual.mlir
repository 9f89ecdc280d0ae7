// A torch-mlir export (torch 2.13, torch-mlir 20261001, linalg-on-tensors; weights as
// arguments marked kforge.weight): nn.Linear + LayerNorm + a residual read through a slice,
// x[:, :32]: one region; the slice becomes a copy generic recomputed inside it.
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
// CHECK-DAG: kforge.fused = {{\[}}"matmul", "bias", "extf", "reduce_sum", "div", "sub", "mul", "reduce_sum", "div", "truncf", "reduce_sum", "div", "truncf_addf", "rsqrt", "sub", "mul", "add"{{\]}}, kforge.hash = "{{[0-9a-f]+}}", kforge.min_bytes = {{[0-9]+}} : i64, kforge.root_kind = "contraction"

#map = affine_map<(d0, d1) -> (d0, d1)>
#map1 = affine_map<(d0, d1) -> (d1)>
#map2 = affine_map<(d0, d1) -> (d0, 0)>
module {
  func.func @main(%arg0: tensor<8x64xf32>, %arg1: tensor<32x64xf32> {kforge.weight = "fc.weight"}, %arg2: tensor<32xf32> {kforge.weight = "fc.bias"}) -> tensor<8x32xf32> {
    %cst = arith.constant 0.000000e+00 : f32
    %cst_0 = arith.constant 0.000000e+00 : f64
    %cst_1 = arith.constant 1.000000e-05 : f64
    %cst_2 = arith.constant 3.200000e+01 : f64
    %cst_3 = arith.constant 3.200000e+01 : f32
    %0 = tensor.empty() : tensor<64x32xf32>
    %transposed = linalg.transpose ins(%arg1 : tensor<32x64xf32>) outs(%0 : tensor<64x32xf32>) permutation = [1, 0] 
    %1 = tensor.empty() : tensor<8x32xf32>
    %2 = linalg.fill ins(%cst : f32) outs(%1 : tensor<8x32xf32>) -> tensor<8x32xf32>
    %3 = linalg.matmul ins(%arg0, %transposed : tensor<8x64xf32>, tensor<64x32xf32>) outs(%2 : tensor<8x32xf32>) -> tensor<8x32xf32>
    %4 = linalg.generic {indexing_maps = [#map, #map1, #map], iterator_types = ["parallel", "parallel"]} ins(%3, %arg2 : tensor<8x32xf32>, tensor<32xf32>) outs(%1 : tensor<8x32xf32>) {
    ^bb0(%in: f32, %in_4: f32, %out: f32):
      %25 = arith.addf %in, %in_4 : f32
      linalg.yield %25 : f32
    } -> tensor<8x32xf32>
    %5 = tensor.empty() : tensor<8x32xf64>
    %6 = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel"]} ins(%4 : tensor<8x32xf32>) outs(%5 : tensor<8x32xf64>) {
    ^bb0(%in: f32, %out: f64):
      %25 = arith.extf %in : f32 to f64
      linalg.yield %25 : f64
    } -> tensor<8x32xf64>
    %7 = tensor.empty() : tensor<8x1xf64>
    %8 = linalg.fill ins(%cst_0 : f64) outs(%7 : tensor<8x1xf64>) -> tensor<8x1xf64>
    %9 = linalg.generic {indexing_maps = [#map, #map2], iterator_types = ["parallel", "reduction"]} ins(%6 : tensor<8x32xf64>) outs(%8 : tensor<8x1xf64>) {
    ^bb0(%in: f64, %out: f64):
      %25 = arith.addf %in, %out : f64
      linalg.yield %25 : f64
    } -> tensor<8x1xf64>
    %10 = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel"]} ins(%9 : tensor<8x1xf64>) outs(%7 : tensor<8x1xf64>) {
    ^bb0(%in: f64, %out: f64):
      %25 = arith.divf %in, %cst_2 : f64
      linalg.yield %25 : f64
    } -> tensor<8x1xf64>
    %11 = linalg.generic {indexing_maps = [#map, #map2, #map], iterator_types = ["parallel", "parallel"]} ins(%6, %10 : tensor<8x32xf64>, tensor<8x1xf64>) outs(%5 : tensor<8x32xf64>) {
    ^bb0(%in: f64, %in_4: f64, %out: f64):
      %25 = arith.subf %in, %in_4 : f64
      linalg.yield %25 : f64
    } -> tensor<8x32xf64>
    %12 = linalg.generic {indexing_maps = [#map, #map, #map], iterator_types = ["parallel", "parallel"]} ins(%11, %11 : tensor<8x32xf64>, tensor<8x32xf64>) outs(%5 : tensor<8x32xf64>) {
    ^bb0(%in: f64, %in_4: f64, %out: f64):
      %25 = arith.mulf %in, %in_4 : f64
      linalg.yield %25 : f64
    } -> tensor<8x32xf64>
    %13 = linalg.generic {indexing_maps = [#map, #map2], iterator_types = ["parallel", "reduction"]} ins(%12 : tensor<8x32xf64>) outs(%8 : tensor<8x1xf64>) {
    ^bb0(%in: f64, %out: f64):
      %25 = arith.addf %in, %out : f64
      linalg.yield %25 : f64
    } -> tensor<8x1xf64>
    %14 = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel"]} ins(%13 : tensor<8x1xf64>) outs(%7 : tensor<8x1xf64>) {
    ^bb0(%in: f64, %out: f64):
      %25 = arith.divf %in, %cst_2 : f64
      linalg.yield %25 : f64
    } -> tensor<8x1xf64>
    %15 = tensor.empty() : tensor<8x1xf32>
    %16 = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel"]} ins(%14 : tensor<8x1xf64>) outs(%15 : tensor<8x1xf32>) {
    ^bb0(%in: f64, %out: f32):
      %25 = arith.truncf %in : f64 to f32
      linalg.yield %25 : f32
    } -> tensor<8x1xf32>
    %17 = linalg.fill ins(%cst : f32) outs(%15 : tensor<8x1xf32>) -> tensor<8x1xf32>
    %18 = linalg.generic {indexing_maps = [#map, #map2], iterator_types = ["parallel", "reduction"]} ins(%4 : tensor<8x32xf32>) outs(%17 : tensor<8x1xf32>) {
    ^bb0(%in: f32, %out: f32):
      %25 = arith.addf %in, %out : f32
      linalg.yield %25 : f32
    } -> tensor<8x1xf32>
    %19 = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel"]} ins(%18 : tensor<8x1xf32>) outs(%15 : tensor<8x1xf32>) {
    ^bb0(%in: f32, %out: f32):
      %25 = arith.divf %in, %cst_3 : f32
      linalg.yield %25 : f32
    } -> tensor<8x1xf32>
    %20 = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel"]} ins(%16 : tensor<8x1xf32>) outs(%15 : tensor<8x1xf32>) {
    ^bb0(%in: f32, %out: f32):
      %25 = arith.truncf %cst_1 : f64 to f32
      %26 = arith.addf %in, %25 : f32
      linalg.yield %26 : f32
    } -> tensor<8x1xf32>
    %21 = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel"]} ins(%20 : tensor<8x1xf32>) outs(%15 : tensor<8x1xf32>) {
    ^bb0(%in: f32, %out: f32):
      %25 = math.rsqrt %in : f32
      linalg.yield %25 : f32
    } -> tensor<8x1xf32>
    %22 = linalg.generic {indexing_maps = [#map, #map2, #map], iterator_types = ["parallel", "parallel"]} ins(%4, %19 : tensor<8x32xf32>, tensor<8x1xf32>) outs(%1 : tensor<8x32xf32>) {
    ^bb0(%in: f32, %in_4: f32, %out: f32):
      %25 = arith.subf %in, %in_4 : f32
      linalg.yield %25 : f32
    } -> tensor<8x32xf32>
    %23 = linalg.generic {indexing_maps = [#map, #map2, #map], iterator_types = ["parallel", "parallel"]} ins(%22, %21 : tensor<8x32xf32>, tensor<8x1xf32>) outs(%1 : tensor<8x32xf32>) {
    ^bb0(%in: f32, %in_4: f32, %out: f32):
      %25 = arith.mulf %in, %in_4 : f32
      linalg.yield %25 : f32
    } -> tensor<8x32xf32>
    %extracted_slice = tensor.extract_slice %arg0[0, 0] [8, 32] [1, 1] : tensor<8x64xf32> to tensor<8x32xf32>
    %24 = linalg.generic {indexing_maps = [#map, #map, #map], iterator_types = ["parallel", "parallel"]} ins(%23, %extracted_slice : tensor<8x32xf32>, tensor<8x32xf32>) outs(%1 : tensor<8x32xf32>) {
    ^bb0(%in: f32, %in_4: f32, %out: f32):
      %25 = arith.addf %in, %in_4 : f32
      linalg.yield %25 : f32
    } -> tensor<8x32xf32>
    return %24 : tensor<8x32xf32>
  }
}
