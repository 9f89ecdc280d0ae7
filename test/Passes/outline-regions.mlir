// RUN: kforge-opt %s -split-input-file --kforge-outline-regions | FileCheck %s

// A region becomes a private function and a call; weights keep their names; the metadata is
// on the function.
// CHECK-LABEL: func.func @main
// CHECK-SAME: (%[[X:.*]]: tensor<4x8xf32>, %[[W:.*]]: tensor<8x16xf32> {kforge.weight = "fc.weight"})
// CHECK-NEXT: %[[R:.*]] = call @kforge_region_[[H:[0-9a-f]{16}]](%[[X]], %[[W]]) : (tensor<4x8xf32>, tensor<8x16xf32>) -> tensor<4x16xf32>
// CHECK-NEXT: return %[[R]]
// CHECK: func.func private @kforge_region_[[H]](%{{.*}}: tensor<4x8xf32>, %{{.*}}: tensor<8x16xf32> {kforge.weight = "fc.weight"}) -> tensor<4x16xf32>
// 2*4*16*8 (matmul) + 4*16 (relu); 4*8*4 + 8*16*4 + 4*16*4 bytes
// CHECK-SAME: attributes {kforge.flops = 1088 : i64, kforge.fused = ["matmul", "relu"], kforge.hash = "[[H]]", kforge.min_bytes = 896 : i64, kforge.root_kind = "contraction"}
// CHECK: linalg.matmul
// CHECK: return
#map = affine_map<(d0, d1) -> (d0, d1)>
func.func @main(%x: tensor<4x8xf32>, %w: tensor<8x16xf32> {kforge.weight = "fc.weight"}) -> tensor<4x16xf32> {
  %r = kforge.fusion_region "contraction" (%a = %x, %b = %w) : (tensor<4x8xf32>, tensor<8x16xf32>) -> tensor<4x16xf32> attributes {fused = ["matmul", "relu"]} {
    %zero = arith.constant 0.0 : f32
    %e = tensor.empty() : tensor<4x16xf32>
    %f = linalg.fill ins(%zero : f32) outs(%e : tensor<4x16xf32>) -> tensor<4x16xf32>
    %m = linalg.matmul ins(%a, %b : tensor<4x8xf32>, tensor<8x16xf32>) outs(%f : tensor<4x16xf32>) -> tensor<4x16xf32>
    %y = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel"]}
        ins(%m : tensor<4x16xf32>) outs(%e : tensor<4x16xf32>) {
    ^bb0(%in: f32, %out: f32):
      %v = arith.maximumf %in, %zero : f32
      linalg.yield %v : f32
    } -> tensor<4x16xf32>
    kforge.yield %y : tensor<4x16xf32>
  }
  return %r : tensor<4x16xf32>
}

// -----

// Identical regions (here in two functions, with different SSA names) share one function;
// a different region gets its own.
// CHECK-LABEL: func.func @first
// CHECK: call @kforge_region_[[A:[0-9a-f]{16}]]
// CHECK: func.func private @kforge_region_[[A]]
// CHECK: math.exp
// CHECK-LABEL: func.func @second
// CHECK: call @kforge_region_[[A]]
// CHECK: call @kforge_region_[[B:[0-9a-f]{16}]]
// CHECK-NOT: func.func private @kforge_region_[[A]]
// CHECK: func.func private @kforge_region_[[B]]
// CHECK: math.tanh
#map = affine_map<(d0) -> (d0)>
func.func @first(%x: tensor<8xf32>) -> tensor<8xf32> {
  %r = kforge.fusion_region "elementwise" (%a = %x) : (tensor<8xf32>) -> tensor<8xf32> {
    %e = tensor.empty() : tensor<8xf32>
    %y = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel"]} ins(%a : tensor<8xf32>) outs(%e : tensor<8xf32>) {
    ^bb0(%in: f32, %out: f32):
      %v = math.exp %in : f32
      linalg.yield %v : f32
    } -> tensor<8xf32>
    kforge.yield %y : tensor<8xf32>
  }
  return %r : tensor<8xf32>
}
func.func @second(%input: tensor<8xf32>) -> tensor<8xf32> {
  %r = kforge.fusion_region "elementwise" (%in0 = %input) : (tensor<8xf32>) -> tensor<8xf32> {
    %empty = tensor.empty() : tensor<8xf32>
    %exp = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel"]} ins(%in0 : tensor<8xf32>) outs(%empty : tensor<8xf32>) {
    ^bb0(%p: f32, %q: f32):
      %v = math.exp %p : f32
      linalg.yield %v : f32
    } -> tensor<8xf32>
    kforge.yield %exp : tensor<8xf32>
  }
  %s = kforge.fusion_region "elementwise" (%in1 = %r) : (tensor<8xf32>) -> tensor<8xf32> {
    %empty = tensor.empty() : tensor<8xf32>
    %t = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel"]} ins(%in1 : tensor<8xf32>) outs(%empty : tensor<8xf32>) {
    ^bb0(%p: f32, %q: f32):
      %v = math.tanh %p : f32
      linalg.yield %v : f32
    } -> tensor<8xf32>
    kforge.yield %t : tensor<8xf32>
  }
  return %s : tensor<8xf32>
}

// -----

// Dynamic dimensions count as 1 in the estimates.
// CHECK-LABEL: func.func @dynamic
// CHECK: func.func private @kforge_region_
// CHECK-SAME: kforge.flops = 32 : i64
// CHECK-SAME: kforge.min_bytes = 256 : i64
#map = affine_map<(d0, d1) -> (d0, d1)>
func.func @dynamic(%x: tensor<?x32xf32>) -> tensor<?x32xf32> {
  %r = kforge.fusion_region "elementwise" (%a = %x) : (tensor<?x32xf32>) -> tensor<?x32xf32> {
    %c0 = arith.constant 0 : index
    %d = tensor.dim %a, %c0 : tensor<?x32xf32>
    %e = tensor.empty(%d) : tensor<?x32xf32>
    %y = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel"]} ins(%a : tensor<?x32xf32>) outs(%e : tensor<?x32xf32>) {
    ^bb0(%in: f32, %out: f32):
      %v = math.sqrt %in : f32
      linalg.yield %v : f32
    } -> tensor<?x32xf32>
    kforge.yield %y : tensor<?x32xf32>
  }
  return %r : tensor<?x32xf32>
}

