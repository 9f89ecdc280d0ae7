// Targets are BACKEND or BACKEND:ARCH, checked against one list of backends (cuda, xpu, cpu).
// `target=` links one backend at any architecture, or one architecture (and kernels recorded
// without one).
// RUN: kforge-opt %s --kforge-link-kernels="manifest=%S/../Inputs/manifests/archs.json" | FileCheck %s --check-prefix=ALL
// RUN: kforge-opt %s --kforge-link-kernels="manifest=%S/../Inputs/manifests/archs.json target=cuda" | FileCheck %s --check-prefix=CUDA
// RUN: kforge-opt %s --kforge-link-kernels="manifest=%S/../Inputs/manifests/archs.json target=cuda:sm_90" | FileCheck %s --check-prefix=SM90
// RUN: kforge-opt %s --kforge-link-kernels="manifest=%S/../Inputs/manifests/archs.json target=xpu:pvc" | FileCheck %s --check-prefix=PVC
// RUN: not kforge-opt %s --kforge-link-kernels="manifest=%S/../Inputs/manifests/archs.json target=tpu:v5" 2>&1 | FileCheck %s --check-prefix=BADOPT
// RUN: not kforge-opt %s --kforge-link-kernels="manifest=%S/../Inputs/manifests/bad-arch.json" 2>&1 | FileCheck %s --check-prefix=BADARCH

// ALL-DAG: kforge.kernel @k_a1_sm90 {{.*}} target "cuda:sm_90" hash "00000000000000a1"
// ALL-DAG: kforge.kernel @k_a2_sm80 {{.*}} target "cuda:sm_80" hash "00000000000000a2"
// ALL-DAG: kforge.kernel @k_a3_cuda {{.*}} target "cuda" hash "00000000000000a3"
// ALL-DAG: kforge.kernel @k_a4_pvc {{.*}} target "xpu:pvc" hash "00000000000000a4"

// CUDA-LABEL: func.func @main
// CUDA-NEXT: kforge.custom_call @k_a1_sm90
// CUDA-NEXT: kforge.custom_call @k_a2_sm80
// CUDA-NEXT: kforge.custom_call @k_a3_cuda
// CUDA-NEXT: call @kforge_region_00000000000000a4

// SM90-LABEL: func.func @main
// SM90-NEXT: kforge.custom_call @k_a1_sm90
// SM90-NEXT: call @kforge_region_00000000000000a2
// SM90-NEXT: kforge.custom_call @k_a3_cuda
// SM90-NEXT: call @kforge_region_00000000000000a4

// PVC-LABEL: func.func @main
// PVC-NEXT: call @kforge_region_00000000000000a1
// PVC-NEXT: call @kforge_region_00000000000000a2
// PVC-NEXT: call @kforge_region_00000000000000a3
// PVC-NEXT: kforge.custom_call @k_a4_pvc

// BADOPT: error: kforge-link-kernels: option target='tpu:v5' must be BACKEND or BACKEND:ARCH with BACKEND one of cuda, xpu, cpu
// BADARCH: error: kforge-link-kernels: manifest '{{.*}}bad-arch.json': kernels["00000000000000aa"]: field 'target' must be BACKEND or BACKEND:ARCH with BACKEND one of cuda, xpu, cpu

func.func @main(%a: tensor<4xf32>) -> tensor<4xf32> {
  %0 = call @kforge_region_00000000000000a1(%a) : (tensor<4xf32>) -> tensor<4xf32>
  %1 = call @kforge_region_00000000000000a2(%0) : (tensor<4xf32>) -> tensor<4xf32>
  %2 = call @kforge_region_00000000000000a3(%1) : (tensor<4xf32>) -> tensor<4xf32>
  %3 = call @kforge_region_00000000000000a4(%2) : (tensor<4xf32>) -> tensor<4xf32>
  return %3 : tensor<4xf32>
}
func.func private @kforge_region_00000000000000a1(%a: tensor<4xf32>) -> tensor<4xf32> attributes {kforge.hash = "00000000000000a1", kforge.root_kind = "elementwise"} {
  return %a : tensor<4xf32>
}
func.func private @kforge_region_00000000000000a2(%a: tensor<4xf32>) -> tensor<4xf32> attributes {kforge.hash = "00000000000000a2", kforge.root_kind = "elementwise"} {
  return %a : tensor<4xf32>
}
func.func private @kforge_region_00000000000000a3(%a: tensor<4xf32>) -> tensor<4xf32> attributes {kforge.hash = "00000000000000a3", kforge.root_kind = "elementwise"} {
  return %a : tensor<4xf32>
}
func.func private @kforge_region_00000000000000a4(%a: tensor<4xf32>) -> tensor<4xf32> attributes {kforge.hash = "00000000000000a4", kforge.root_kind = "elementwise"} {
  return %a : tensor<4xf32>
}
