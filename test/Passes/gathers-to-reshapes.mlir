// RUN: kforge-opt %s -split-input-file --kforge-gathers-to-reshapes | FileCheck %s

// Indices that visit the source row-major, element for element (with torch's wrap of negative
// indices): a reshape.
// CHECK-LABEL: func.func @row_major
// CHECK-SAME: (%[[SRC:.*]]: tensor<3x4xf32>)
// CHECK-NEXT: %[[FLAT:.*]] = tensor.collapse_shape %[[SRC]] {{\[\[}}0, 1]] : tensor<3x4xf32> into tensor<12xf32>
// CHECK-NEXT: %[[OUT:.*]] = tensor.expand_shape %[[FLAT]] {{\[\[}}0, 1]] output_shape [2, 6] : tensor<12xf32> into tensor<2x6xf32>
// CHECK-NEXT: return %[[OUT]]
#id = affine_map<(d0, d1) -> (d0, d1)>
func.func @row_major(%src: tensor<3x4xf32>) -> tensor<2x6xf32> {
  %i0 = arith.constant dense<[[0, 0, 0, 0, 1, 1], [1, 1, 2, 2, 2, 2]]> : tensor<2x6xi64>
  %i1 = arith.constant dense<[[0, 1, 2, 3, 0, 1], [2, -1, 0, 1, 2, 3]]> : tensor<2x6xi64>
  %c0 = arith.constant 0 : i64
  %c4 = arith.constant 4 : i64
  %e = tensor.empty() : tensor<2x6xf32>
  %g = linalg.generic {indexing_maps = [#id, #id, #id], iterator_types = ["parallel", "parallel"]}
      ins(%i0, %i1 : tensor<2x6xi64>, tensor<2x6xi64>) outs(%e : tensor<2x6xf32>) {
  ^bb0(%a: i64, %b: i64, %out: f32):
    %ia = arith.index_cast %a : i64 to index
    %neg = arith.cmpi slt, %b, %c0 : i64
    %wrapped = arith.addi %b, %c4 : i64
    %bb = arith.select %neg, %wrapped, %b : i64
    %ib = arith.index_cast %bb : i64 to index
    %v = tensor.extract %src[%ia, %ib] : tensor<3x4xf32>
    linalg.yield %v : f32
  } -> tensor<2x6xf32>
  return %g : tensor<2x6xf32>
}

// -----

// A real gather (here a transpose) stays.
// CHECK-LABEL: func.func @transpose_gather
// CHECK: tensor.extract
// CHECK-NOT: tensor.collapse_shape
#id = affine_map<(d0, d1) -> (d0, d1)>
func.func @transpose_gather(%src: tensor<2x2xf32>) -> tensor<2x2xf32> {
  %i0 = arith.constant dense<[[0, 1], [0, 1]]> : tensor<2x2xi64>
  %i1 = arith.constant dense<[[0, 0], [1, 1]]> : tensor<2x2xi64>
  %e = tensor.empty() : tensor<2x2xf32>
  %g = linalg.generic {indexing_maps = [#id, #id, #id], iterator_types = ["parallel", "parallel"]}
      ins(%i0, %i1 : tensor<2x2xi64>, tensor<2x2xi64>) outs(%e : tensor<2x2xf32>) {
  ^bb0(%a: i64, %b: i64, %out: f32):
    %ia = arith.index_cast %a : i64 to index
    %ib = arith.index_cast %b : i64 to index
    %v = tensor.extract %src[%ia, %ib] : tensor<2x2xf32>
    linalg.yield %v : f32
  } -> tensor<2x2xf32>
  return %g : tensor<2x2xf32>
}

// -----

// Indices that are not constants (here a function argument) stay.
// CHECK-LABEL: func.func @dynamic_indices
// CHECK: tensor.extract
#id = affine_map<(d0) -> (d0)>
func.func @dynamic_indices(%src: tensor<4xf32>, %idx: tensor<4xi64>) -> tensor<4xf32> {
  %e = tensor.empty() : tensor<4xf32>
  %g = linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel"]}
      ins(%idx : tensor<4xi64>) outs(%e : tensor<4xf32>) {
  ^bb0(%a: i64, %out: f32):
    %ia = arith.index_cast %a : i64 to index
    %v = tensor.extract %src[%ia] : tensor<4xf32>
    linalg.yield %v : f32
  } -> tensor<4xf32>
  return %g : tensor<4xf32>
}

// -----

// Indices out of range are not a reshape.
// CHECK-LABEL: func.func @out_of_range
// CHECK: tensor.extract
#id = affine_map<(d0) -> (d0)>
func.func @out_of_range(%src: tensor<2xf32>) -> tensor<2xf32> {
  %i = arith.constant dense<[0, 7]> : tensor<2xi64>
  %e = tensor.empty() : tensor<2xf32>
  %g = linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel"]}
      ins(%i : tensor<2xi64>) outs(%e : tensor<2xf32>) {
  ^bb0(%a: i64, %out: f32):
    %ia = arith.index_cast %a : i64 to index
    %v = tensor.extract %src[%ia] : tensor<2xf32>
    linalg.yield %v : f32
  } -> tensor<2xf32>
  return %g : tensor<2xf32>
}
