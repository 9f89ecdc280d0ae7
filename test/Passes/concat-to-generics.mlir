// RUN: kforge-opt %s -split-input-file --kforge-concat-to-generics | FileCheck %s
// RUN: kforge-opt %s -split-input-file --kforge-concat-to-generics="max-inputs=2" | FileCheck %s --check-prefix=MAX2

// rotate_half: two halves of one size; both read at `d mod 32`, the index picks one.
// CHECK-DAG: #[[HALF:.*]] = affine_map<(d0, d1) -> (d0, d1 mod 32)>
// CHECK-DAG: #[[OUT:.*]] = affine_map<(d0, d1) -> (d0, d1)>
// CHECK-LABEL: func.func @halves
// CHECK-SAME: (%[[A:.*]]: tensor<8x32xf32>, %[[B:.*]]: tensor<8x32xf32>)
// CHECK: %[[E:.*]] = tensor.empty() : tensor<8x64xf32>
// CHECK: %[[G:.*]] = linalg.generic {indexing_maps = [#[[HALF]], #[[HALF]], #[[OUT]]], iterator_types = ["parallel", "parallel"]} ins(%[[A]], %[[B]] : tensor<8x32xf32>, tensor<8x32xf32>) outs(%[[E]] : tensor<8x64xf32>)
// CHECK-NEXT: ^bb0(%[[X:.*]]: f32, %[[Y:.*]]: f32, %{{.*}}: f32):
// CHECK-NEXT:   %[[I:.*]] = linalg.index 1 : index
// CHECK-NEXT:   %[[C:.*]] = arith.constant 32 : index
// CHECK-NEXT:   %[[LT:.*]] = arith.cmpi ult, %[[I]], %[[C]] : index
// CHECK-NEXT:   %[[V:.*]] = arith.select %[[LT]], %[[X]], %[[Y]] : f32
// CHECK-NEXT:   linalg.yield %[[V]] : f32
// CHECK: return %[[G]]
// CHECK-NOT: tensor.concat
func.func @halves(%a: tensor<8x32xf32>, %b: tensor<8x32xf32>) -> tensor<8x64xf32> {
  %c = tensor.concat dim(1) %a, %b : (tensor<8x32xf32>, tensor<8x32xf32>) -> tensor<8x64xf32>
  return %c : tensor<8x64xf32>
}

// -----

// Three inputs of other sizes along dim 0 (offsets 0, 3, 4 of 9): input k is read at
// (d0 + c) mod size with c = -offset mod size; the selects nest from the last input.
// CHECK-DAG: #[[M0:.*]] = affine_map<(d0, d1) -> (d0 mod 3, d1)>
// CHECK-DAG: #[[M1:.*]] = affine_map<(d0, d1) -> (0, d1)>
// CHECK-DAG: #[[M2:.*]] = affine_map<(d0, d1) -> ((d0 + 1) mod 5, d1)>
// CHECK-LABEL: func.func @three
// CHECK: linalg.generic {indexing_maps = [#[[M0]], #[[M1]], #[[M2]], #{{.*}}]
// CHECK: %[[I:.*]] = linalg.index 0 : index
// CHECK: %[[C4:.*]] = arith.constant 4 : index
// CHECK: %[[LT4:.*]] = arith.cmpi ult, %[[I]], %[[C4]] : index
// CHECK: %[[S1:.*]] = arith.select %[[LT4]], %{{.*}}, %{{.*}} : i64
// CHECK: %[[C3:.*]] = arith.constant 3 : index
// CHECK: %[[LT3:.*]] = arith.cmpi ult, %[[I]], %[[C3]] : index
// CHECK: %[[S0:.*]] = arith.select %[[LT3]], %{{.*}}, %[[S1]] : i64
// CHECK: linalg.yield %[[S0]] : i64
// MAX2-LABEL: func.func @three
// MAX2: tensor.concat
func.func @three(%a: tensor<3x6xi64>, %b: tensor<1x6xi64>, %c: tensor<5x6xi64>) -> tensor<9x6xi64> {
  %r = tensor.concat dim(0) %a, %b, %c : (tensor<3x6xi64>, tensor<1x6xi64>, tensor<5x6xi64>) -> tensor<9x6xi64>
  return %r : tensor<9x6xi64>
}

// -----

// A dynamic batch dimension is taken from the first input; the concatenated one is static.
// CHECK-LABEL: func.func @dynamic_batch
// CHECK-SAME: (%[[A:.*]]: tensor<?x16xf32>, %[[B:.*]]: tensor<?x16xf32>)
// CHECK: %[[C0:.*]] = arith.constant 0 : index
// CHECK: %[[N:.*]] = tensor.dim %[[A]], %[[C0]] : tensor<?x16xf32>
// CHECK: tensor.empty(%[[N]]) : tensor<?x32xf32>
// CHECK: linalg.generic
func.func @dynamic_batch(%a: tensor<?x16xf32>, %b: tensor<?x16xf32>) -> tensor<?x32xf32> {
  %c = tensor.concat dim(1) %a, %b : (tensor<?x16xf32>, tensor<?x16xf32>) -> tensor<?x32xf32>
  return %c : tensor<?x32xf32>
}

// -----

// Along a dynamic dimension it stays.
// CHECK-LABEL: func.func @dynamic_dim
// CHECK: tensor.concat
// CHECK-NOT: linalg.generic
func.func @dynamic_dim(%a: tensor<?x16xf32>, %b: tensor<?x16xf32>) -> tensor<?x16xf32> {
  %c = tensor.concat dim(0) %a, %b : (tensor<?x16xf32>, tensor<?x16xf32>) -> tensor<?x16xf32>
  return %c : tensor<?x16xf32>
}
