// RUN: kforge-opt %s --kforge-pipeline | FileCheck %s
// Idempotent: a second run changes nothing.
// RUN: kforge-opt %s --kforge-pipeline -o %t.1.mlir
// RUN: kforge-opt %t.1.mlir --kforge-pipeline -o %t.2.mlir
// RUN: diff %t.1.mlir %t.2.mlir
// The same pipeline from the plugin in upstream mlir-opt 22 gives the same module.
// RUN: mlir-opt %s --load-pass-plugin=%kforge_plugin --pass-pipeline='builtin.module(kforge-pipeline)' -o %t.plugin.mlir
// RUN: diff %t.1.mlir %t.plugin.mlir
// ... and exports the same files.
// RUN: rm -rf %t.a %t.b
// RUN: kforge-opt %s --kforge-pipeline="dir=%t.a" -o /dev/null
// RUN: mlir-opt %s --load-pass-plugin=%kforge_plugin --pass-pipeline='builtin.module(kforge-pipeline{dir=%t.b})' -o /dev/null
// RUN: diff -r %t.a %t.b
// Options reach the region formation.
// RUN: kforge-opt %s --kforge-pipeline="consumers=none standalone=false" | FileCheck %s --check-prefix=NARROW
// Upstream elementwise fusion first: fewer, larger generics in the same regions.
// RUN: kforge-opt %s --kforge-pipeline="fuse-elementwise=true" | FileCheck %s --check-prefix=FUSED

// Named ops are generalized; each GEMM gets its epilogue.
// CHECK-LABEL: func.func @mlp
// CHECK-NEXT: %[[H:.*]] = call @kforge_region_[[A:[0-9a-f]+]](
// CHECK-NEXT: %[[O:.*]] = call @kforge_region_[[B:[0-9a-f]+]](
// CHECK-NEXT: return %[[O]]
// CHECK: func.func private @kforge_region_[[B]]
// CHECK-SAME: kforge.fused = ["matmul", "tanh"]
// CHECK-NOT: linalg.matmul
// CHECK: func.func private @kforge_region_[[A]]
// CHECK-SAME: kforge.fused = ["matmul", "relu"]
// CHECK-NOT: linalg.matmul

// NARROW-LABEL: func.func @mlp
// NARROW: call @kforge_region_
// NARROW: linalg.generic
// NARROW: call @kforge_region_
// NARROW: linalg.generic
// NARROW: return

// FUSED-LABEL: func.func @mlp
// FUSED: call @kforge_region_
// FUSED: call @kforge_region_
// FUSED: return
#map = affine_map<(d0, d1) -> (d0, d1)>
func.func @mlp(%x: tensor<4x8xf32>, %w1: tensor<8x8xf32> {kforge.weight = "l1.weight"}, %w2: tensor<8x8xf32> {kforge.weight = "l2.weight"}) -> tensor<4x8xf32> {
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
