// RUN: rm -rf %t && mkdir -p %t
// RUN: kforge-opt %s --kforge-pipeline="dir=%t/out" -o %t/outlined.mlir
// RUN: %python %S/../Inputs/dump_json.py %t/out/host_plan.json | FileCheck %s --check-prefix=PLAN
// RUN: %python %S/../Inputs/dump_json.py %t/out/*.json | FileCheck %s --check-prefix=SPEC
// The region's own file parses and verifies alone.
// RUN: kforge-opt %t/out/*.mlir | FileCheck %s --check-prefix=MLIR
// Exporting changes nothing in the IR.
// RUN: kforge-opt %s --kforge-pipeline | diff - %t/outlined.mlir

// A dynamic batch, a weight, a bias and a GELU epilogue whose body captures constants from
// outside (as torch-mlir writes it).

// PLAN: == host_plan.json
// PLAN-NEXT: function: "main"
// PLAN-NEXT: inputs[0]: {"dtype":"f32","name":"arg0","shape":[null,64],"weight":null}
// PLAN-NEXT: inputs[1]: {"dtype":"f32","name":"arg1","shape":[32,64],"weight":"fc.weight"}
// PLAN-NEXT: inputs[2]: {"dtype":"f32","name":"arg2","shape":[32],"weight":"fc.bias"}
// PLAN-NEXT: outputs: ["v0"]
// PLAN-NEXT: schema: "kforge.host-plan"
// The call passes arguments in the region's own (canonical) order.
// PLAN-NEXT: steps[0]: {"call":"{{[0-9a-f]+}}","operands":["arg0","arg2","arg1"],"results":["v0"]}
// PLAN-NEXT: values[0]: {"dtype":"f32","name":"v0","shape":[null,32]}
// PLAN-NEXT: version: 1

// SPEC: == [[H:[0-9a-f]{16}]].json
// SPEC-NEXT: args[0]: {"dtype":"f32","name":"arg0","shape":[null,64],"weight":null}
// SPEC-NEXT: args[1]: {"dtype":"f32","name":"arg1","shape":[32],"weight":"fc.bias"}
// SPEC-NEXT: args[2]: {"dtype":"f32","name":"arg2","shape":[32,64],"weight":"fc.weight"}
// Dynamic dimensions count as 1: 2*1*32*64 (matmul) + 1*32 (bias) + 5*1*32 (gelu).
// SPEC-NEXT: flops: 4288
// SPEC-NEXT: fused: ["matmul","bias","gelu"]
// SPEC-NEXT: hash: "[[H]]"
// 4 * (1*64 + 32 + 32*64 + 1*32)
// SPEC-NEXT: min_bytes: 8704
// SPEC-NEXT: name: "kforge_region_[[H]]"
// SPEC-NEXT: ops[0]: {"name":"tensor.empty","op":"empty","operands":[],"results":["v0"]}
// The weight transpose is recomputed inside, from the weight.
// SPEC-NEXT: ops[1]: {"body":{"args":["a0","a1"],"stmts":[],"yields":["a0"]},"indexing_maps":[{"num_dims":2,"results":[{"d":1},{"d":0}],"text":"(d0, d1) -> (d1, d0)"},{"num_dims":2,"results":[{"d":0},{"d":1}],"text":"(d0, d1) -> (d0, d1)"}],"iterator_types":["parallel","parallel"],"kind":"elementwise","label":"transpose","name":"linalg.generic","num_inputs":1,"op":"generic","operands":["arg2","v0"],"results":["v1"]}
// The dynamic size of the accumulator comes from dimension 0 of arg0.
// SPEC-NEXT: ops[2]: {"dynamic_sizes_from":{{\[\["arg0",0\]\]}},"name":"tensor.empty","op":"empty","operands":[],"results":["v2"]}
// A scalar constant gets its record where it is read: by the fill, a zero-result map.
// SPEC-NEXT: ops[3]: {"name":"arith.constant","op":"constant","operands":[],"results":["v3"],"splat":0}
// SPEC-NEXT: ops[4]: {"body":{"args":["a0","a1"],"stmts":[],"yields":["a0"]},"indexing_maps":[{"num_dims":2,"results":[],"text":"(d0, d1) -> ()"},{"num_dims":2,"results":[{"d":0},{"d":1}],"text":"(d0, d1) -> (d0, d1)"}],"iterator_types":["parallel","parallel"],"kind":"elementwise","label":"fill","name":"linalg.generic","num_inputs":1,"op":"generic","operands":["v3","v2"],"results":["v4"]}
// SPEC-NEXT: ops[5]: {"body":{"args":["a0","a1","a2"],"stmts":[{"id":"t0","op":"arith.mulf","operands":["a0","a1"],"type":"f32"},{"id":"t1","op":"arith.addf","operands":["a2","t0"],"type":"f32"}],"yields":["t1"]},"indexing_maps":[{"num_dims":3,"results":[{"d":0},{"d":2}],"text":"(d0, d1, d2) -> (d0, d2)"},{"num_dims":3,"results":[{"d":2},{"d":1}],"text":"(d0, d1, d2) -> (d2, d1)"},{"num_dims":3,"results":[{"d":0},{"d":1}],"text":"(d0, d1, d2) -> (d0, d1)"}],"iterator_types":["parallel","parallel","reduction"],"kind":"contraction","label":"matmul","name":"linalg.generic","num_inputs":2,"op":"generic","operands":["arg0","v1","v4"],"results":["v5"]}
// SPEC-NEXT: ops[6]: {"body":{"args":["a0","a1","a2"],"stmts":[{"id":"t0","op":"arith.addf","operands":["a0","a1"],"type":"f32"}],"yields":["t0"]},"indexing_maps":[{"num_dims":2,"results":[{"d":0},{"d":1}],"text":"(d0, d1) -> (d0, d1)"},{"num_dims":2,"results":[{"d":1}],"text":"(d0, d1) -> (d1)"},{"num_dims":2,"results":[{"d":0},{"d":1}],"text":"(d0, d1) -> (d0, d1)"}],"iterator_types":["parallel","parallel"],"kind":"elementwise","label":"bias","name":"linalg.generic","num_inputs":2,"op":"generic","operands":["v5","arg1","v2"],"results":["v6"]}
// Constants the body captures from outside become constant statements of the body.
// SPEC-NEXT: ops[7]: {"body":{"args":["a0","a1"],"stmts":[{"id":"c0","op":"arith.constant","operands":[],"type":"f32","value":1.4142135381698608},{"id":"t0","op":"arith.divf","operands":["a0","c0"],"type":"f32"},{"id":"t1","op":"math.erf","operands":["t0"],"type":"f32"},{"id":"c1","op":"arith.constant","operands":[],"type":"f32","value":1},{"id":"t2","op":"arith.addf","operands":["t1","c1"],"type":"f32"},{"id":"c2","op":"arith.constant","operands":[],"type":"f32","value":0.5},{"id":"t3","op":"arith.mulf","operands":["t2","c2"],"type":"f32"},{"id":"t4","op":"arith.mulf","operands":["a0","t3"],"type":"f32"}],"yields":["t4"]},{{.*}}"label":"gelu","name":"linalg.generic","num_inputs":1,"op":"generic","operands":["v6","v2"],"results":["v7"]}
// SPEC-NEXT: results: ["v7"]
// SPEC-NEXT: root_kind: "contraction"
// SPEC-NEXT: schema: "kforge.kernel-spec"
// SPEC-NEXT: values[0]: {"dtype":"f32","name":"v0","shape":[64,32]}
// SPEC-NEXT: values[1]: {"dtype":"f32","name":"v1","shape":[64,32]}
// SPEC-NEXT: values[2]: {"dtype":"f32","name":"v2","shape":[null,32]}
// SPEC-NEXT: values[3]: {"dtype":"f32","name":"v3","shape":[]}
// SPEC-NEXT: values[4]: {"dtype":"f32","name":"v4","shape":[null,32]}
// SPEC: values[7]: {"dtype":"f32","name":"v7","shape":[null,32]}
// SPEC-NEXT: version: 1
// SPEC-NEXT: == host_plan.json

// MLIR: func.func private @kforge_region_{{[0-9a-f]+}}(%arg0: tensor<?x64xf32>, %arg1: tensor<32xf32> {kforge.weight = "fc.bias"}, %arg2: tensor<32x64xf32> {kforge.weight = "fc.weight"}) -> tensor<?x32xf32>
// MLIR-SAME: kforge.hash
#map = affine_map<(d0, d1) -> (d0, d1)>
#map1 = affine_map<(d0, d1) -> (d1)>
module {
  func.func @main(%arg0: tensor<?x64xf32>, %arg1: tensor<32x64xf32> {kforge.weight = "fc.weight"}, %arg2: tensor<32xf32> {kforge.weight = "fc.bias"}) -> tensor<?x32xf32> {
    %c0 = arith.constant 0 : index
    %cst = arith.constant 0.000000e+00 : f32
    %cst_0 = arith.constant 1.000000e+00 : f32
    %cst_1 = arith.constant 5.000000e-01 : f32
    %cst_4 = arith.constant 1.41421354 : f32
    %0 = tensor.empty() : tensor<64x32xf32>
    %transposed = linalg.transpose ins(%arg1 : tensor<32x64xf32>) outs(%0 : tensor<64x32xf32>) permutation = [1, 0]
    %dim = tensor.dim %arg0, %c0 : tensor<?x64xf32>
    %1 = tensor.empty(%dim) : tensor<?x32xf32>
    %2 = linalg.fill ins(%cst : f32) outs(%1 : tensor<?x32xf32>) -> tensor<?x32xf32>
    %3 = linalg.matmul ins(%arg0, %transposed : tensor<?x64xf32>, tensor<64x32xf32>) outs(%2 : tensor<?x32xf32>) -> tensor<?x32xf32>
    %4 = linalg.generic {indexing_maps = [#map, #map1, #map], iterator_types = ["parallel", "parallel"]} ins(%3, %arg2 : tensor<?x32xf32>, tensor<32xf32>) outs(%1 : tensor<?x32xf32>) {
    ^bb0(%in: f32, %in_5: f32, %out: f32):
      %6 = arith.addf %in, %in_5 : f32
      linalg.yield %6 : f32
    } -> tensor<?x32xf32>
    %5 = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel"]} ins(%4 : tensor<?x32xf32>) outs(%1 : tensor<?x32xf32>) {
    ^bb0(%in: f32, %out: f32):
      %6 = arith.divf %in, %cst_4 : f32
      %7 = math.erf %6 : f32
      %8 = arith.addf %7, %cst_0 : f32
      %9 = arith.mulf %8, %cst_1 : f32
      %10 = arith.mulf %in, %9 : f32
      linalg.yield %10 : f32
    } -> tensor<?x32xf32>
    return %5 : tensor<?x32xf32>
  }
}
