// A torch-mlir export (torch 2.13, torch-mlir 20261001, linalg-on-tensors; weights as
// arguments marked kforge.weight): GEMM + logsumexp, mean and max over rows: one region.
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
// CHECK-DAG: kforge.fused = {{\[}}"matmul", "reduce_max", "absf", "extf_cmpf", "select", "sub", "exp", "reduce_sum", "log", "add", "reduce_sum", "div"{{\]}}, kforge.hash = "{{[0-9a-f]+}}", kforge.min_bytes = {{[0-9]+}} : i64, kforge.root_kind = "contraction"

#map = affine_map<(d0, d1) -> (d0, d1)>
#map1 = affine_map<(d0, d1) -> (d0)>
#map2 = affine_map<(d0, d1) -> ()>
#map3 = affine_map<(d0, d1) -> (d0, 0)>
#map4 = affine_map<(d0) -> (d0)>
module {
  func.func @main(%arg0: tensor<8x64xf32>, %arg1: tensor<64x32xf32> {kforge.weight = "w"}) -> (tensor<8xf32>, tensor<8xf32>, tensor<8xf32>) {
    %cst = arith.constant 0.000000e+00 : f32
    %c0_i64 = arith.constant 0 : i64
    %cst_0 = arith.constant 0xFF800000 : f32
    %cst_1 = arith.constant dense<0.000000e+00> : tensor<f32>
    %cst_2 = arith.constant 0x7FF0000000000000 : f64
    %cst_3 = arith.constant 3.200000e+01 : f32
    %0 = tensor.empty() : tensor<8x32xf32>
    %1 = linalg.fill ins(%cst : f32) outs(%0 : tensor<8x32xf32>) -> tensor<8x32xf32>
    %2 = linalg.matmul ins(%arg0, %arg1 : tensor<8x64xf32>, tensor<64x32xf32>) outs(%1 : tensor<8x32xf32>) -> tensor<8x32xf32>
    %3 = tensor.empty() : tensor<8xi64>
    %4 = linalg.fill ins(%c0_i64 : i64) outs(%3 : tensor<8xi64>) -> tensor<8xi64>
    %5 = tensor.empty() : tensor<8xf32>
    %6 = linalg.fill ins(%cst_0 : f32) outs(%5 : tensor<8xf32>) -> tensor<8xf32>
    %7:2 = linalg.generic {indexing_maps = [#map, #map1, #map1], iterator_types = ["parallel", "reduction"]} ins(%2 : tensor<8x32xf32>) outs(%6, %4 : tensor<8xf32>, tensor<8xi64>) {
    ^bb0(%in: f32, %out: f32, %out_4: i64):
      %21 = linalg.index 1 : index
      %22 = arith.index_cast %21 : index to i64
      %23 = arith.maximumf %in, %out : f32
      %24 = arith.cmpf ogt, %in, %out : f32
      %25 = arith.select %24, %22, %out_4 : i64
      linalg.yield %23, %25 : f32, i64
    } -> (tensor<8xf32>, tensor<8xi64>)
    %expanded = tensor.expand_shape %7#0 [[0, 1]] output_shape [8, 1] : tensor<8xf32> into tensor<8x1xf32>
    %8 = tensor.empty() : tensor<8x1xf32>
    %9 = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel"]} ins(%expanded : tensor<8x1xf32>) outs(%8 : tensor<8x1xf32>) {
    ^bb0(%in: f32, %out: f32):
      %21 = math.absf %in : f32
      linalg.yield %21 : f32
    } -> tensor<8x1xf32>
    %10 = tensor.empty() : tensor<8x1xi1>
    %11 = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel"]} ins(%9 : tensor<8x1xf32>) outs(%10 : tensor<8x1xi1>) {
    ^bb0(%in: f32, %out: i1):
      %21 = arith.extf %in : f32 to f64
      %22 = arith.cmpf oeq, %21, %cst_2 : f64
      linalg.yield %22 : i1
    } -> tensor<8x1xi1>
    %12 = linalg.generic {indexing_maps = [#map, #map2, #map, #map], iterator_types = ["parallel", "parallel"]} ins(%11, %cst_1, %expanded : tensor<8x1xi1>, tensor<f32>, tensor<8x1xf32>) outs(%8 : tensor<8x1xf32>) {
    ^bb0(%in: i1, %in_4: f32, %in_5: f32, %out: f32):
      %21 = arith.select %in, %in_4, %in_5 : f32
      linalg.yield %21 : f32
    } -> tensor<8x1xf32>
    %collapsed = tensor.collapse_shape %12 [[0, 1]] : tensor<8x1xf32> into tensor<8xf32>
    %13 = linalg.generic {indexing_maps = [#map, #map3, #map], iterator_types = ["parallel", "parallel"]} ins(%2, %12 : tensor<8x32xf32>, tensor<8x1xf32>) outs(%0 : tensor<8x32xf32>) {
    ^bb0(%in: f32, %in_4: f32, %out: f32):
      %21 = arith.subf %in, %in_4 : f32
      linalg.yield %21 : f32
    } -> tensor<8x32xf32>
    %14 = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel"]} ins(%13 : tensor<8x32xf32>) outs(%0 : tensor<8x32xf32>) {
    ^bb0(%in: f32, %out: f32):
      %21 = math.exp %in : f32
      linalg.yield %21 : f32
    } -> tensor<8x32xf32>
    %15 = linalg.fill ins(%cst : f32) outs(%5 : tensor<8xf32>) -> tensor<8xf32>
    %16 = linalg.generic {indexing_maps = [#map, #map1], iterator_types = ["parallel", "reduction"]} ins(%14 : tensor<8x32xf32>) outs(%15 : tensor<8xf32>) {
    ^bb0(%in: f32, %out: f32):
      %21 = arith.addf %in, %out : f32
      linalg.yield %21 : f32
    } -> tensor<8xf32>
    %17 = linalg.generic {indexing_maps = [#map4, #map4], iterator_types = ["parallel"]} ins(%16 : tensor<8xf32>) outs(%5 : tensor<8xf32>) {
    ^bb0(%in: f32, %out: f32):
      %21 = math.log %in : f32
      linalg.yield %21 : f32
    } -> tensor<8xf32>
    %18 = linalg.generic {indexing_maps = [#map4, #map4, #map4], iterator_types = ["parallel"]} ins(%17, %collapsed : tensor<8xf32>, tensor<8xf32>) outs(%5 : tensor<8xf32>) {
    ^bb0(%in: f32, %in_4: f32, %out: f32):
      %21 = arith.addf %in, %in_4 : f32
      linalg.yield %21 : f32
    } -> tensor<8xf32>
    %19 = linalg.generic {indexing_maps = [#map, #map1], iterator_types = ["parallel", "reduction"]} ins(%2 : tensor<8x32xf32>) outs(%15 : tensor<8xf32>) {
    ^bb0(%in: f32, %out: f32):
      %21 = arith.addf %in, %out : f32
      linalg.yield %21 : f32
    } -> tensor<8xf32>
    %20 = linalg.generic {indexing_maps = [#map4, #map4], iterator_types = ["parallel"]} ins(%19 : tensor<8xf32>) outs(%5 : tensor<8xf32>) {
    ^bb0(%in: f32, %out: f32):
      %21 = arith.divf %in, %cst_3 : f32
      linalg.yield %21 : f32
    } -> tensor<8xf32>
    return %18, %20, %7#0 : tensor<8xf32>, tensor<8xf32>, tensor<8xf32>
  }
}

