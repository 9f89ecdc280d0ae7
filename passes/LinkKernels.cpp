//===- LinkKernels.cpp - --kforge-link-kernels ----------------------------===//

#include "KForge/Passes.h"

namespace mlir {
namespace kforge {
#define GEN_PASS_DEF_KFORGELINKKERNELS
#include "KForge/Passes.h.inc"
} // namespace kforge
} // namespace mlir

using namespace mlir;

namespace {
struct LinkKernelsPass
    : public kforge::impl::KForgeLinkKernelsBase<LinkKernelsPass> {
  using Base::Base;
  void runOnOperation() override {}
};
} // namespace
