// RUN: kforge-opt %s -split-input-file -verify-diagnostics

func.func @bad_root_kind(%arg0: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error @+1 {{root kind must be one of contraction, convolution, reduction, elementwise; got 'matmul'}}
  %0 = kforge.fusion_region "matmul" (%a = %arg0) : (tensor<4xf32>) -> tensor<4xf32> {
    kforge.yield %a : tensor<4xf32>
  }
  return %0 : tensor<4xf32>
}

// -----

func.func @yield_type_mismatch(%arg0: tensor<4xf32>) -> tensor<8xf32> {
  %0 = kforge.fusion_region "elementwise" (%a = %arg0) : (tensor<4xf32>) -> tensor<8xf32> {
    // expected-error @+1 {{yields types ('tensor<4xf32>') that do not match the region's result types ('tensor<8xf32>')}}
    kforge.yield %a : tensor<4xf32>
  }
  return %0 : tensor<8xf32>
}

// -----

func.func @input_count_mismatch(%arg0: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error @+1 {{expected 1 input types, got 2}}
  %0 = kforge.fusion_region "elementwise" (%a = %arg0) : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32> {
    kforge.yield %a : tensor<4xf32>
  }
  return %0 : tensor<4xf32>
}

// -----

func.func @not_isolated(%arg0: tensor<4xf32>) -> tensor<4xf32> {
  // expected-note @+1 {{required by region isolation constraints}}
  %0 = kforge.fusion_region "elementwise" () : () -> tensor<4xf32> {
    // expected-error @+1 {{using value defined outside the region}}
    kforge.yield %arg0 : tensor<4xf32>
  }
  return %0 : tensor<4xf32>
}

// -----

func.func @missing_yield_values(%arg0: tensor<4xf32>) -> tensor<4xf32> {
  // The implicit kforge.yield yields nothing.
  // expected-error @+1 {{yields types () that do not match the region's result types ('tensor<4xf32>')}}
  %0 = kforge.fusion_region "elementwise" (%a = %arg0) : (tensor<4xf32>) -> tensor<4xf32> {
  }
  return %0 : tensor<4xf32>
}

// -----

func.func @yield_outside_region(%arg0: tensor<4xf32>) {
  // expected-error @+1 {{expects parent op 'kforge.fusion_region'}}
  kforge.yield %arg0 : tensor<4xf32>
}

// -----

// expected-error @+1 {{target must be BACKEND or BACKEND:ARCH with BACKEND one of cuda, xpu, cpu; got 'tpu'}}
kforge.kernel @k : (tensor<4xf32>) -> tensor<4xf32> target "tpu" hash "0123456789abcdef"
    launch {} verification {status = "verified"}

// -----

// expected-error @+1 {{target must be BACKEND or BACKEND:ARCH with BACKEND one of cuda, xpu, cpu; got 'tpu:v5'}}
kforge.kernel @k : (tensor<4xf32>) -> tensor<4xf32> target "tpu:v5" hash "0123456789abcdef"
    launch {} verification {status = "verified"}

// -----

// expected-error @+1 {{got 'cuda:'}}
kforge.kernel @k : (tensor<4xf32>) -> tensor<4xf32> target "cuda:" hash "0123456789abcdef"
    launch {} verification {status = "verified"}

// -----

// expected-error @+1 {{got 'xpu:p v c'}}
kforge.kernel @k : (tensor<4xf32>) -> tensor<4xf32> target "xpu:p v c" hash "0123456789abcdef"
    launch {} verification {status = "verified"}

// -----

// expected-error @+1 {{region hash must be 16 lowercase hex digits; got 'xyz'}}
kforge.kernel @k : (tensor<4xf32>) -> tensor<4xf32> target "cuda" hash "xyz"
    launch {} verification {status = "verified"}

// -----

// expected-error @+1 {{only verified kernels may be declared; status is 'candidate'}}
kforge.kernel @k : (tensor<4xf32>) -> tensor<4xf32> target "cuda" hash "0123456789abcdef"
    launch {} verification {status = "candidate"}

// -----

// expected-error @+1 {{verification record needs a string 'status'}}
kforge.kernel @k : (tensor<4xf32>) -> tensor<4xf32> target "cuda" hash "0123456789abcdef"
    launch {} verification {}

// -----

func.func @kernel_not_at_module_level() {
  // expected-error @+1 {{expects parent op 'builtin.module'}}
  "kforge.kernel"() {sym_name = "k", function_type = () -> (), target = "cuda", region_hash = "0123456789abcdef", launch = {}, verification = {status = "verified"}} : () -> ()
  return
}

// -----

func.func @call_unknown(%arg0: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error @+1 {{'@nope' does not reference a kforge.kernel}}
  %0 = kforge.custom_call @nope(%arg0) : (tensor<4xf32>) -> tensor<4xf32>
  return %0 : tensor<4xf32>
}

// -----

func.func private @not_a_kernel(tensor<4xf32>) -> tensor<4xf32>

func.func @call_a_func(%arg0: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error @+1 {{'@not_a_kernel' does not reference a kforge.kernel}}
  %0 = kforge.custom_call @not_a_kernel(%arg0) : (tensor<4xf32>) -> tensor<4xf32>
  return %0 : tensor<4xf32>
}

// -----

kforge.kernel @k : (tensor<4xf32>) -> tensor<4xf32> target "cuda" hash "0123456789abcdef"
    launch {} verification {status = "verified"}

func.func @call_wrong_operands(%arg0: tensor<8xf32>) -> tensor<4xf32> {
  // expected-error @+1 {{operand types ('tensor<8xf32>') do not match kernel @k inputs ('tensor<4xf32>')}}
  %0 = kforge.custom_call @k(%arg0) : (tensor<8xf32>) -> tensor<4xf32>
  return %0 : tensor<4xf32>
}

// -----

kforge.kernel @k : (tensor<4xf32>) -> tensor<4xf32> target "xpu" hash "0123456789abcdef"
    launch {} verification {status = "verified"}

func.func @call_wrong_results(%arg0: tensor<4xf32>) -> tensor<4xf16> {
  // expected-error @+1 {{result types ('tensor<4xf16>') do not match kernel @k results ('tensor<4xf32>')}}
  %0 = kforge.custom_call @k(%arg0) : (tensor<4xf32>) -> tensor<4xf16>
  return %0 : tensor<4xf16>
}
