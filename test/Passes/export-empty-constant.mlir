// RUN: rm -rf %t && mkdir -p %t
// RUN: kforge-opt %s --kforge-pipeline="dir=%t/out" -o %t/outlined.mlir
// RUN: %python %S/../Inputs/dump_json.py %t/out/host_plan.json | FileCheck %s

// An empty tensor constant (transformers' DynamicCache starts each layer from one; torch-mlir
// writes it as a resource blob) is a host-plan constant with no data, not an opaque step.

// CHECK: steps[0]: {"data":[],"name":"arith.constant","op":"constant","operands":[],"results":["v0"]}
// CHECK-NEXT: steps[1]: {"args":{{.*}}"name":"aten.cat","op":"fallback","operands":["v0","arg0"],"results":["v1"]

func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {
  %e = arith.constant dense_resource<empty> : tensor<0xf32>
  %c = call @kforge.fallback.aten.cat.0(%e, %x) : (tensor<0xf32>, tensor<4xf32>) -> tensor<4xf32>
  return %c : tensor<4xf32>
}
func.func private @kforge.fallback.aten.cat.0(tensor<0xf32>, tensor<4xf32>) -> tensor<4xf32> attributes {kforge.args = "[[{\22tensor\22: 0}, {\22tensor\22: 1}], 0]", kforge.fallback = "aten.cat"}

{-#
  dialect_resources: {
    builtin: {
      empty: "0x04000000"
    }
  }
#-}
