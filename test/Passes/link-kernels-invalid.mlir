// A bad manifest gives a clear error naming the file and what is wrong, and a non-zero exit.
// RUN: not kforge-opt %s --kforge-link-kernels 2>&1 | FileCheck %s --check-prefix=NONE
// RUN: not kforge-opt %s --kforge-link-kernels="manifest=%S/../Inputs/manifests/missing.json" 2>&1 | FileCheck %s --check-prefix=MISSING
// RUN: not kforge-opt %s --kforge-link-kernels="manifest=%S/../Inputs/manifests/not-json.json" 2>&1 | FileCheck %s --check-prefix=NOTJSON
// RUN: not kforge-opt %s --kforge-link-kernels="manifest=%S/../Inputs/manifests/wrong-schema.json" 2>&1 | FileCheck %s --check-prefix=SCHEMA
// RUN: not kforge-opt %s --kforge-link-kernels="manifest=%S/../Inputs/manifests/future-version.json" 2>&1 | FileCheck %s --check-prefix=VERSION
// RUN: not kforge-opt %s --kforge-link-kernels="manifest=%S/../Inputs/manifests/no-symbol.json" 2>&1 | FileCheck %s --check-prefix=SYMBOL
// RUN: not kforge-opt %s --kforge-link-kernels="manifest=%S/../Inputs/manifests/bad-key.json" 2>&1 | FileCheck %s --check-prefix=KEY
// RUN: not kforge-opt %s --kforge-link-kernels="manifest=%S/../Inputs/manifests/bad-target.json" 2>&1 | FileCheck %s --check-prefix=TARGET
// RUN: not kforge-opt %s --kforge-link-kernels="manifest=%S/../Inputs/manifests/no-verification.json" 2>&1 | FileCheck %s --check-prefix=VERIFICATION
// A kernel symbol that clashes with another symbol.
// RUN: not kforge-opt %s --kforge-link-kernels="manifest=%S/../Inputs/manifests/good.json" 2>&1 | FileCheck %s --check-prefix=CLASH

// NONE: link-kernels-invalid.mlir:{{[0-9]+}}:{{[0-9]+}}: error: kforge-link-kernels: no manifest given; use --kforge-link-kernels="manifest=PATH"
// MISSING: error: kforge-link-kernels: manifest '{{.*}}missing.json': cannot read: No such file or directory
// NOTJSON: error: kforge-link-kernels: manifest '{{.*}}not-json.json': not valid JSON: {{.*}}
// SCHEMA: error: kforge-link-kernels: manifest '{{.*}}wrong-schema.json': field 'schema' must be "kforge.manifest"
// VERSION: error: kforge-link-kernels: manifest '{{.*}}future-version.json': field 'version' must be 1 (this kforge-opt reads manifest version 1)
// SYMBOL: error: kforge-link-kernels: manifest '{{.*}}no-symbol.json': kernels["00000000000000aa"]: field 'symbol' must be an identifier
// KEY: error: kforge-link-kernels: manifest '{{.*}}bad-key.json': kernels["xyz"]: the key must be a region hash of 16 lowercase hex digits
// TARGET: error: kforge-link-kernels: manifest '{{.*}}bad-target.json': kernels["00000000000000aa"]: field 'target' must be BACKEND or BACKEND:ARCH with BACKEND one of cuda, xpu, cpu
// VERIFICATION: error: kforge-link-kernels: manifest '{{.*}}no-verification.json': kernels["00000000000000aa"]: field 'verification' must be an object
// CLASH: link-kernels-invalid.mlir:[[@LINE+5]]:{{[0-9]+}}: error: kforge-link-kernels: kernel symbol @kforge_kernel_00000000000000aa_cuda for region 00000000000000aa clashes with an existing symbol of another kind or type

func.func private @kforge_kernel_00000000000000aa_cuda(tensor<4xf32>) -> tensor<4xf32>

func.func @main(%a: tensor<4x8xf32>, %b: tensor<8x4xf32>) -> tensor<4x4xf32> {
  %0 = call @kforge_region_00000000000000aa(%a, %b) : (tensor<4x8xf32>, tensor<8x4xf32>) -> tensor<4x4xf32>
  return %0 : tensor<4x4xf32>
}
func.func private @kforge_region_00000000000000aa(%a: tensor<4x8xf32>, %b: tensor<8x4xf32>) -> tensor<4x4xf32> attributes {kforge.hash = "00000000000000aa"} {
  %zero = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<4x4xf32>
  %f = linalg.fill ins(%zero : f32) outs(%e : tensor<4x4xf32>) -> tensor<4x4xf32>
  %m = linalg.matmul ins(%a, %b : tensor<4x8xf32>, tensor<8x4xf32>) outs(%f : tensor<4x4xf32>) -> tensor<4x4xf32>
  return %m : tensor<4x4xf32>
}
