//===- ExportRegions.cpp - --kforge-export-regions ------------------------===//

#include "KForge/Passes.h"

namespace mlir {
namespace kforge {
#define GEN_PASS_DEF_KFORGEEXPORTREGIONS
#include "KForge/Passes.h.inc"
} // namespace kforge
} // namespace mlir

using namespace mlir;

namespace {
struct ExportRegionsPass
    : public kforge::impl::KForgeExportRegionsBase<ExportRegionsPass> {
  using Base::Base;
  void runOnOperation() override { markAllAnalysesPreserved(); }
};
} // namespace
