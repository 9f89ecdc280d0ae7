// RUN: rm -rf %t && mkdir -p %t
// No directory: an error that says what to do.
// RUN: not kforge-opt %s --kforge-export-regions 2>&1 | FileCheck %s --check-prefix=NODIR
// NODIR: error: kforge-export-regions: the output directory is not set; use --kforge-export-regions="dir=PATH"
// A directory that cannot be created (a file is in the way).
// RUN: touch %t/file
// RUN: not kforge-opt %s --kforge-export-regions="dir=%t/file/sub" 2>&1 | FileCheck %s --check-prefix=NOTADIR
// NOTADIR: error: kforge-export-regions: cannot create directory '{{.*}}file/sub'
// A region the kernel spec cannot describe: a located error naming the region and the reason.
// RUN: not kforge-opt %s --kforge-export-regions="dir=%t/out" 2>&1 | FileCheck %s --check-prefix=BADREGION
// BADREGION: export-regions-invalid.mlir:[[@LINE+6]]:{{[0-9]+}}: error: kforge-export-regions: region @kforge_region_00000000000000aa cannot be exported: the kernel spec has no record for 'tensor.extract_slice'
// An op outside every region that the host plan cannot describe is a warning and an `opaque`
// step.
// BADREGION: export-regions-invalid.mlir:[[@LINE+9]]:{{[0-9]+}}: warning: kforge-export-regions: this op stays outside every region and the host plan cannot describe it (the kernel spec has no record for 'func.call'); it is written as an 'opaque' step

func.func private @kforge_region_00000000000000aa(%a: tensor<8xf32>) -> tensor<4xf32> attributes {kforge.hash = "00000000000000aa", kforge.root_kind = "elementwise"} {
  %s = tensor.extract_slice %a[0] [4] [1] : tensor<8xf32> to tensor<4xf32>
  return %s : tensor<4xf32>
}

func.func @main(%x: tensor<8xf32>) -> tensor<4xf32> {
  %r = call @kforge_region_00000000000000aa(%x) : (tensor<8xf32>) -> tensor<4xf32>
  %p = call @external(%r) : (tensor<4xf32>) -> tensor<4xf32>
  return %p : tensor<4xf32>
}

func.func private @external(tensor<4xf32>) -> tensor<4xf32>
