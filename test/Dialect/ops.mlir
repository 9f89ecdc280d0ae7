// RUN: kforge-opt %s | FileCheck %s
// Round trip: the printed form parses back to the same IR.
// RUN: kforge-opt %s | kforge-opt | FileCheck %s
// The generic form round-trips too.
// RUN: kforge-opt %s --mlir-print-op-generic | kforge-opt | FileCheck %s

// CHECK-LABEL: func.func @region
func.func @region(%arg0: tensor<4x8xf32>, %arg1: tensor<8x16xf32>) -> tensor<4x16xf32> {
  // CHECK: %[[R:.*]] = kforge.fusion_region "contraction" (%[[A:.*]] = %arg0, %[[B:.*]] = %arg1) : (tensor<4x8xf32>, tensor<8x16xf32>) -> tensor<4x16xf32> {
  // CHECK:   %[[E:.*]] = tensor.empty() : tensor<4x16xf32>
  // CHECK:   %[[M:.*]] = linalg.matmul ins(%[[A]], %[[B]] : tensor<4x8xf32>, tensor<8x16xf32>)
  // CHECK:   kforge.yield %[[M]] : tensor<4x16xf32>
  // CHECK: }
  %0 = kforge.fusion_region "contraction" (%a = %arg0, %b = %arg1) : (tensor<4x8xf32>, tensor<8x16xf32>) -> tensor<4x16xf32> {
    %e = tensor.empty() : tensor<4x16xf32>
    %m = linalg.matmul ins(%a, %b : tensor<4x8xf32>, tensor<8x16xf32>) outs(%e : tensor<4x16xf32>) -> tensor<4x16xf32>
    kforge.yield %m : tensor<4x16xf32>
  }
  // CHECK: return %[[R]]
  return %0 : tensor<4x16xf32>
}

// CHECK-LABEL: func.func @multi_result_with_attrs
func.func @multi_result_with_attrs(%arg0: tensor<?x8xf32>) -> (tensor<?x8xf32>, tensor<?x8xf32>) {
  // CHECK: kforge.fusion_region "elementwise" (%{{.*}} = %arg0) : (tensor<?x8xf32>) -> (tensor<?x8xf32>, tensor<?x8xf32>) attributes {fused = ["neg", "copy"]} {
  // CHECK: kforge.yield %{{.*}}, %{{.*}} : tensor<?x8xf32>, tensor<?x8xf32>
  %0:2 = kforge.fusion_region "elementwise" (%x = %arg0) : (tensor<?x8xf32>) -> (tensor<?x8xf32>, tensor<?x8xf32>) attributes {fused = ["neg", "copy"]} {
    %n = linalg.negf ins(%x : tensor<?x8xf32>) outs(%x : tensor<?x8xf32>) -> tensor<?x8xf32>
    kforge.yield %n, %x : tensor<?x8xf32>, tensor<?x8xf32>
  }
  return %0#0, %0#1 : tensor<?x8xf32>, tensor<?x8xf32>
}

// CHECK-LABEL: func.func @no_inputs
func.func @no_inputs() -> tensor<4xf32> {
  // CHECK: kforge.fusion_region "elementwise" () : () -> tensor<4xf32> {
  %0 = kforge.fusion_region "elementwise" () : () -> tensor<4xf32> {
    %c = arith.constant dense<1.0> : tensor<4xf32>
    kforge.yield %c : tensor<4xf32>
  }
  return %0 : tensor<4xf32>
}

// CHECK: kforge.kernel @kforge_kernel_3f9a0c1d2e4b5a69_cuda : (tensor<4x8xf32>, tensor<8x16xf32>) -> tensor<4x16xf32> target "cuda" hash "3f9a0c1d2e4b5a69" launch {grid = [1, 1, 1], num_warps = 4 : i64} verification {max_abs_err = 3.100000e-06 : f64, status = "verified"}
kforge.kernel @kforge_kernel_3f9a0c1d2e4b5a69_cuda : (tensor<4x8xf32>, tensor<8x16xf32>) -> tensor<4x16xf32>
    target "cuda" hash "3f9a0c1d2e4b5a69"
    launch {grid = [1, 1, 1], num_warps = 4 : i64}
    verification {status = "verified", max_abs_err = 3.1e-06 : f64}

// A target may name its architecture.
// CHECK: kforge.kernel @kforge_kernel_3f9a0c1d2e4b5a69_sm90 : {{.*}} target "cuda:sm_90" hash "3f9a0c1d2e4b5a69"
kforge.kernel @kforge_kernel_3f9a0c1d2e4b5a69_sm90 : (tensor<4x8xf32>, tensor<8x16xf32>) -> tensor<4x16xf32>
    target "cuda:sm_90" hash "3f9a0c1d2e4b5a69"
    launch {} verification {status = "verified"}

// CHECK-LABEL: func.func @call
func.func @call(%arg0: tensor<4x8xf32>, %arg1: tensor<8x16xf32>) -> tensor<4x16xf32> {
  // CHECK: %[[C:.*]] = kforge.custom_call @kforge_kernel_3f9a0c1d2e4b5a69_cuda(%arg0, %arg1) : (tensor<4x8xf32>, tensor<8x16xf32>) -> tensor<4x16xf32>
  %0 = kforge.custom_call @kforge_kernel_3f9a0c1d2e4b5a69_cuda(%arg0, %arg1) : (tensor<4x8xf32>, tensor<8x16xf32>) -> tensor<4x16xf32>
  return %0 : tensor<4x16xf32>
}
