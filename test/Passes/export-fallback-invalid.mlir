// RUN: rm -rf %t && mkdir -p %t
// RUN: not kforge-opt %s --kforge-pipeline="dir=%t/out" 2>&1 | FileCheck %s

// A fallback declaration whose argument list is not JSON is a located error, not a crash.
// CHECK: error: kforge-export-regions: kforge.args is not valid JSON

func.func @main(%x: tensor<4x8xf32>) -> tensor<4x8xf32> {
  %c = call @kforge.fallback.aten.cumsum.0(%x) : (tensor<4x8xf32>) -> tensor<4x8xf32>
  return %c : tensor<4x8xf32>
}
func.func private @kforge.fallback.aten.cumsum.0(tensor<4x8xf32>) -> tensor<4x8xf32>
    attributes {kforge.fallback = "aten.cumsum", kforge.args = "[{tensor: 0"}
