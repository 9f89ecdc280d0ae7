// What kforge-opt exports validates against docs/kernel-spec.schema.json and loads in the
// Python half's reader. Several regions, a dynamic batch, a reduction with two results.
// RUN: rm -rf %t && kforge-opt %s --kforge-pipeline="dir=%t" -o /dev/null
// RUN: %if jsonschema %{ %python %S/../Inputs/validate_json.py %schema %t/*.json | FileCheck %s --check-prefix=SCHEMA %}
// RUN: %if kforge-python %{ env PYTHONPATH=%kforge_pythonpath %python %S/../Inputs/read_with_python.py %t/*.json | FileCheck %s --check-prefix=PY %}

// SCHEMA-COUNT-3: valid {{[0-9a-f]+}}.json
// SCHEMA: valid host_plan.json

// The second GEMM also reads %x: its dynamic batch size comes from there.
// PY-DAG: spec {{[0-9a-f]+}} contraction: 3 args, 5 ops, 1 results
// PY-DAG: spec {{[0-9a-f]+}} contraction: 3 args, 4 ops, 1 results
// PY-DAG: spec {{[0-9a-f]+}} reduction: 1 args, 8 ops, 1 results
// PY-DAG: plan main: 4 inputs, 3 steps, 2 outputs
#map = affine_map<(d0, d1) -> (d0, d1)>
#bias = affine_map<(d0, d1) -> (d1)>
#row = affine_map<(d0, d1) -> (d0)>
#id1 = affine_map<(d0) -> (d0)>
func.func @main(%x: tensor<?x16xf32>, %w1: tensor<16x16xf32> {kforge.weight = "l1.weight"}, %b1: tensor<16xf32> {kforge.weight = "l1.bias"}, %w2: tensor<16x8xf32> {kforge.weight = "l2.weight"}) -> (tensor<?x8xf32>, tensor<?xf32>) {
  %c0 = arith.constant 0 : index
  %zero = arith.constant 0.0 : f32
  %ninf = arith.constant 0xFF800000 : f32
  %n = tensor.dim %x, %c0 : tensor<?x16xf32>
  %e16 = tensor.empty(%n) : tensor<?x16xf32>
  %f16 = linalg.fill ins(%zero : f32) outs(%e16 : tensor<?x16xf32>) -> tensor<?x16xf32>
  %m1 = linalg.matmul ins(%x, %w1 : tensor<?x16xf32>, tensor<16x16xf32>) outs(%f16 : tensor<?x16xf32>) -> tensor<?x16xf32>
  %h = linalg.generic {indexing_maps = [#map, #bias, #map], iterator_types = ["parallel", "parallel"]}
      ins(%m1, %b1 : tensor<?x16xf32>, tensor<16xf32>) outs(%e16 : tensor<?x16xf32>) {
  ^bb0(%in: f32, %b: f32, %out: f32):
    %s = arith.addf %in, %b : f32
    %r = arith.maximumf %s, %zero : f32
    linalg.yield %r : f32
  } -> tensor<?x16xf32>
  %e8 = tensor.empty(%n) : tensor<?x8xf32>
  %f8 = linalg.fill ins(%zero : f32) outs(%e8 : tensor<?x8xf32>) -> tensor<?x8xf32>
  %m2 = linalg.matmul ins(%h, %w2 : tensor<?x16xf32>, tensor<16x8xf32>) outs(%f8 : tensor<?x8xf32>) -> tensor<?x8xf32>
  // Row max and argmax of the input, as torch-mlir writes torch.max(x, dim=1).
  %er = tensor.empty(%n) : tensor<?xf32>
  %fr = linalg.fill ins(%ninf : f32) outs(%er : tensor<?xf32>) -> tensor<?xf32>
  %ei = tensor.empty(%n) : tensor<?xi64>
  %c0_i64 = arith.constant 0 : i64
  %fi = linalg.fill ins(%c0_i64 : i64) outs(%ei : tensor<?xi64>) -> tensor<?xi64>
  %mx:2 = linalg.generic {indexing_maps = [#map, #row, #row], iterator_types = ["parallel", "reduction"]}
      ins(%x : tensor<?x16xf32>) outs(%fr, %fi : tensor<?xf32>, tensor<?xi64>) {
  ^bb0(%in: f32, %acc: f32, %idx: i64):
    %i = linalg.index 1 : index
    %ii = arith.index_cast %i : index to i64
    %gt = arith.cmpf ogt, %in, %acc : f32
    %v = arith.select %gt, %in, %acc : f32
    %j = arith.select %gt, %ii, %idx : i64
    linalg.yield %v, %j : f32, i64
  } -> (tensor<?xf32>, tensor<?xi64>)
  %sum = linalg.generic {indexing_maps = [#id1, #id1, #id1], iterator_types = ["parallel"]}
      ins(%mx#0, %mx#1 : tensor<?xf32>, tensor<?xi64>) outs(%er : tensor<?xf32>) {
  ^bb0(%a: f32, %b: i64, %out: f32):
    %bf = arith.sitofp %b : i64 to f32
    %s = arith.addf %a, %bf : f32
    linalg.yield %s : f32
  } -> tensor<?xf32>
  return %m2, %sum : tensor<?x8xf32>, tensor<?xf32>
}
