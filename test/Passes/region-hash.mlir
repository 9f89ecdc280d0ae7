// The region hash is a content hash: the same under renaming (SSA values, functions,
// arguments, weight names) and reordering of independent ops; different for any change of a
// constant or a shape.
// RUN: kforge-opt %s -split-input-file --kforge-pipeline | FileCheck %s

// Base.
// CHECK: call @kforge_region_[[H:[0-9a-f]{16}]]
// CHECK: func.func private @kforge_region_[[H]]
#map = affine_map<(d0, d1) -> (d0, d1)>
#row = affine_map<(d0, d1) -> (d1)>
func.func @main(%x: tensor<8x64xf32>, %w: tensor<32x64xf32> {kforge.weight = "fc.weight"}, %b: tensor<32xf32> {kforge.weight = "fc.bias"}) -> tensor<8x32xf32> {
  %zero = arith.constant 0.0 : f32
  %half = arith.constant 0.5 : f32
  %e0 = tensor.empty() : tensor<64x32xf32>
  %wt = linalg.transpose ins(%w : tensor<32x64xf32>) outs(%e0 : tensor<64x32xf32>) permutation = [1, 0]
  %e1 = tensor.empty() : tensor<8x32xf32>
  %f = linalg.fill ins(%zero : f32) outs(%e1 : tensor<8x32xf32>) -> tensor<8x32xf32>
  %m = linalg.matmul ins(%x, %wt : tensor<8x64xf32>, tensor<64x32xf32>) outs(%f : tensor<8x32xf32>) -> tensor<8x32xf32>
  %add = linalg.generic {indexing_maps = [#map, #row, #map], iterator_types = ["parallel", "parallel"]}
      ins(%m, %b : tensor<8x32xf32>, tensor<32xf32>) outs(%e1 : tensor<8x32xf32>) {
  ^bb0(%in: f32, %bias: f32, %out: f32):
    %s = arith.addf %in, %bias : f32
    linalg.yield %s : f32
  } -> tensor<8x32xf32>
  %t = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel"]}
      ins(%add : tensor<8x32xf32>) outs(%e1 : tensor<8x32xf32>) {
  ^bb0(%in: f32, %out: f32):
    %y = math.tanh %in : f32
    linalg.yield %y : f32
  } -> tensor<8x32xf32>
  %s = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel"]}
      ins(%add : tensor<8x32xf32>) outs(%e1 : tensor<8x32xf32>) {
  ^bb0(%in: f32, %out: f32):
    %y = arith.mulf %in, %half : f32
    linalg.yield %y : f32
  } -> tensor<8x32xf32>
  %o = linalg.generic {indexing_maps = [#map, #map, #map], iterator_types = ["parallel", "parallel"]}
      ins(%t, %s : tensor<8x32xf32>, tensor<8x32xf32>) outs(%e1 : tensor<8x32xf32>) {
  ^bb0(%p: f32, %q: f32, %out: f32):
    %y = arith.mulf %p, %q : f32
    linalg.yield %y : f32
  } -> tensor<8x32xf32>
  return %o : tensor<8x32xf32>
}

// -----

// Renamed: SSA values, the function, the arguments' order and the weights' names.
// CHECK: // -----
// CHECK: call @kforge_region_[[H]]
#map = affine_map<(d0, d1) -> (d0, d1)>
#row = affine_map<(d0, d1) -> (d1)>
func.func @forward(%bias: tensor<32xf32> {kforge.weight = "layer2.bias"}, %weight: tensor<32x64xf32> {kforge.weight = "layer2.weight"}, %input: tensor<8x64xf32>) -> tensor<8x32xf32> {
  %c0 = arith.constant 0.0 : f32
  %c1 = arith.constant 0.5 : f32
  %empty = tensor.empty() : tensor<64x32xf32>
  %transposed = linalg.transpose ins(%weight : tensor<32x64xf32>) outs(%empty : tensor<64x32xf32>) permutation = [1, 0]
  %acc = tensor.empty() : tensor<8x32xf32>
  %zeros = linalg.fill ins(%c0 : f32) outs(%acc : tensor<8x32xf32>) -> tensor<8x32xf32>
  %mm = linalg.matmul ins(%input, %transposed : tensor<8x64xf32>, tensor<64x32xf32>) outs(%zeros : tensor<8x32xf32>) -> tensor<8x32xf32>
  %biased = linalg.generic {indexing_maps = [#map, #row, #map], iterator_types = ["parallel", "parallel"]}
      ins(%mm, %bias : tensor<8x32xf32>, tensor<32xf32>) outs(%acc : tensor<8x32xf32>) {
  ^bb0(%a: f32, %b: f32, %c: f32):
    %r = arith.addf %a, %b : f32
    linalg.yield %r : f32
  } -> tensor<8x32xf32>
  %th = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel"]}
      ins(%biased : tensor<8x32xf32>) outs(%acc : tensor<8x32xf32>) {
  ^bb0(%a: f32, %c: f32):
    %r = math.tanh %a : f32
    linalg.yield %r : f32
  } -> tensor<8x32xf32>
  %sc = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel"]}
      ins(%biased : tensor<8x32xf32>) outs(%acc : tensor<8x32xf32>) {
  ^bb0(%a: f32, %c: f32):
    %r = arith.mulf %a, %c1 : f32
    linalg.yield %r : f32
  } -> tensor<8x32xf32>
  %out = linalg.generic {indexing_maps = [#map, #map, #map], iterator_types = ["parallel", "parallel"]}
      ins(%th, %sc : tensor<8x32xf32>, tensor<8x32xf32>) outs(%acc : tensor<8x32xf32>) {
  ^bb0(%a: f32, %b: f32, %c: f32):
    %r = arith.mulf %a, %b : f32
    linalg.yield %r : f32
  } -> tensor<8x32xf32>
  return %out : tensor<8x32xf32>
}

// -----

// Reordered: the transpose after the fill, the scale before the tanh.
// CHECK: // -----
// CHECK: call @kforge_region_[[H]]
#map = affine_map<(d0, d1) -> (d0, d1)>
#row = affine_map<(d0, d1) -> (d1)>
func.func @main(%x: tensor<8x64xf32>, %w: tensor<32x64xf32> {kforge.weight = "fc.weight"}, %b: tensor<32xf32> {kforge.weight = "fc.bias"}) -> tensor<8x32xf32> {
  %half = arith.constant 0.5 : f32
  %zero = arith.constant 0.0 : f32
  %e1 = tensor.empty() : tensor<8x32xf32>
  %f = linalg.fill ins(%zero : f32) outs(%e1 : tensor<8x32xf32>) -> tensor<8x32xf32>
  %e0 = tensor.empty() : tensor<64x32xf32>
  %wt = linalg.transpose ins(%w : tensor<32x64xf32>) outs(%e0 : tensor<64x32xf32>) permutation = [1, 0]
  %m = linalg.matmul ins(%x, %wt : tensor<8x64xf32>, tensor<64x32xf32>) outs(%f : tensor<8x32xf32>) -> tensor<8x32xf32>
  %add = linalg.generic {indexing_maps = [#map, #row, #map], iterator_types = ["parallel", "parallel"]}
      ins(%m, %b : tensor<8x32xf32>, tensor<32xf32>) outs(%e1 : tensor<8x32xf32>) {
  ^bb0(%in: f32, %bias: f32, %out: f32):
    %s = arith.addf %in, %bias : f32
    linalg.yield %s : f32
  } -> tensor<8x32xf32>
  %s = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel"]}
      ins(%add : tensor<8x32xf32>) outs(%e1 : tensor<8x32xf32>) {
  ^bb0(%in: f32, %out: f32):
    %y = arith.mulf %in, %half : f32
    linalg.yield %y : f32
  } -> tensor<8x32xf32>
  %t = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel"]}
      ins(%add : tensor<8x32xf32>) outs(%e1 : tensor<8x32xf32>) {
  ^bb0(%in: f32, %out: f32):
    %y = math.tanh %in : f32
    linalg.yield %y : f32
  } -> tensor<8x32xf32>
  %o = linalg.generic {indexing_maps = [#map, #map, #map], iterator_types = ["parallel", "parallel"]}
      ins(%t, %s : tensor<8x32xf32>, tensor<8x32xf32>) outs(%e1 : tensor<8x32xf32>) {
  ^bb0(%p: f32, %q: f32, %out: f32):
    %y = arith.mulf %p, %q : f32
    linalg.yield %y : f32
  } -> tensor<8x32xf32>
  return %o : tensor<8x32xf32>
}

// -----

// A changed constant (0.5 -> 0.25): a different hash.
// CHECK: // -----
// CHECK-NOT: kforge_region_[[H]]
// CHECK: return
#map = affine_map<(d0, d1) -> (d0, d1)>
#row = affine_map<(d0, d1) -> (d1)>
func.func @main(%x: tensor<8x64xf32>, %w: tensor<32x64xf32> {kforge.weight = "fc.weight"}, %b: tensor<32xf32> {kforge.weight = "fc.bias"}) -> tensor<8x32xf32> {
  %zero = arith.constant 0.0 : f32
  %half = arith.constant 0.25 : f32
  %e0 = tensor.empty() : tensor<64x32xf32>
  %wt = linalg.transpose ins(%w : tensor<32x64xf32>) outs(%e0 : tensor<64x32xf32>) permutation = [1, 0]
  %e1 = tensor.empty() : tensor<8x32xf32>
  %f = linalg.fill ins(%zero : f32) outs(%e1 : tensor<8x32xf32>) -> tensor<8x32xf32>
  %m = linalg.matmul ins(%x, %wt : tensor<8x64xf32>, tensor<64x32xf32>) outs(%f : tensor<8x32xf32>) -> tensor<8x32xf32>
  %add = linalg.generic {indexing_maps = [#map, #row, #map], iterator_types = ["parallel", "parallel"]}
      ins(%m, %b : tensor<8x32xf32>, tensor<32xf32>) outs(%e1 : tensor<8x32xf32>) {
  ^bb0(%in: f32, %bias: f32, %out: f32):
    %s = arith.addf %in, %bias : f32
    linalg.yield %s : f32
  } -> tensor<8x32xf32>
  %t = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel"]}
      ins(%add : tensor<8x32xf32>) outs(%e1 : tensor<8x32xf32>) {
  ^bb0(%in: f32, %out: f32):
    %y = math.tanh %in : f32
    linalg.yield %y : f32
  } -> tensor<8x32xf32>
  %s = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel"]}
      ins(%add : tensor<8x32xf32>) outs(%e1 : tensor<8x32xf32>) {
  ^bb0(%in: f32, %out: f32):
    %y = arith.mulf %in, %half : f32
    linalg.yield %y : f32
  } -> tensor<8x32xf32>
  %o = linalg.generic {indexing_maps = [#map, #map, #map], iterator_types = ["parallel", "parallel"]}
      ins(%t, %s : tensor<8x32xf32>, tensor<8x32xf32>) outs(%e1 : tensor<8x32xf32>) {
  ^bb0(%p: f32, %q: f32, %out: f32):
    %y = arith.mulf %p, %q : f32
    linalg.yield %y : f32
  } -> tensor<8x32xf32>
  return %o : tensor<8x32xf32>
}

// -----

// A changed shape (batch 8 -> 16): a different hash.
// CHECK: // -----
// CHECK-NOT: kforge_region_[[H]]
// CHECK: return
#map = affine_map<(d0, d1) -> (d0, d1)>
#row = affine_map<(d0, d1) -> (d1)>
func.func @main(%x: tensor<16x64xf32>, %w: tensor<32x64xf32> {kforge.weight = "fc.weight"}, %b: tensor<32xf32> {kforge.weight = "fc.bias"}) -> tensor<16x32xf32> {
  %zero = arith.constant 0.0 : f32
  %half = arith.constant 0.5 : f32
  %e0 = tensor.empty() : tensor<64x32xf32>
  %wt = linalg.transpose ins(%w : tensor<32x64xf32>) outs(%e0 : tensor<64x32xf32>) permutation = [1, 0]
  %e1 = tensor.empty() : tensor<16x32xf32>
  %f = linalg.fill ins(%zero : f32) outs(%e1 : tensor<16x32xf32>) -> tensor<16x32xf32>
  %m = linalg.matmul ins(%x, %wt : tensor<16x64xf32>, tensor<64x32xf32>) outs(%f : tensor<16x32xf32>) -> tensor<16x32xf32>
  %add = linalg.generic {indexing_maps = [#map, #row, #map], iterator_types = ["parallel", "parallel"]}
      ins(%m, %b : tensor<16x32xf32>, tensor<32xf32>) outs(%e1 : tensor<16x32xf32>) {
  ^bb0(%in: f32, %bias: f32, %out: f32):
    %s = arith.addf %in, %bias : f32
    linalg.yield %s : f32
  } -> tensor<16x32xf32>
  %t = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel"]}
      ins(%add : tensor<16x32xf32>) outs(%e1 : tensor<16x32xf32>) {
  ^bb0(%in: f32, %out: f32):
    %y = math.tanh %in : f32
    linalg.yield %y : f32
  } -> tensor<16x32xf32>
  %s = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel"]}
      ins(%add : tensor<16x32xf32>) outs(%e1 : tensor<16x32xf32>) {
  ^bb0(%in: f32, %out: f32):
    %y = arith.mulf %in, %half : f32
    linalg.yield %y : f32
  } -> tensor<16x32xf32>
  %o = linalg.generic {indexing_maps = [#map, #map, #map], iterator_types = ["parallel", "parallel"]}
      ins(%t, %s : tensor<16x32xf32>, tensor<16x32xf32>) outs(%e1 : tensor<16x32xf32>) {
  ^bb0(%p: f32, %q: f32, %out: f32):
    %y = arith.mulf %p, %q : f32
    linalg.yield %y : f32
  } -> tensor<16x32xf32>
  return %o : tensor<16x32xf32>
}
