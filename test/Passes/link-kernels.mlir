// RUN: kforge-opt %s --kforge-link-kernels="manifest=%S/../Inputs/manifests/good.json" | FileCheck %s
// RUN: kforge-opt %s --kforge-link-kernels="manifest=%S/../Inputs/manifests/good.json emit-func-calls=true" | FileCheck %s --check-prefix=FUNC
// RUN: kforge-opt %s --kforge-link-kernels="manifest=%S/../Inputs/manifests/good.json target=xpu" | FileCheck %s --check-prefix=XPU
// The linked module parses, verifies and links again to the same module.
// RUN: kforge-opt %s --kforge-link-kernels="manifest=%S/../Inputs/manifests/good.json" | kforge-opt --kforge-link-kernels="manifest=%S/../Inputs/manifests/good.json" | FileCheck %s

// Verified kernels are declared once each, first in the module, with their record.
// CHECK: kforge.kernel @kforge_kernel_00000000000000aa_cuda : (tensor<4x8xf32>, tensor<8x4xf32>) -> tensor<4x4xf32> target "cuda" hash "00000000000000aa" launch {config = {BLOCK_M = 128 : i64}, grid = [64, 32, 1], num_stages = 3 : i64, num_warps = 8 : i64} verification {atol = 1.000000e-04 : f64, device = "NVIDIA H200", max_abs_err = 3.100000e-06 : f64, rtol = 1.000000e-04 : f64, seeds = [1, 2, 3], status = "verified"} {kforge.precision = "strict", kforge.provider = "builtin", kforge.source = "kernels/00000000000000aa/kernel.py", kforge.time_ms = 4.120000e-01 : f64}
// CHECK: kforge.kernel @kforge_kernel_00000000000000cc_xpu : (tensor<4x4xf32>) -> tensor<4x4xf32> target "xpu" hash "00000000000000cc" launch {} verification {status = "verified"}
// CHECK-NOT: kforge.kernel
// CHECK-LABEL: func.func @main
// CHECK-NEXT: %[[A:.*]] = kforge.custom_call @kforge_kernel_00000000000000aa_cuda(%arg0, %arg1) : (tensor<4x8xf32>, tensor<8x4xf32>) -> tensor<4x4xf32>
// A candidate (not verified) kernel is never linked: the region call stays.
// CHECK-NEXT: %[[B:.*]] = call @kforge_region_00000000000000bb(%[[A]])
// CHECK-NEXT: %[[C:.*]] = kforge.custom_call @kforge_kernel_00000000000000cc_xpu(%[[B]])
// A region the manifest does not know stays.
// CHECK-NEXT: %[[D:.*]] = call @kforge_region_00000000000000ee(%[[C]])
// CHECK-NEXT: %[[E:.*]] = kforge.custom_call @kforge_kernel_00000000000000aa_cuda(%arg0, %arg1)
// CHECK-NEXT: return
// The linked regions' reference functions are gone; the others stay.
// CHECK-NOT: @kforge_region_00000000000000aa
// CHECK-DAG: func.func private @kforge_region_00000000000000bb
// CHECK-DAG: func.func private @kforge_region_00000000000000ee
// CHECK-NOT: @kforge_region_00000000000000cc

// FUNC-NOT: kforge.kernel
// FUNC-NOT: kforge.custom_call
// FUNC: func.func private @kforge_kernel_00000000000000aa_cuda(tensor<4x8xf32>, tensor<8x4xf32>) -> tensor<4x4xf32> attributes {kforge.kernel, kforge.launch = {{.*}}, kforge.region_hash = "00000000000000aa", {{.*}}kforge.target = "cuda", {{.*}}kforge.verification = {{.*}}status = "verified"}}
// FUNC: func.func private @kforge_kernel_00000000000000cc_xpu(tensor<4x4xf32>) -> tensor<4x4xf32>
// FUNC-LABEL: func.func @main
// FUNC-NEXT: call @kforge_kernel_00000000000000aa_cuda(%arg0, %arg1)
// FUNC-NEXT: call @kforge_region_00000000000000bb
// FUNC-NEXT: call @kforge_kernel_00000000000000cc_xpu
// FUNC-NEXT: call @kforge_region_00000000000000ee
// FUNC-NEXT: call @kforge_kernel_00000000000000aa_cuda(%arg0, %arg1)

// XPU-NOT: kforge_kernel_00000000000000aa_cuda
// XPU: kforge.custom_call @kforge_kernel_00000000000000cc_xpu
// XPU: func.func private @kforge_region_00000000000000aa

#map = affine_map<(d0, d1) -> (d0, d1)>
func.func @main(%a: tensor<4x8xf32>, %b: tensor<8x4xf32>) -> (tensor<4x4xf32>, tensor<4x4xf32>) {
  %0 = call @kforge_region_00000000000000aa(%a, %b) : (tensor<4x8xf32>, tensor<8x4xf32>) -> tensor<4x4xf32>
  %1 = call @kforge_region_00000000000000bb(%0) : (tensor<4x4xf32>) -> tensor<4x4xf32>
  %2 = call @kforge_region_00000000000000cc(%1) : (tensor<4x4xf32>) -> tensor<4x4xf32>
  %3 = call @kforge_region_00000000000000ee(%2) : (tensor<4x4xf32>) -> tensor<4x4xf32>
  %4 = call @kforge_region_00000000000000aa(%a, %b) : (tensor<4x8xf32>, tensor<8x4xf32>) -> tensor<4x4xf32>
  return %3, %4 : tensor<4x4xf32>, tensor<4x4xf32>
}
func.func private @kforge_region_00000000000000aa(%a: tensor<4x8xf32>, %b: tensor<8x4xf32>) -> tensor<4x4xf32> attributes {kforge.hash = "00000000000000aa", kforge.root_kind = "contraction"} {
  %zero = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<4x4xf32>
  %f = linalg.fill ins(%zero : f32) outs(%e : tensor<4x4xf32>) -> tensor<4x4xf32>
  %m = linalg.matmul ins(%a, %b : tensor<4x8xf32>, tensor<8x4xf32>) outs(%f : tensor<4x4xf32>) -> tensor<4x4xf32>
  return %m : tensor<4x4xf32>
}
func.func private @kforge_region_00000000000000bb(%a: tensor<4x4xf32>) -> tensor<4x4xf32> attributes {kforge.hash = "00000000000000bb", kforge.root_kind = "elementwise"} {
  %e = tensor.empty() : tensor<4x4xf32>
  %y = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel"]} ins(%a : tensor<4x4xf32>) outs(%e : tensor<4x4xf32>) {
  ^bb0(%in: f32, %out: f32):
    %v = math.exp %in : f32
    linalg.yield %v : f32
  } -> tensor<4x4xf32>
  return %y : tensor<4x4xf32>
}
func.func private @kforge_region_00000000000000cc(%a: tensor<4x4xf32>) -> tensor<4x4xf32> attributes {kforge.hash = "00000000000000cc", kforge.root_kind = "elementwise"} {
  return %a : tensor<4x4xf32>
}
func.func private @kforge_region_00000000000000ee(%a: tensor<4x4xf32>) -> tensor<4x4xf32> attributes {kforge.hash = "00000000000000ee", kforge.root_kind = "elementwise"} {
  return %a : tensor<4x4xf32>
}
