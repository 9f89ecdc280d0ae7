//===- KForgePipeline.cpp - --kforge-pipeline -----------------------------===//
//
// The standard cleanups and the KForge passes in order:
//   kforge-gathers-to-reshapes, canonicalize, kforge-concat-to-generics,
//   kforge-slices-to-generics, cse,
//   linalg-generalize-named-ops,
//   [linalg-fuse-elementwise-ops],
//   kforge-form-regions, kforge-outline-regions, canonicalize, cse, [kforge-export-regions]
// The trailing cleanups make the pipeline idempotent: a second run changes nothing.
//
//===----------------------------------------------------------------------===//

#include "KForge/Passes.h"

#include "mlir/Dialect/Linalg/Passes.h"
#include "mlir/Pass/PassManager.h"
#include "mlir/Pass/PassOptions.h"
#include "mlir/Pass/PassRegistry.h"
#include "mlir/Transforms/Passes.h"

using namespace mlir;
using namespace mlir::kforge;

namespace {
struct KForgePipelineOptions
    : public PassPipelineOptions<KForgePipelineOptions> {
  Option<std::string> dir{*this, "dir",
                          llvm::cl::desc("Export regions, kernel specs and the host plan "
                                         "into this directory (empty: no export)"),
                          llvm::cl::init("")};
  Option<unsigned> maxOps{*this, "max-ops",
                          llvm::cl::desc("Most linalg ops one region may hold"),
                          llvm::cl::init(32)};
  Option<std::string> consumers{
      *this, "consumers",
      llvm::cl::desc("Consumer kinds fused into a region: comma-separated "
                     "elementwise, reduction, reshape, or none"),
      llvm::cl::init("elementwise,reduction,reshape")};
  Option<bool> standalone{*this, "standalone",
                          llvm::cl::desc("Also form regions without a contraction or "
                                         "convolution"),
                          llvm::cl::init(true)};
  Option<bool> generalize{*this, "generalize",
                          llvm::cl::desc("Generalize named linalg ops first"),
                          llvm::cl::init(true)};
  Option<bool> fuseElementwise{
      *this, "fuse-elementwise",
      llvm::cl::desc("Run upstream linalg elementwise fusion before forming regions "
                     "(fewer, larger generics per region)"),
      llvm::cl::init(false)};
};

void buildKForgePipeline(OpPassManager &pm, const KForgePipelineOptions &options) {
  pm.addPass(createKForgeGathersToReshapes());
  pm.addPass(createCanonicalizerPass());
  // After canonicalization, which folds slices it can (of constants, of whole tensors).
  pm.addPass(createKForgeConcatToGenerics());
  pm.addPass(createKForgeSlicesToGenerics());
  pm.addPass(createCSEPass());
  if (options.generalize)
    pm.addPass(createLinalgGeneralizeNamedOpsPass());
  if (options.fuseElementwise) {
    pm.addPass(createLinalgElementwiseOpFusionPass());
    pm.addPass(createCanonicalizerPass());
  }
  KForgeFormRegionsOptions form;
  form.maxOps = options.maxOps;
  form.consumers = options.consumers;
  form.standalone = options.standalone;
  pm.addPass(createKForgeFormRegions(form));
  pm.addPass(createKForgeOutlineRegions());
  pm.addPass(createCanonicalizerPass());
  pm.addPass(createCSEPass());
  if (!options.dir.empty()) {
    KForgeExportRegionsOptions exportOptions;
    exportOptions.dir = options.dir;
    pm.addPass(createKForgeExportRegions(exportOptions));
  }
}
} // namespace

void mlir::kforge::registerKForgePipeline() {
  PassPipelineRegistration<KForgePipelineOptions>(
      "kforge-pipeline",
      "Cut a linalg-on-tensors module into outlined fusion regions (cleanups, "
      "generalization, form, outline; export with dir=...)",
      buildKForgePipeline);
}
