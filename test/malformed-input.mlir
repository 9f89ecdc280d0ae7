// Malformed input gives a located diagnostic and a non-zero exit, never a crash.
// RUN: not kforge-opt %s 2>&1 | FileCheck %s
// RUN: not kforge-opt %s --kforge-print-region-stats 2>&1 | FileCheck %s
// RUN: not kforge-opt %s --kforge-print-region-stats 2>&1 | FileCheck %s --check-prefix=NOCRASH
// NOCRASH-NOT: PLEASE submit a bug report
// NOCRASH-NOT: Stack dump

// CHECK: malformed-input.mlir:[[@LINE+3]]:{{[0-9]+}}: error: {{.*}}
func.func @bad(%arg0: tensor<4xf32>) -> tensor<4xf32> {
  %0 = arith.addf %arg0, %arg0 : tensor<4xf32>
  %1 = linalg.matmul ins(%0 : tensor<4xf32>
  return %1 : tensor<4xf32>
}
