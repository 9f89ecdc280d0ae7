// A torch-mlir export (torch 2.13, torch-mlir 20261001, linalg-on-tensors; weights as
// arguments marked kforge.weight): nn.Linear + Mish + clamp: one region.
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
// CHECK-DAG: kforge.fused = {{\[}}"matmul", "bias", "exp", "log1p", "cmpf", "select", "tanh", "mul", "clamp"{{\]}}, kforge.hash = "{{[0-9a-f]+}}", kforge.min_bytes = {{[0-9]+}} : i64, kforge.root_kind = "contraction"

#map = affine_map<(d0, d1) -> (d0, d1)>
#map1 = affine_map<(d0, d1) -> (d1)>
module {
  func.func @main(%arg0: tensor<8x64xf32>, %arg1: tensor<32x64xf32> {kforge.weight = "fc.weight"}, %arg2: tensor<32xf32> {kforge.weight = "fc.bias"}) -> tensor<8x32xf32> {
    %cst = arith.constant 0.000000e+00 : f32
    %cst_0 = arith.constant 2.000000e+01 : f32
    %cst_1 = arith.constant -1.000000e+00 : f32
    %cst_2 = arith.constant 1.000000e+00 : f32
    %0 = tensor.empty() : tensor<64x32xf32>
    %transposed = linalg.transpose ins(%arg1 : tensor<32x64xf32>) outs(%0 : tensor<64x32xf32>) permutation = [1, 0] 
    %1 = tensor.empty() : tensor<8x32xf32>
    %2 = linalg.fill ins(%cst : f32) outs(%1 : tensor<8x32xf32>) -> tensor<8x32xf32>
    %3 = linalg.matmul ins(%arg0, %transposed : tensor<8x64xf32>, tensor<64x32xf32>) outs(%2 : tensor<8x32xf32>) -> tensor<8x32xf32>
    %4 = linalg.generic {indexing_maps = [#map, #map1, #map], iterator_types = ["parallel", "parallel"]} ins(%3, %arg2 : tensor<8x32xf32>, tensor<32xf32>) outs(%1 : tensor<8x32xf32>) {
    ^bb0(%in: f32, %in_3: f32, %out: f32):
      %13 = arith.addf %in, %in_3 : f32
      linalg.yield %13 : f32
    } -> tensor<8x32xf32>
    %5 = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel"]} ins(%4 : tensor<8x32xf32>) outs(%1 : tensor<8x32xf32>) {
    ^bb0(%in: f32, %out: f32):
      %13 = math.exp %in : f32
      linalg.yield %13 : f32
    } -> tensor<8x32xf32>
    %6 = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel"]} ins(%5 : tensor<8x32xf32>) outs(%1 : tensor<8x32xf32>) {
    ^bb0(%in: f32, %out: f32):
      %13 = math.log1p %in : f32
      linalg.yield %13 : f32
    } -> tensor<8x32xf32>
    %7 = tensor.empty() : tensor<8x32xi1>
    %8 = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel"]} ins(%4 : tensor<8x32xf32>) outs(%7 : tensor<8x32xi1>) {
    ^bb0(%in: f32, %out: i1):
      %13 = arith.cmpf ogt, %in, %cst_0 : f32
      linalg.yield %13 : i1
    } -> tensor<8x32xi1>
    %9 = linalg.generic {indexing_maps = [#map, #map, #map, #map], iterator_types = ["parallel", "parallel"]} ins(%8, %4, %6 : tensor<8x32xi1>, tensor<8x32xf32>, tensor<8x32xf32>) outs(%1 : tensor<8x32xf32>) {
    ^bb0(%in: i1, %in_3: f32, %in_4: f32, %out: f32):
      %13 = arith.select %in, %in_3, %in_4 : f32
      linalg.yield %13 : f32
    } -> tensor<8x32xf32>
    %10 = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel"]} ins(%9 : tensor<8x32xf32>) outs(%1 : tensor<8x32xf32>) {
    ^bb0(%in: f32, %out: f32):
      %13 = math.tanh %in : f32
      linalg.yield %13 : f32
    } -> tensor<8x32xf32>
    %11 = linalg.generic {indexing_maps = [#map, #map, #map], iterator_types = ["parallel", "parallel"]} ins(%4, %10 : tensor<8x32xf32>, tensor<8x32xf32>) outs(%1 : tensor<8x32xf32>) {
    ^bb0(%in: f32, %in_3: f32, %out: f32):
      %13 = arith.mulf %in, %in_3 : f32
      linalg.yield %13 : f32
    } -> tensor<8x32xf32>
    %12 = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel"]} ins(%11 : tensor<8x32xf32>) outs(%1 : tensor<8x32xf32>) {
    ^bb0(%in: f32, %out: f32):
      %13 = arith.cmpf ult, %in, %cst_1 : f32
      %14 = arith.select %13, %cst_1, %in : f32
      %15 = arith.cmpf ugt, %14, %cst_2 : f32
      %16 = arith.select %15, %cst_2, %14 : f32
      linalg.yield %16 : f32
    } -> tensor<8x32xf32>
    return %12 : tensor<8x32xf32>
  }
}

