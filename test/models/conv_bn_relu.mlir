// A torch-mlir export (torch 2.13, torch-mlir 20261001, linalg-on-tensors; weights as
// arguments marked kforge.weight): Conv2d + inference BatchNorm + ReLU: one convolution region; the
// folded BN scale (computed from parameters only) is recomputed inside.
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
// CHECK-DAG: kforge.fused = {{\[}}"conv", "sub", "scale", "scale", "bias", "relu"{{\]}}, kforge.hash = "{{[0-9a-f]+}}", kforge.min_bytes = {{[0-9]+}} : i64, kforge.root_kind = "convolution"

#map = affine_map<(d0) -> (d0)>
#map1 = affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>
#map2 = affine_map<(d0, d1, d2, d3) -> (d1, 0, 0)>
module {
  func.func @main(%arg0: tensor<1x3x16x16xf32>, %arg1: tensor<8x3x3x3xf32> {kforge.weight = "conv.weight"}, %arg2: tensor<8xf32> {kforge.weight = "conv.bias"}, %arg3: tensor<8xf32> {kforge.weight = "bn.running_mean"}, %arg4: tensor<8xf32> {kforge.weight = "bn.running_var"}, %arg5: tensor<8xf32> {kforge.weight = "bn.weight"}, %arg6: tensor<8xf32> {kforge.weight = "bn.bias"}) -> tensor<1x8x14x14xf32> {
    %cst = arith.constant 0.000000e+00 : f32
    %cst_0 = arith.constant 1.000000e+00 : f32
    %cst_1 = arith.constant 1.000000e-05 : f64
    %0 = tensor.empty() : tensor<1x8x14x14xf32>
    %broadcasted = linalg.broadcast ins(%arg2 : tensor<8xf32>) outs(%0 : tensor<1x8x14x14xf32>) dimensions = [0, 2, 3] 
    %1 = linalg.conv_2d_nchw_fchw {dilations = dense<1> : vector<2xi64>, strides = dense<1> : vector<2xi64>} ins(%arg0, %arg1 : tensor<1x3x16x16xf32>, tensor<8x3x3x3xf32>) outs(%broadcasted : tensor<1x8x14x14xf32>) -> tensor<1x8x14x14xf32>
    %2 = tensor.empty() : tensor<8xf32>
    %3 = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel"]} ins(%arg4 : tensor<8xf32>) outs(%2 : tensor<8xf32>) {
    ^bb0(%in: f32, %out: f32):
      %11 = arith.truncf %cst_1 : f64 to f32
      %12 = arith.addf %in, %11 : f32
      linalg.yield %12 : f32
    } -> tensor<8xf32>
    %4 = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel"]} ins(%3 : tensor<8xf32>) outs(%2 : tensor<8xf32>) {
    ^bb0(%in: f32, %out: f32):
      %11 = math.sqrt %in : f32
      linalg.yield %11 : f32
    } -> tensor<8xf32>
    %5 = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel"]} ins(%4 : tensor<8xf32>) outs(%2 : tensor<8xf32>) {
    ^bb0(%in: f32, %out: f32):
      %11 = arith.cmpf one, %in, %cst : f32
      cf.assert %11, "unimplemented: tensor with zero element"
      %12 = arith.divf %cst_0, %in : f32
      linalg.yield %12 : f32
    } -> tensor<8xf32>
    %expanded = tensor.expand_shape %arg3 [[0, 1, 2]] output_shape [8, 1, 1] : tensor<8xf32> into tensor<8x1x1xf32>
    %expanded_2 = tensor.expand_shape %5 [[0, 1, 2]] output_shape [8, 1, 1] : tensor<8xf32> into tensor<8x1x1xf32>
    %6 = linalg.generic {indexing_maps = [#map1, #map2, #map1], iterator_types = ["parallel", "parallel", "parallel", "parallel"]} ins(%1, %expanded : tensor<1x8x14x14xf32>, tensor<8x1x1xf32>) outs(%0 : tensor<1x8x14x14xf32>) {
    ^bb0(%in: f32, %in_5: f32, %out: f32):
      %11 = arith.subf %in, %in_5 : f32
      linalg.yield %11 : f32
    } -> tensor<1x8x14x14xf32>
    %7 = linalg.generic {indexing_maps = [#map1, #map2, #map1], iterator_types = ["parallel", "parallel", "parallel", "parallel"]} ins(%6, %expanded_2 : tensor<1x8x14x14xf32>, tensor<8x1x1xf32>) outs(%0 : tensor<1x8x14x14xf32>) {
    ^bb0(%in: f32, %in_5: f32, %out: f32):
      %11 = arith.mulf %in, %in_5 : f32
      linalg.yield %11 : f32
    } -> tensor<1x8x14x14xf32>
    %expanded_3 = tensor.expand_shape %arg5 [[0, 1, 2]] output_shape [8, 1, 1] : tensor<8xf32> into tensor<8x1x1xf32>
    %8 = linalg.generic {indexing_maps = [#map1, #map2, #map1], iterator_types = ["parallel", "parallel", "parallel", "parallel"]} ins(%7, %expanded_3 : tensor<1x8x14x14xf32>, tensor<8x1x1xf32>) outs(%0 : tensor<1x8x14x14xf32>) {
    ^bb0(%in: f32, %in_5: f32, %out: f32):
      %11 = arith.mulf %in, %in_5 : f32
      linalg.yield %11 : f32
    } -> tensor<1x8x14x14xf32>
    %expanded_4 = tensor.expand_shape %arg6 [[0, 1, 2]] output_shape [8, 1, 1] : tensor<8xf32> into tensor<8x1x1xf32>
    %9 = linalg.generic {indexing_maps = [#map1, #map2, #map1], iterator_types = ["parallel", "parallel", "parallel", "parallel"]} ins(%8, %expanded_4 : tensor<1x8x14x14xf32>, tensor<8x1x1xf32>) outs(%0 : tensor<1x8x14x14xf32>) {
    ^bb0(%in: f32, %in_5: f32, %out: f32):
      %11 = arith.addf %in, %in_5 : f32
      linalg.yield %11 : f32
    } -> tensor<1x8x14x14xf32>
    %10 = linalg.generic {indexing_maps = [#map1, #map1], iterator_types = ["parallel", "parallel", "parallel", "parallel"]} ins(%9 : tensor<1x8x14x14xf32>) outs(%0 : tensor<1x8x14x14xf32>) {
    ^bb0(%in: f32, %out: f32):
      %11 = arith.cmpf ugt, %in, %cst : f32
      %12 = arith.select %11, %in, %cst : f32
      linalg.yield %12 : f32
    } -> tensor<1x8x14x14xf32>
    return %10 : tensor<1x8x14x14xf32>
  }
}

