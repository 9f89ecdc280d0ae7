// RUN: rm -rf %t && mkdir -p %t
// RUN: kforge-opt %s --kforge-pipeline="dir=%t/out" -o %t/outlined.mlir
// RUN: %python %S/../Inputs/dump_json.py %t/out/host_plan.json | FileCheck %s --check-prefix=PLAN
// RUN: FileCheck %s --check-prefix=IR < %t/outlined.mlir

// A fallback op (docs/fallback-ops.md) is a call of an external declaration that carries the
// aten op and its arguments. It stays outside every region; regions form around it, and the
// host plan records it as a `fallback` step with the declaration's argument list.

// PLAN: == host_plan.json
// PLAN: steps[0]: {"call":"{{[0-9a-f]+}}","operands":["arg0"],"results":["v0"]}
// PLAN-NEXT: steps[1]: {"args":[{"tensor":0},1,null],"name":"aten.cumsum","op":"fallback","operands":["v0"],"results":["v1"],"symbol":"kforge.fallback.aten.cumsum.0"}
// PLAN-NEXT: steps[2]: {"call":"{{[0-9a-f]+}}","operands":["v1"],"results":["v2"]}

// IR-LABEL: func.func @main
// IR: call @kforge_region_
// IR-NEXT: call @kforge.fallback.aten.cumsum.0
// IR-NEXT: call @kforge_region_
// IR: func.func private @kforge.fallback.aten.cumsum.0(tensor<4x8xf32>) -> tensor<4x8xf32> attributes {kforge.args = "[{\22tensor\22: 0}, 1, null]", kforge.fallback = "aten.cumsum"}

#map = affine_map<(d0, d1) -> (d0, d1)>
func.func @main(%x: tensor<4x8xf32>) -> tensor<4x8xf32> {
  %e = tensor.empty() : tensor<4x8xf32>
  %a = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel"]}
      ins(%x : tensor<4x8xf32>) outs(%e : tensor<4x8xf32>) {
  ^bb0(%in: f32, %out: f32):
    %t = math.tanh %in : f32
    linalg.yield %t : f32
  } -> tensor<4x8xf32>
  %c = call @kforge.fallback.aten.cumsum.0(%a) : (tensor<4x8xf32>) -> tensor<4x8xf32>
  %e2 = tensor.empty() : tensor<4x8xf32>
  %b = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel"]}
      ins(%c : tensor<4x8xf32>) outs(%e2 : tensor<4x8xf32>) {
  ^bb0(%in: f32, %out: f32):
    %t = math.exp %in : f32
    linalg.yield %t : f32
  } -> tensor<4x8xf32>
  return %b : tensor<4x8xf32>
}
func.func private @kforge.fallback.aten.cumsum.0(tensor<4x8xf32>) -> tensor<4x8xf32>
    attributes {kforge.fallback = "aten.cumsum", kforge.args = "[{\"tensor\": 0}, 1, null]"}
