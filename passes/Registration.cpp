//===- Registration.cpp - register KForge passes and pipelines ------------===//

#include "KForge/Passes.h"

using namespace mlir;

void mlir::kforge::registerKForgePassesAndPipelines() {
  registerKForgePasses();
  registerKForgePipeline();
}
