// RUN: kforge-opt %s --kforge-outline-regions -verify-diagnostics -split-input-file

// A symbol already named like the region's function but that is not an outlined region is an
// error, not a silent rename. (The hash of this region is pinned: if it changes, the hash
// function changed and every exported kernel cache key with it.)
func.func private @kforge_region_be443c56e60493a0(tensor<8xf32>) -> tensor<8xf32>

func.func @clash(%x: tensor<8xf32>) -> tensor<8xf32> {
  // expected-error @below {{cannot outline: symbol @kforge_region_be443c56e60493a0 already exists and is not an outlined region}}
  %r = kforge.fusion_region "elementwise" (%a = %x) : (tensor<8xf32>) -> tensor<8xf32> {
    kforge.yield %a : tensor<8xf32>
  }
  return %r : tensor<8xf32>
}
