// RUN: kforge-opt %s -split-input-file --kforge-form-regions | FileCheck %s
// RUN: kforge-opt %s -split-input-file --kforge-form-regions="sibling-contractions=false" | FileCheck %s --check-prefix=NOSIB

// A GEMM with a bias and ReLU epilogue: one region. The weight transpose, the fill and the
// empties are recomputed inside; the weight itself is read as a region input.
// CHECK-LABEL: func.func @matmul_bias_relu
// CHECK-SAME: (%[[X:.*]]: tensor<8x64xf32>, %[[W:.*]]: tensor<32x64xf32>, %[[B:.*]]: tensor<32xf32>)
// CHECK-NEXT: %[[R:.*]] = kforge.fusion_region "contraction"
// CHECK-SAME: attributes {fused = ["matmul", "bias", "relu"]}
// CHECK:   linalg.transpose
// CHECK:   linalg.fill
// CHECK:   linalg.matmul
// CHECK:   linalg.generic
// CHECK:     arith.addf
// CHECK:   linalg.generic
// CHECK:     arith.maximumf
// CHECK:   kforge.yield
// CHECK-NEXT: }
// CHECK-NEXT: return %[[R]]
#map = affine_map<(d0, d1) -> (d0, d1)>
#bias = affine_map<(d0, d1) -> (d1)>
func.func @matmul_bias_relu(%x: tensor<8x64xf32>, %w: tensor<32x64xf32>, %b: tensor<32xf32>) -> tensor<8x32xf32> {
  %zero = arith.constant 0.0 : f32
  %e0 = tensor.empty() : tensor<64x32xf32>
  %wt = linalg.transpose ins(%w : tensor<32x64xf32>) outs(%e0 : tensor<64x32xf32>) permutation = [1, 0]
  %e1 = tensor.empty() : tensor<8x32xf32>
  %f = linalg.fill ins(%zero : f32) outs(%e1 : tensor<8x32xf32>) -> tensor<8x32xf32>
  %m = linalg.matmul ins(%x, %wt : tensor<8x64xf32>, tensor<64x32xf32>) outs(%f : tensor<8x32xf32>) -> tensor<8x32xf32>
  %add = linalg.generic {indexing_maps = [#map, #bias, #map], iterator_types = ["parallel", "parallel"]}
      ins(%m, %b : tensor<8x32xf32>, tensor<32xf32>) outs(%e1 : tensor<8x32xf32>) {
  ^bb0(%in: f32, %bias: f32, %out: f32):
    %s = arith.addf %in, %bias : f32
    linalg.yield %s : f32
  } -> tensor<8x32xf32>
  %relu = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel"]}
      ins(%add : tensor<8x32xf32>) outs(%e1 : tensor<8x32xf32>) {
  ^bb0(%in: f32, %out: f32):
    %r = arith.maximumf %in, %zero : f32
    linalg.yield %r : f32
  } -> tensor<8x32xf32>
  return %relu : tensor<8x32xf32>
}

// -----

// A value of the region that is also used outside stays available: the region returns both
// the GEMM result and the epilogue, nothing is computed twice.
// CHECK-LABEL: func.func @multi_use
// CHECK: %[[R:.*]]:2 = kforge.fusion_region "contraction"
// CHECK-COUNT-1: linalg.matmul
// CHECK: kforge.yield
// CHECK: return %[[R]]#{{[01]}}, %[[R]]#{{[01]}}
#map = affine_map<(d0, d1) -> (d0, d1)>
func.func @multi_use(%a: tensor<4x8xf32>, %b: tensor<8x4xf32>, %c: tensor<4x4xf32>) -> (tensor<4x4xf32>, tensor<4x4xf32>) {
  %m = linalg.matmul ins(%a, %b : tensor<4x8xf32>, tensor<8x4xf32>) outs(%c : tensor<4x4xf32>) -> tensor<4x4xf32>
  %e = tensor.empty() : tensor<4x4xf32>
  %t = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel"]}
      ins(%m : tensor<4x4xf32>) outs(%e : tensor<4x4xf32>) {
  ^bb0(%in: f32, %out: f32):
    %y = math.tanh %in : f32
    linalg.yield %y : f32
  } -> tensor<4x4xf32>
  return %m, %t : tensor<4x4xf32>, tensor<4x4xf32>
}

// -----

// An op the analysis does not know (here a call) stays outside, untouched; the epilogue that
// reads it still joins the region, which is placed after it.
// CHECK-LABEL: func.func @unknown_op_stays_outside
// CHECK: %[[U:.*]] = call @opaque
// CHECK: kforge.fusion_region "contraction" ({{.*}}%[[U]]{{.*}})
// CHECK-NOT: call @opaque
// CHECK: kforge.yield
#map = affine_map<(d0, d1) -> (d0, d1)>
func.func private @opaque(tensor<4x4xf32>) -> tensor<4x4xf32>
func.func @unknown_op_stays_outside(%a: tensor<4x8xf32>, %b: tensor<8x4xf32>, %c: tensor<4x4xf32>) -> tensor<4x4xf32> {
  %m = linalg.matmul ins(%a, %b : tensor<4x8xf32>, tensor<8x4xf32>) outs(%c : tensor<4x4xf32>) -> tensor<4x4xf32>
  %u = call @opaque(%c) : (tensor<4x4xf32>) -> tensor<4x4xf32>
  %e = tensor.empty() : tensor<4x4xf32>
  %s = linalg.generic {indexing_maps = [#map, #map, #map], iterator_types = ["parallel", "parallel"]}
      ins(%m, %u : tensor<4x4xf32>, tensor<4x4xf32>) outs(%e : tensor<4x4xf32>) {
  ^bb0(%x: f32, %y: f32, %out: f32):
    %z = arith.addf %x, %y : f32
    linalg.yield %z : f32
  } -> tensor<4x4xf32>
  return %s : tensor<4x4xf32>
}

// -----

// An op outside that reads the GEMM result before the epilogue pins the region: the epilogue
// cannot join it without breaking dominance, so it forms a region of its own after it.
// CHECK-LABEL: func.func @dominance
// CHECK: %[[M:.*]] = kforge.fusion_region "contraction"
// CHECK: linalg.matmul
// CHECK-NOT: math.exp
// CHECK: kforge.yield
// CHECK: %[[U:.*]] = call @consume(%[[M]])
// CHECK: kforge.fusion_region "elementwise" ({{.*}}%[[M]]{{.*}})
// CHECK: math.exp
#map = affine_map<(d0, d1) -> (d0, d1)>
func.func private @consume(tensor<4x4xf32>) -> tensor<4x4xf32>
func.func @dominance(%a: tensor<4x8xf32>, %b: tensor<8x4xf32>, %c: tensor<4x4xf32>) -> (tensor<4x4xf32>, tensor<4x4xf32>) {
  %m = linalg.matmul ins(%a, %b : tensor<4x8xf32>, tensor<8x4xf32>) outs(%c : tensor<4x4xf32>) -> tensor<4x4xf32>
  %u = call @consume(%m) : (tensor<4x4xf32>) -> tensor<4x4xf32>
  %e = tensor.empty() : tensor<4x4xf32>
  %x = linalg.generic {indexing_maps = [#map, #map, #map], iterator_types = ["parallel", "parallel"]}
      ins(%m, %u : tensor<4x4xf32>, tensor<4x4xf32>) outs(%e : tensor<4x4xf32>) {
  ^bb0(%p: f32, %q: f32, %out: f32):
    %y = math.exp %p : f32
    %z = arith.addf %y, %q : f32
    linalg.yield %z : f32
  } -> tensor<4x4xf32>
  return %x, %u : tensor<4x4xf32>, tensor<4x4xf32>
}

// -----

// Dynamic batch: the sizes are recomputed inside from the region's inputs.
// CHECK-LABEL: func.func @dynamic_batch
// CHECK: kforge.fusion_region "contraction" ({{.*}}%[[XA:[a-z0-9]+]] = %arg0{{.*}}) : ({{.*}}) -> tensor<?x32xf32>
// CHECK:   %[[D:.*]] = tensor.dim %[[XA]], %{{.*}} : tensor<?x64xf32>
// CHECK:   tensor.empty(%[[D]]) : tensor<?x32xf32>
// CHECK:   linalg.matmul
// CHECK:   math.tanh
// CHECK:   kforge.yield {{.*}} : tensor<?x32xf32>
#map = affine_map<(d0, d1) -> (d0, d1)>
func.func @dynamic_batch(%x: tensor<?x64xf32>, %w: tensor<64x32xf32>) -> tensor<?x32xf32> {
  %c0 = arith.constant 0 : index
  %zero = arith.constant 0.0 : f32
  %n = tensor.dim %x, %c0 : tensor<?x64xf32>
  %e = tensor.empty(%n) : tensor<?x32xf32>
  %f = linalg.fill ins(%zero : f32) outs(%e : tensor<?x32xf32>) -> tensor<?x32xf32>
  %m = linalg.matmul ins(%x, %w : tensor<?x64xf32>, tensor<64x32xf32>) outs(%f : tensor<?x32xf32>) -> tensor<?x32xf32>
  %t = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel"]}
      ins(%m : tensor<?x32xf32>) outs(%e : tensor<?x32xf32>) {
  ^bb0(%in: f32, %out: f32):
    %y = math.tanh %in : f32
    linalg.yield %y : f32
  } -> tensor<?x32xf32>
  return %t : tensor<?x32xf32>
}

// -----

// Row softmax after a GEMM, as torch-mlir writes it (reductions, expand_shape, broadcasts):
// one region.
// CHECK-LABEL: func.func @gemm_softmax
// CHECK: kforge.fusion_region "contraction"
// CHECK-SAME: fused = ["matmul", "reduce_max", "sub", "exp", "reduce_sum", "div"]
// CHECK: tensor.expand_shape
// CHECK: kforge.yield
// CHECK-NEXT: }
// CHECK-NEXT: return
#map = affine_map<(d0, d1) -> (d0, d1)>
#row = affine_map<(d0, d1) -> (d0)>
#row1 = affine_map<(d0, d1) -> (d0, 0)>
func.func @gemm_softmax(%a: tensor<8x16xf32>, %b: tensor<16x32xf32>) -> tensor<8x32xf32> {
  %zero = arith.constant 0.0 : f32
  %ninf = arith.constant 0xFF800000 : f32
  %e = tensor.empty() : tensor<8x32xf32>
  %f = linalg.fill ins(%zero : f32) outs(%e : tensor<8x32xf32>) -> tensor<8x32xf32>
  %m = linalg.matmul ins(%a, %b : tensor<8x16xf32>, tensor<16x32xf32>) outs(%f : tensor<8x32xf32>) -> tensor<8x32xf32>
  %er = tensor.empty() : tensor<8xf32>
  %fm = linalg.fill ins(%ninf : f32) outs(%er : tensor<8xf32>) -> tensor<8xf32>
  %max = linalg.generic {indexing_maps = [#map, #row], iterator_types = ["parallel", "reduction"]}
      ins(%m : tensor<8x32xf32>) outs(%fm : tensor<8xf32>) {
  ^bb0(%in: f32, %acc: f32):
    %y = arith.maximumf %in, %acc : f32
    linalg.yield %y : f32
  } -> tensor<8xf32>
  %maxe = tensor.expand_shape %max [[0, 1]] output_shape [8, 1] : tensor<8xf32> into tensor<8x1xf32>
  %sub = linalg.generic {indexing_maps = [#map, #row1, #map], iterator_types = ["parallel", "parallel"]}
      ins(%m, %maxe : tensor<8x32xf32>, tensor<8x1xf32>) outs(%e : tensor<8x32xf32>) {
  ^bb0(%in: f32, %mx: f32, %out: f32):
    %y = arith.subf %in, %mx : f32
    linalg.yield %y : f32
  } -> tensor<8x32xf32>
  %exp = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel"]}
      ins(%sub : tensor<8x32xf32>) outs(%e : tensor<8x32xf32>) {
  ^bb0(%in: f32, %out: f32):
    %y = math.exp %in : f32
    linalg.yield %y : f32
  } -> tensor<8x32xf32>
  %e1 = tensor.empty() : tensor<8x1xf32>
  %f1 = linalg.fill ins(%zero : f32) outs(%e1 : tensor<8x1xf32>) -> tensor<8x1xf32>
  %sum = linalg.generic {indexing_maps = [#map, #row1], iterator_types = ["parallel", "reduction"]}
      ins(%exp : tensor<8x32xf32>) outs(%f1 : tensor<8x1xf32>) {
  ^bb0(%in: f32, %acc: f32):
    %y = arith.addf %in, %acc : f32
    linalg.yield %y : f32
  } -> tensor<8x1xf32>
  %div = linalg.generic {indexing_maps = [#map, #row1, #map], iterator_types = ["parallel", "parallel"]}
      ins(%exp, %sum : tensor<8x32xf32>, tensor<8x1xf32>) outs(%e : tensor<8x32xf32>) {
  ^bb0(%in: f32, %s: f32, %out: f32):
    %y = arith.divf %in, %s : f32
    linalg.yield %y : f32
  } -> tensor<8x32xf32>
  return %div : tensor<8x32xf32>
}

// -----

// Two GEMMs, each with its epilogue, the second reading the first: two regions, in order.
// CHECK-LABEL: func.func @two_layers
// CHECK: %[[H:.*]] = kforge.fusion_region "contraction"
// CHECK-SAME: fused = ["matmul", "relu"]
// CHECK: kforge.fusion_region "contraction" ({{.*}}%[[H]]{{.*}})
// CHECK-SAME: fused = ["matmul", "tanh"]
#map = affine_map<(d0, d1) -> (d0, d1)>
func.func @two_layers(%x: tensor<4x8xf32>, %w1: tensor<8x8xf32>, %w2: tensor<8x8xf32>) -> tensor<4x8xf32> {
  %zero = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<4x8xf32>
  %f = linalg.fill ins(%zero : f32) outs(%e : tensor<4x8xf32>) -> tensor<4x8xf32>
  %m1 = linalg.matmul ins(%x, %w1 : tensor<4x8xf32>, tensor<8x8xf32>) outs(%f : tensor<4x8xf32>) -> tensor<4x8xf32>
  %h = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel"]}
      ins(%m1 : tensor<4x8xf32>) outs(%e : tensor<4x8xf32>) {
  ^bb0(%in: f32, %out: f32):
    %y = arith.maximumf %in, %zero : f32
    linalg.yield %y : f32
  } -> tensor<4x8xf32>
  %m2 = linalg.matmul ins(%h, %w2 : tensor<4x8xf32>, tensor<8x8xf32>) outs(%f : tensor<4x8xf32>) -> tensor<4x8xf32>
  %t = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel"]}
      ins(%m2 : tensor<4x8xf32>) outs(%e : tensor<4x8xf32>) {
  ^bb0(%in: f32, %out: f32):
    %y = math.tanh %in : f32
    linalg.yield %y : f32
  } -> tensor<4x8xf32>
  return %t : tensor<4x8xf32>
}

// -----

// A gated MLP: silu(x W1) * (x W3). The second GEMM is one contraction that only the first
// GEMM's region reads, and the first GEMM reads the same x with the same result type: sibling
// products, one region (a kernel can compute both from one pass over x).
// CHECK-LABEL: func.func @gated
// CHECK: %[[R:.*]] = kforge.fusion_region "contraction"
// CHECK-SAME: fused = ["matmul", "silu", "matmul", "mul"]
// CHECK-COUNT-2: linalg.matmul
// CHECK: kforge.yield
// CHECK-NOT: kforge.fusion_region
// CHECK: return %[[R]]
// With sibling-contractions=false the second GEMM keeps a region of its own, which the
// first GEMM's region reads.
// NOSIB-LABEL: func.func @gated
// NOSIB: %[[UP:.*]] = kforge.fusion_region "contraction"
// NOSIB-SAME: fused = ["matmul"]
// NOSIB: kforge.fusion_region "contraction" ({{.*}}%[[UP]]{{.*}})
// NOSIB-SAME: fused = ["matmul", "silu", "mul"]
#map = affine_map<(d0, d1) -> (d0, d1)>
func.func @gated(%x: tensor<4x8xf32>, %w1: tensor<8x16xf32>, %w3: tensor<8x16xf32>) -> tensor<4x16xf32> {
  %zero = arith.constant 0.0 : f32
  %one = arith.constant 1.0 : f32
  %e = tensor.empty() : tensor<4x16xf32>
  %f = linalg.fill ins(%zero : f32) outs(%e : tensor<4x16xf32>) -> tensor<4x16xf32>
  %g = linalg.matmul ins(%x, %w1 : tensor<4x8xf32>, tensor<8x16xf32>) outs(%f : tensor<4x16xf32>) -> tensor<4x16xf32>
  %silu = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel"]}
      ins(%g : tensor<4x16xf32>) outs(%e : tensor<4x16xf32>) {
  ^bb0(%in: f32, %out: f32):
    %n = arith.negf %in : f32
    %ex = math.exp %n : f32
    %d = arith.addf %ex, %one : f32
    %s = arith.divf %in, %d : f32
    %y = arith.mulf %s, %one : f32
    linalg.yield %y : f32
  } -> tensor<4x16xf32>
  %u = linalg.matmul ins(%x, %w3 : tensor<4x8xf32>, tensor<8x16xf32>) outs(%f : tensor<4x16xf32>) -> tensor<4x16xf32>
  %p = linalg.generic {indexing_maps = [#map, #map, #map], iterator_types = ["parallel", "parallel"]}
      ins(%silu, %u : tensor<4x16xf32>, tensor<4x16xf32>) outs(%e : tensor<4x16xf32>) {
  ^bb0(%a: f32, %b: f32, %out: f32):
    %y = arith.mulf %a, %b : f32
    linalg.yield %y : f32
  } -> tensor<4x16xf32>
  return %p : tensor<4x16xf32>
}

// -----

// A convolution with bias and ReLU, then 2x2 max pooling: one region.
// CHECK-LABEL: func.func @conv_bias_relu_pool
// CHECK: kforge.fusion_region "convolution"
// CHECK-SAME: fused = ["conv_2d_nchw_fchw", "bias", "relu", "pooling_nchw_max"]
// CHECK:   linalg.conv_2d_nchw_fchw
// CHECK:   linalg.pooling_nchw_max
// CHECK:   kforge.yield
// CHECK-NEXT: }
// CHECK-NEXT: return
#b4 = affine_map<(d0, d1, d2, d3) -> (d1)>
#id4 = affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>
func.func @conv_bias_relu_pool(%x: tensor<1x3x10x10xf32>, %w: tensor<4x3x3x3xf32>, %b: tensor<4xf32>) -> tensor<1x4x4x4xf32> {
  %zero = arith.constant 0.0 : f32
  %ninf = arith.constant 0xFF800000 : f32
  %e = tensor.empty() : tensor<1x4x8x8xf32>
  %f = linalg.fill ins(%zero : f32) outs(%e : tensor<1x4x8x8xf32>) -> tensor<1x4x8x8xf32>
  %c = linalg.conv_2d_nchw_fchw {dilations = dense<1> : vector<2xi64>, strides = dense<1> : vector<2xi64>}
      ins(%x, %w : tensor<1x3x10x10xf32>, tensor<4x3x3x3xf32>) outs(%f : tensor<1x4x8x8xf32>) -> tensor<1x4x8x8xf32>
  %cb = linalg.generic {indexing_maps = [#id4, #b4, #id4], iterator_types = ["parallel", "parallel", "parallel", "parallel"]}
      ins(%c, %b : tensor<1x4x8x8xf32>, tensor<4xf32>) outs(%e : tensor<1x4x8x8xf32>) {
  ^bb0(%in: f32, %bias: f32, %out: f32):
    %y = arith.addf %in, %bias : f32
    linalg.yield %y : f32
  } -> tensor<1x4x8x8xf32>
  %r = linalg.generic {indexing_maps = [#id4, #id4], iterator_types = ["parallel", "parallel", "parallel", "parallel"]}
      ins(%cb : tensor<1x4x8x8xf32>) outs(%e : tensor<1x4x8x8xf32>) {
  ^bb0(%in: f32, %out: f32):
    %y = arith.maximumf %in, %zero : f32
    linalg.yield %y : f32
  } -> tensor<1x4x8x8xf32>
  %win = tensor.empty() : tensor<2x2xf32>
  %ep = tensor.empty() : tensor<1x4x4x4xf32>
  %fp = linalg.fill ins(%ninf : f32) outs(%ep : tensor<1x4x4x4xf32>) -> tensor<1x4x4x4xf32>
  %p = linalg.pooling_nchw_max {dilations = dense<1> : vector<2xi64>, strides = dense<2> : vector<2xi64>}
      ins(%r, %win : tensor<1x4x8x8xf32>, tensor<2x2xf32>) outs(%fp : tensor<1x4x4x4xf32>) -> tensor<1x4x4x4xf32>
  return %p : tensor<1x4x4x4xf32>
}

// -----

// A batched GEMM written as a contraction-shaped generic, scaled.
// CHECK-LABEL: func.func @batch_contraction_generic
// CHECK: kforge.fusion_region "contraction"
// CHECK-SAME: fused = ["batch_matmul", "scale"]
#lhs = affine_map<(b, m, n, k) -> (b, m, k)>
#rhs = affine_map<(b, m, n, k) -> (b, n, k)>
#out = affine_map<(b, m, n, k) -> (b, m, n)>
#id3 = affine_map<(b, m, n) -> (b, m, n)>
func.func @batch_contraction_generic(%a: tensor<2x4x8xf32>, %b: tensor<2x6x8xf32>, %c: tensor<2x4x6xf32>) -> tensor<2x4x6xf32> {
  %half = arith.constant 0.5 : f32
  %m = linalg.generic {indexing_maps = [#lhs, #rhs, #out], iterator_types = ["parallel", "parallel", "parallel", "reduction"]}
      ins(%a, %b : tensor<2x4x8xf32>, tensor<2x6x8xf32>) outs(%c : tensor<2x4x6xf32>) {
  ^bb0(%x: f32, %y: f32, %acc: f32):
    %p = arith.mulf %x, %y : f32
    %s = arith.addf %acc, %p : f32
    linalg.yield %s : f32
  } -> tensor<2x4x6xf32>
  %e = tensor.empty() : tensor<2x4x6xf32>
  %s = linalg.generic {indexing_maps = [#id3, #id3], iterator_types = ["parallel", "parallel", "parallel"]}
      ins(%m : tensor<2x4x6xf32>) outs(%e : tensor<2x4x6xf32>) {
  ^bb0(%in: f32, %out: f32):
    %y = arith.mulf %in, %half : f32
    linalg.yield %y : f32
  } -> tensor<2x4x6xf32>
  return %s : tensor<2x4x6xf32>
}

// -----

// Without a contraction: an elementwise chain into a row reduction is one region; a lone
// transpose is not a region.
// CHECK-LABEL: func.func @standalone
// CHECK: linalg.transpose
// CHECK: kforge.fusion_region "reduction"
// CHECK-SAME: fused = ["mul", "reduce_sum"]
#map = affine_map<(d0, d1) -> (d0, d1)>
#row = affine_map<(d0, d1) -> (d0)>
func.func @standalone(%x: tensor<4x8xf32>, %init: tensor<4xf32>) -> (tensor<4xf32>, tensor<8x4xf32>) {
  %et = tensor.empty() : tensor<8x4xf32>
  %t = linalg.transpose ins(%x : tensor<4x8xf32>) outs(%et : tensor<8x4xf32>) permutation = [1, 0]
  %e = tensor.empty() : tensor<4x8xf32>
  %sq = linalg.generic {indexing_maps = [#map, #map, #map], iterator_types = ["parallel", "parallel"]}
      ins(%x, %x : tensor<4x8xf32>, tensor<4x8xf32>) outs(%e : tensor<4x8xf32>) {
  ^bb0(%a: f32, %b: f32, %out: f32):
    %y = arith.mulf %a, %b : f32
    linalg.yield %y : f32
  } -> tensor<4x8xf32>
  %sum = linalg.generic {indexing_maps = [#map, #row], iterator_types = ["parallel", "reduction"]}
      ins(%sq : tensor<4x8xf32>) outs(%init : tensor<4xf32>) {
  ^bb0(%in: f32, %acc: f32):
    %y = arith.addf %in, %acc : f32
    linalg.yield %y : f32
  } -> tensor<4xf32>
  return %sum, %t : tensor<4xf32>, tensor<8x4xf32>
}

// -----

// Sibling chains off a shared input, as in torch-mlir's layer norm (an f32 mean beside the f64
// variance): the row max is grouped after the chain that reads it was seeded, and is merged
// into it, since both reduce the same rows. One region.
// CHECK-LABEL: func.func @sibling_rows
// CHECK: kforge.fusion_region "reduction"
// CHECK-SAME: fused = ["exp", "reduce_sum", "reduce_max", "bias"]
// CHECK-NOT: kforge.fusion_region
// CHECK: return
#map = affine_map<(d0, d1) -> (d0, d1)>
#row = affine_map<(d0, d1) -> (d0)>
func.func @sibling_rows(%x: tensor<4x8xf32>, %init: tensor<4xf32>) -> tensor<4x8xf32> {
  %e = tensor.empty() : tensor<4x8xf32>
  %exp = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel"]}
      ins(%x : tensor<4x8xf32>) outs(%e : tensor<4x8xf32>) {
  ^bb0(%in: f32, %out: f32):
    %y = math.exp %in : f32
    linalg.yield %y : f32
  } -> tensor<4x8xf32>
  %sum = linalg.generic {indexing_maps = [#map, #row], iterator_types = ["parallel", "reduction"]}
      ins(%exp : tensor<4x8xf32>) outs(%init : tensor<4xf32>) {
  ^bb0(%in: f32, %acc: f32):
    %y = arith.addf %in, %acc : f32
    linalg.yield %y : f32
  } -> tensor<4xf32>
  %max = linalg.generic {indexing_maps = [#map, #row], iterator_types = ["parallel", "reduction"]}
      ins(%x : tensor<4x8xf32>) outs(%init : tensor<4xf32>) {
  ^bb0(%in: f32, %acc: f32):
    %y = arith.maximumf %in, %acc : f32
    linalg.yield %y : f32
  } -> tensor<4xf32>
  %out = linalg.generic {indexing_maps = [#row, #row, #map], iterator_types = ["parallel", "parallel"]}
      ins(%sum, %max : tensor<4xf32>, tensor<4xf32>) outs(%e : tensor<4x8xf32>) {
  ^bb0(%s: f32, %m: f32, %o: f32):
    %y = arith.addf %s, %m : f32
    linalg.yield %y : f32
  } -> tensor<4x8xf32>
  return %out : tensor<4x8xf32>
}

// -----

// The same, but the sibling reduces columns: other rows, so it stays a region of its own (one
// pass over the rows could not compute it).
// CHECK-LABEL: func.func @sibling_columns
// CHECK: %[[MAX:.*]] = kforge.fusion_region "reduction"
// CHECK-SAME: fused = ["reduce_max"]
// CHECK: kforge.fusion_region "reduction" ({{.*}}%[[MAX]]
// CHECK-SAME: fused = ["exp", "reduce_sum", "bias"]
#map = affine_map<(d0, d1) -> (d0, d1)>
#row = affine_map<(d0, d1) -> (d0)>
#col = affine_map<(d0, d1) -> (d1)>
func.func @sibling_columns(%x: tensor<4x8xf32>, %init: tensor<4xf32>, %cinit: tensor<8xf32>) -> tensor<4x8xf32> {
  %e = tensor.empty() : tensor<4x8xf32>
  %exp = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel"]}
      ins(%x : tensor<4x8xf32>) outs(%e : tensor<4x8xf32>) {
  ^bb0(%in: f32, %out: f32):
    %y = math.exp %in : f32
    linalg.yield %y : f32
  } -> tensor<4x8xf32>
  %sum = linalg.generic {indexing_maps = [#map, #row], iterator_types = ["parallel", "reduction"]}
      ins(%exp : tensor<4x8xf32>) outs(%init : tensor<4xf32>) {
  ^bb0(%in: f32, %acc: f32):
    %y = arith.addf %in, %acc : f32
    linalg.yield %y : f32
  } -> tensor<4xf32>
  %max = linalg.generic {indexing_maps = [#map, #col], iterator_types = ["reduction", "parallel"]}
      ins(%x : tensor<4x8xf32>) outs(%cinit : tensor<8xf32>) {
  ^bb0(%in: f32, %acc: f32):
    %y = arith.maximumf %in, %acc : f32
    linalg.yield %y : f32
  } -> tensor<8xf32>
  %out = linalg.generic {indexing_maps = [#row, #col, #map], iterator_types = ["parallel", "parallel"]}
      ins(%sum, %max : tensor<4xf32>, tensor<8xf32>) outs(%e : tensor<4x8xf32>) {
  ^bb0(%s: f32, %m: f32, %o: f32):
    %y = arith.addf %s, %m : f32
    linalg.yield %y : f32
  } -> tensor<4x8xf32>
  return %out : tensor<4x8xf32>
}

// -----

// A linalg op whose body holds something the kernel spec cannot describe (here a gather with
// tensor.extract) stays outside; so do ops on buffers.
// CHECK-LABEL: func.func @unsupported_bodies
// CHECK-NOT: kforge.fusion_region
// CHECK: tensor.extract
// CHECK: linalg.generic
// CHECK-SAME: memref
// CHECK-NOT: kforge.fusion_region
#map = affine_map<(d0) -> (d0)>
func.func @unsupported_bodies(%idx: tensor<4xindex>, %src: tensor<16xf32>, %m: memref<4xf32>) -> tensor<4xf32> {
  %e = tensor.empty() : tensor<4xf32>
  %g = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel"]}
      ins(%idx : tensor<4xindex>) outs(%e : tensor<4xf32>) {
  ^bb0(%i: index, %out: f32):
    %v = tensor.extract %src[%i] : tensor<16xf32>
    linalg.yield %v : f32
  } -> tensor<4xf32>
  linalg.generic {indexing_maps = [#map], iterator_types = ["parallel"]} outs(%m : memref<4xf32>) {
  ^bb0(%out: f32):
    %y = math.exp %out : f32
    linalg.yield %y : f32
  }
  return %g : tensor<4xf32>
}

// -----

// Small dense constants are recomputed inside; constants stored as resource blobs (weights
// the frontend did not lift into arguments) stay outside as region inputs.
// CHECK-LABEL: func.func @constants
// CHECK: %[[BLOB:.*]] = arith.constant dense_resource<blob> : tensor<4xf32>
// CHECK: kforge.fusion_region "elementwise" ({{.*}}%[[BLOB]]{{.*}})
// CHECK:   arith.constant dense<[1.000000e+00, 2.000000e+00, 3.000000e+00, 4.000000e+00]> : tensor<4xf32>
#map = affine_map<(d0) -> (d0)>
func.func @constants(%x: tensor<4xf32>) -> tensor<4xf32> {
  %small = arith.constant dense<[1.0, 2.0, 3.0, 4.0]> : tensor<4xf32>
  %blob = arith.constant dense_resource<blob> : tensor<4xf32>
  %e = tensor.empty() : tensor<4xf32>
  %s = linalg.generic {indexing_maps = [#map, #map, #map, #map], iterator_types = ["parallel"]}
      ins(%x, %small, %blob : tensor<4xf32>, tensor<4xf32>, tensor<4xf32>) outs(%e : tensor<4xf32>) {
  ^bb0(%a: f32, %b: f32, %c: f32, %out: f32):
    %y = arith.mulf %a, %b : f32
    %z = arith.addf %y, %c : f32
    linalg.yield %z : f32
  } -> tensor<4xf32>
  return %s : tensor<4xf32>
}
{-#
  dialect_resources: {
    builtin: {
      blob: "0x040000000000803F0000004000004040000080C0"
    }
  }
#-}

// -----

// Regions already formed and outlined regions are left as they are.
// CHECK-LABEL: func.func private @kforge_region_0123456789abcdef
// CHECK-NOT: kforge.fusion_region
// CHECK: linalg.matmul
func.func private @kforge_region_0123456789abcdef(%a: tensor<4x8xf32>, %b: tensor<8x4xf32>, %c: tensor<4x4xf32>) -> tensor<4x4xf32> attributes {kforge.hash = "0123456789abcdef"} {
  %m = linalg.matmul ins(%a, %b : tensor<4x8xf32>, tensor<8x4xf32>) outs(%c : tensor<4x4xf32>) -> tensor<4x4xf32>
  return %m : tensor<4x4xf32>
}

// -----

// A convolution's static zero padding is recomputed inside its region, which reads the
// unpadded input; a pad with a dynamic amount stays outside.
// CHECK-LABEL: func.func @padded_conv
// CHECK-SAME: (%[[X:.*]]: tensor<1x3x8x8xf32>, %[[W:.*]]: tensor<4x3x3x3xf32>, %[[N:.*]]: index)
// CHECK: kforge.fusion_region "convolution" ({{.*}}%[[X]]{{.*}})
// CHECK:   tensor.pad %{{.*}} low[0, 0, 1, 1] high[0, 0, 1, 1]
// CHECK:   linalg.conv_2d_nchw_fchw
// CHECK: kforge.yield
// CHECK: tensor.pad %[[X]] low[0, 0, 0, 0] high[0, 0, %[[N]], 0]
func.func @padded_conv(%x: tensor<1x3x8x8xf32>, %w: tensor<4x3x3x3xf32>, %n: index) -> (tensor<1x4x8x8xf32>, tensor<1x3x?x8xf32>) {
  %zero = arith.constant 0.0 : f32
  %p = tensor.pad %x low[0, 0, 1, 1] high[0, 0, 1, 1] {
  ^bb0(%a: index, %b: index, %c: index, %d: index):
    tensor.yield %zero : f32
  } : tensor<1x3x8x8xf32> to tensor<1x3x10x10xf32>
  %e = tensor.empty() : tensor<1x4x8x8xf32>
  %f = linalg.fill ins(%zero : f32) outs(%e : tensor<1x4x8x8xf32>) -> tensor<1x4x8x8xf32>
  %c = linalg.conv_2d_nchw_fchw {dilations = dense<1> : vector<2xi64>, strides = dense<1> : vector<2xi64>}
      ins(%p, %w : tensor<1x3x10x10xf32>, tensor<4x3x3x3xf32>) outs(%f : tensor<1x4x8x8xf32>) -> tensor<1x4x8x8xf32>
  %q = tensor.pad %x low[0, 0, 0, 0] high[0, 0, %n, 0] {
  ^bb0(%a: index, %b: index, %c2: index, %d: index):
    tensor.yield %zero : f32
  } : tensor<1x3x8x8xf32> to tensor<1x3x?x8xf32>
  return %c, %q : tensor<1x4x8x8xf32>, tensor<1x3x?x8xf32>
}

// -----

// Not siblings: the two products read different inputs (x and y), so the up projection keeps
// its own region.
// CHECK-LABEL: func.func @products_of_different_inputs
// CHECK-COUNT-2: kforge.fusion_region "contraction"
#map = affine_map<(d0, d1) -> (d0, d1)>
func.func @products_of_different_inputs(%x: tensor<8x64xf32>, %y: tensor<8x64xf32>, %wg: tensor<64x32xf32>, %wu: tensor<64x32xf32>) -> tensor<8x32xf32> {
  %zero = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<8x32xf32>
  %f = linalg.fill ins(%zero : f32) outs(%e : tensor<8x32xf32>) -> tensor<8x32xf32>
  %g = linalg.matmul ins(%x, %wg : tensor<8x64xf32>, tensor<64x32xf32>) outs(%f : tensor<8x32xf32>) -> tensor<8x32xf32>
  %u = linalg.matmul ins(%y, %wu : tensor<8x64xf32>, tensor<64x32xf32>) outs(%f : tensor<8x32xf32>) -> tensor<8x32xf32>
  %h = linalg.generic {indexing_maps = [#map, #map, #map], iterator_types = ["parallel", "parallel"]}
      ins(%g, %u : tensor<8x32xf32>, tensor<8x32xf32>) outs(%e : tensor<8x32xf32>) {
  ^bb0(%a: f32, %b: f32, %out: f32):
    %m = arith.mulf %a, %b : f32
    linalg.yield %m : f32
  } -> tensor<8x32xf32>
  return %h : tensor<8x32xf32>
}

// -----

// A bf16 model's Linear, as torch-mlir writes it: the activation widened to f32 for the
// product, the result narrowed back. The widening of the activation is a cast where it is
// read, like a transpose: recomputed inside the product's region, not a region of its own
// (a pass over x that writes it twice as wide). One region, reading x in bf16.
// CHECK-LABEL: func.func @bf16_linear
// CHECK-SAME: (%[[X:.*]]: tensor<8x64xbf16>, %[[W:.*]]: tensor<64x32xbf16>)
// CHECK-NEXT: %[[R:.*]] = kforge.fusion_region "contraction"
// CHECK-SAME: (%{{.*}} = %[[X]], %{{.*}} = %[[W]]) : (tensor<8x64xbf16>, tensor<64x32xbf16>)
// CHECK:   arith.extf
// CHECK:   arith.extf
// CHECK:   linalg.matmul
// CHECK:   arith.truncf
// CHECK:   kforge.yield
// CHECK-NEXT: }
// CHECK-NEXT: return %[[R]]
// CHECK-NOT: kforge.fusion_region
#map = affine_map<(d0, d1) -> (d0, d1)>
func.func @bf16_linear(%x: tensor<8x64xbf16>, %w: tensor<64x32xbf16>) -> tensor<8x32xbf16> {
  %zero = arith.constant 0.0 : f32
  %ex = tensor.empty() : tensor<8x64xf32>
  %xf = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel"]}
      ins(%x : tensor<8x64xbf16>) outs(%ex : tensor<8x64xf32>) {
  ^bb0(%in: bf16, %out: f32):
    %c = arith.extf %in : bf16 to f32
    linalg.yield %c : f32
  } -> tensor<8x64xf32>
  %ew = tensor.empty() : tensor<64x32xf32>
  %wf = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel"]}
      ins(%w : tensor<64x32xbf16>) outs(%ew : tensor<64x32xf32>) {
  ^bb0(%in: bf16, %out: f32):
    %c = arith.extf %in : bf16 to f32
    linalg.yield %c : f32
  } -> tensor<64x32xf32>
  %e = tensor.empty() : tensor<8x32xf32>
  %f = linalg.fill ins(%zero : f32) outs(%e : tensor<8x32xf32>) -> tensor<8x32xf32>
  %m = linalg.matmul ins(%xf, %wf : tensor<8x64xf32>, tensor<64x32xf32>) outs(%f : tensor<8x32xf32>) -> tensor<8x32xf32>
  %eb = tensor.empty() : tensor<8x32xbf16>
  %t = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel"]}
      ins(%m : tensor<8x32xf32>) outs(%eb : tensor<8x32xbf16>) {
  ^bb0(%in: f32, %out: bf16):
    %c = arith.truncf %in : f32 to bf16
    linalg.yield %c : bf16
  } -> tensor<8x32xbf16>
  return %t : tensor<8x32xbf16>
}

// -----

// A bf16 model's gated MLP as torch-mlir writes a bias-free Linear: bf16 operands, an f32
// accumulator, the product narrowed to bf16 after it. The up projection's group is its
// product and that cast: still sibling products of one x, one region (before, the cast kept
// the up projection a region of its own, written to memory for the gate's region).
// CHECK-LABEL: func.func @gated_bf16
// CHECK: %[[R:.*]] = kforge.fusion_region "contraction"
// CHECK-SAME: fused = ["matmul", "truncf", "sigmoid", "matmul", "truncf", "mul"]
// CHECK-COUNT-2: linalg.matmul
// CHECK: kforge.yield
// CHECK-NOT: kforge.fusion_region
// CHECK: return %[[R]]
// NOSIB-LABEL: func.func @gated_bf16
// NOSIB: %[[UP:.*]] = kforge.fusion_region "contraction"
// NOSIB-SAME: fused = ["matmul", "truncf"]
// NOSIB: kforge.fusion_region "contraction" ({{.*}}%[[UP]]{{.*}})
#map = affine_map<(d0, d1) -> (d0, d1)>
func.func @gated_bf16(%x: tensor<4x8xbf16>, %w1: tensor<8x16xbf16>, %w3: tensor<8x16xbf16>) -> tensor<4x16xbf16> {
  %zero = arith.constant 0.0 : f32
  %one = arith.constant 1.0 : bf16
  %e = tensor.empty() : tensor<4x16xf32>
  %eb = tensor.empty() : tensor<4x16xbf16>
  %f = linalg.fill ins(%zero : f32) outs(%e : tensor<4x16xf32>) -> tensor<4x16xf32>
  %g = linalg.matmul ins(%x, %w1 : tensor<4x8xbf16>, tensor<8x16xbf16>) outs(%f : tensor<4x16xf32>) -> tensor<4x16xf32>
  %gb = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel"]}
      ins(%g : tensor<4x16xf32>) outs(%eb : tensor<4x16xbf16>) {
  ^bb0(%in: f32, %out: bf16):
    %t = arith.truncf %in : f32 to bf16
    linalg.yield %t : bf16
  } -> tensor<4x16xbf16>
  %silu = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel"]}
      ins(%gb : tensor<4x16xbf16>) outs(%eb : tensor<4x16xbf16>) {
  ^bb0(%in: bf16, %out: bf16):
    %n = arith.negf %in : bf16
    %ex = math.exp %n : bf16
    %d = arith.addf %ex, %one : bf16
    %s = arith.divf %in, %d : bf16
    linalg.yield %s : bf16
  } -> tensor<4x16xbf16>
  %u = linalg.matmul ins(%x, %w3 : tensor<4x8xbf16>, tensor<8x16xbf16>) outs(%f : tensor<4x16xf32>) -> tensor<4x16xf32>
  %ub = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel"]}
      ins(%u : tensor<4x16xf32>) outs(%eb : tensor<4x16xbf16>) {
  ^bb0(%in: f32, %out: bf16):
    %t = arith.truncf %in : f32 to bf16
    linalg.yield %t : bf16
  } -> tensor<4x16xbf16>
  %p = linalg.generic {indexing_maps = [#map, #map, #map], iterator_types = ["parallel", "parallel"]}
      ins(%silu, %ub : tensor<4x16xbf16>, tensor<4x16xbf16>) outs(%eb : tensor<4x16xbf16>) {
  ^bb0(%a: bf16, %b: bf16, %out: bf16):
    %y = arith.mulf %a, %b : bf16
    linalg.yield %y : bf16
  } -> tensor<4x16xbf16>
  return %p : tensor<4x16xbf16>
}
