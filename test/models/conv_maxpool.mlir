// A torch-mlir export (torch 2.13, torch-mlir 20261001, linalg-on-tensors; weights as
// arguments marked kforge.weight): Conv2d + 2x2 max pooling: one region.
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
// CHECK-DAG: kforge.fused = {{\[}}"conv", "reduce_max"{{\]}}, kforge.hash = "{{[0-9a-f]+}}", kforge.min_bytes = {{[0-9]+}} : i64, kforge.root_kind = "convolution"

module {
  func.func @main(%arg0: tensor<1x3x16x16xf32>, %arg1: tensor<8x3x3x3xf32> {kforge.weight = "conv.weight"}) -> tensor<1x8x7x7xf32> {
    %cst = arith.constant 0.000000e+00 : f32
    %cst_0 = arith.constant 0xFF800000 : f32
    %0 = tensor.empty() : tensor<1x8x14x14xf32>
    %1 = linalg.fill ins(%cst : f32) outs(%0 : tensor<1x8x14x14xf32>) -> tensor<1x8x14x14xf32>
    %2 = linalg.conv_2d_nchw_fchw {dilations = dense<1> : vector<2xi64>, strides = dense<1> : vector<2xi64>} ins(%arg0, %arg1 : tensor<1x3x16x16xf32>, tensor<8x3x3x3xf32>) outs(%1 : tensor<1x8x14x14xf32>) -> tensor<1x8x14x14xf32>
    %3 = tensor.empty() : tensor<1x8x7x7xf32>
    %4 = linalg.fill ins(%cst_0 : f32) outs(%3 : tensor<1x8x7x7xf32>) -> tensor<1x8x7x7xf32>
    %5 = tensor.empty() : tensor<2x2xf32>
    %6 = linalg.pooling_nchw_max {dilations = dense<1> : vector<2xi64>, strides = dense<2> : vector<2xi64>} ins(%2, %5 : tensor<1x8x14x14xf32>, tensor<2x2xf32>) outs(%4 : tensor<1x8x7x7xf32>) -> tensor<1x8x7x7xf32>
    return %6 : tensor<1x8x7x7xf32>
  }
}

