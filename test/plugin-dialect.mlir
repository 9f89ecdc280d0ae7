// The plugin .so is also a dialect plugin: with --load-dialect-plugin, upstream mlir-opt parses,
// verifies and prints kforge ops.
// RUN: mlir-opt %s --load-dialect-plugin=%kforge_plugin | FileCheck %s
// RUN: mlir-opt %s --load-dialect-plugin=%kforge_plugin --load-pass-plugin=%kforge_plugin --pass-pipeline='builtin.module(kforge-print-region-stats)' -o /dev/null 2>&1 | FileCheck %s --check-prefix=STATS

// Linking from the plugin: kforge.kernel and kforge.custom_call parse, verify and print in
// upstream mlir-opt.
// RUN: mlir-opt %S/Passes/link-kernels.mlir --load-dialect-plugin=%kforge_plugin --load-pass-plugin=%kforge_plugin --pass-pipeline='builtin.module(kforge-link-kernels{manifest=%S/Inputs/manifests/good.json})' | mlir-opt --load-dialect-plugin=%kforge_plugin | FileCheck %s --check-prefix=LINK
// LINK: kforge.kernel @kforge_kernel_00000000000000aa_cuda
// LINK: kforge.custom_call @kforge_kernel_00000000000000aa_cuda

// CHECK: kforge.fusion_region "contraction" (%{{.*}} = %arg0, %{{.*}} = %arg1, %{{.*}} = %arg2)
// CHECK: kforge.yield
// STATS: kforge region stats: @matmul
func.func @matmul(%a: tensor<4x8xf32>, %b: tensor<8x16xf32>, %c: tensor<4x16xf32>) -> tensor<4x16xf32> {
  %0 = kforge.fusion_region "contraction" (%x = %a, %y = %b, %z = %c) : (tensor<4x8xf32>, tensor<8x16xf32>, tensor<4x16xf32>) -> tensor<4x16xf32> {
    %m = linalg.matmul ins(%x, %y : tensor<4x8xf32>, tensor<8x16xf32>) outs(%z : tensor<4x16xf32>) -> tensor<4x16xf32>
    kforge.yield %m : tensor<4x16xf32>
  }
  return %0 : tensor<4x16xf32>
}
