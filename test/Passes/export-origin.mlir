// RUN: rm -rf %t && mkdir -p %t
// RUN: kforge-opt %s --kforge-pipeline="dir=%t/out" -o %t/outlined.mlir
// RUN: %python %S/../Inputs/dump_json.py %t/out/host_plan.json | FileCheck %s --check-prefix=PLAN
// RUN: FileCheck %s --check-prefix=IR < %t/outlined.mlir

// Provenance (kforge.aten_regions): the frontend names each op's location after its FX node,
// loc("fx:<node>"(...)). Each region call records the nodes of its own call site, and the node
// behind every operand and result. The two tanh-then-scale chains below form one region (equal
// bodies, one outlined function with the first site's locations); the second call still names
// its own nodes, and its operand is the first call's result, named by that call's record.

// PLAN: == host_plan.json
// PLAN: steps[0]: {"call":"[[H:[0-9a-f]+]]","operands":["arg0"],"origin":{"nodes":["tanh","mul"],"operands":[null],"results":["mul"]},"results":["v0"]}
// PLAN-NEXT: steps[1]: {"args":[{"tensor":0},1,null],"name":"aten.cumsum","op":"fallback","operands":["v0"],"results":["v1"],"symbol":"kforge.fallback.aten.cumsum.0"}
// PLAN-NEXT: steps[2]: {"call":"[[H]]","operands":["v1"],"origin":{"nodes":["tanh_1","mul_1"],"operands":["cumsum"],"results":["mul_1"]},"results":["v2"]}

// IR-LABEL: func.func @main
// IR: call @kforge_region_{{.*}} {kforge.origin = {nodes = ["tanh", "mul"], results = ["mul"]}}
// IR: call @kforge_region_{{.*}} {kforge.origin = {nodes = ["tanh_1", "mul_1"], results = ["mul_1"]}}

#map = affine_map<(d0, d1) -> (d0, d1)>
func.func @main(%x: tensor<4x8xf32>) -> tensor<4x8xf32> {
  %two = arith.constant 2.0 : f32
  %e = tensor.empty() : tensor<4x8xf32>
  %a = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel"]}
      ins(%x : tensor<4x8xf32>) outs(%e : tensor<4x8xf32>) {
  ^bb0(%in: f32, %out: f32):
    %t = math.tanh %in : f32
    linalg.yield %t : f32
  } -> tensor<4x8xf32> loc("fx:tanh"("model.py":3:0))
  %b = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel"]}
      ins(%a : tensor<4x8xf32>) outs(%e : tensor<4x8xf32>) {
  ^bb0(%in: f32, %out: f32):
    %t = arith.mulf %in, %two : f32
    linalg.yield %t : f32
  } -> tensor<4x8xf32> loc("fx:mul"("model.py":4:0))
  %c = call @kforge.fallback.aten.cumsum.0(%b) : (tensor<4x8xf32>) -> tensor<4x8xf32> loc("fx:cumsum")
  %e2 = tensor.empty() : tensor<4x8xf32>
  %d = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel"]}
      ins(%c : tensor<4x8xf32>) outs(%e2 : tensor<4x8xf32>) {
  ^bb0(%in: f32, %out: f32):
    %t = math.tanh %in : f32
    linalg.yield %t : f32
  } -> tensor<4x8xf32> loc("fx:tanh_1"("model.py":6:0))
  %f = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel"]}
      ins(%d : tensor<4x8xf32>) outs(%e2 : tensor<4x8xf32>) {
  ^bb0(%in: f32, %out: f32):
    %t = arith.mulf %in, %two : f32
    linalg.yield %t : f32
  } -> tensor<4x8xf32> loc("fx:mul_1"("model.py":7:0))
  return %f : tensor<4x8xf32>
}
func.func private @kforge.fallback.aten.cumsum.0(tensor<4x8xf32>) -> tensor<4x8xf32> attributes {kforge.args = "[{\22tensor\22: 0}, 1, null]", kforge.fallback = "aten.cumsum"}
