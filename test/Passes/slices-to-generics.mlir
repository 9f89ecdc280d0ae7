// RUN: kforge-opt %s -split-input-file --kforge-slices-to-generics | FileCheck %s

// Offsets add, strides scale, dropped unit dimensions become constants.
// CHECK-DAG: #[[IN:.*]] = affine_map<(d0, d1) -> (d0 + 1, 3, d1 * 2 + 4)>
// CHECK-DAG: #[[OUT:.*]] = affine_map<(d0, d1) -> (d0, d1)>
// CHECK-LABEL: func.func @static_slice
// CHECK-SAME: (%[[X:.*]]: tensor<4x5x16xf32>)
// CHECK: %[[E:.*]] = tensor.empty() : tensor<2x6xf32>
// CHECK: %[[S:.*]] = linalg.generic {indexing_maps = [#[[IN]], #[[OUT]]], iterator_types = ["parallel", "parallel"]} ins(%[[X]] : tensor<4x5x16xf32>) outs(%[[E]] : tensor<2x6xf32>)
// CHECK-NEXT: ^bb0(%[[A:.*]]: f32, %{{.*}}: f32):
// CHECK-NEXT:   linalg.yield %[[A]] : f32
// CHECK: return %[[S]]
func.func @static_slice(%x: tensor<4x5x16xf32>) -> tensor<2x6xf32> {
  %s = tensor.extract_slice %x[1, 3, 4] [2, 1, 6] [1, 1, 2] : tensor<4x5x16xf32> to tensor<2x6xf32>
  return %s : tensor<2x6xf32>
}

// -----

// Dynamic slices stay.
// CHECK-LABEL: func.func @dynamic_slice
// CHECK: tensor.extract_slice
// CHECK-NOT: linalg.generic
func.func @dynamic_slice(%x: tensor<8xf32>, %o: index) -> tensor<4xf32> {
  %s = tensor.extract_slice %x[%o] [4] [1] : tensor<8xf32> to tensor<4xf32>
  return %s : tensor<4xf32>
}
