// Upstream mlir-opt 22 loads the KForge pass plugin and runs its passes.
// RUN: mlir-opt %s --load-pass-plugin=%kforge_plugin --pass-pipeline='builtin.module(kforge-print-region-stats)' -o /dev/null 2>&1 | FileCheck %s

// CHECK: kforge region stats: @matmul
// CHECK-NEXT: linalg ops: 1 (contractions: 1, convolutions: 0, reductions: 0, elementwise: 0)
func.func @matmul(%a: tensor<4x8xf32>, %b: tensor<8x16xf32>, %c: tensor<4x16xf32>) -> tensor<4x16xf32> {
  %m = linalg.matmul ins(%a, %b : tensor<4x8xf32>, tensor<8x16xf32>) outs(%c : tensor<4x16xf32>) -> tensor<4x16xf32>
  return %m : tensor<4x16xf32>
}
