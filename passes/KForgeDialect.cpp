//===- KForgeDialect.cpp - the kforge dialect -----------------------------===//

#include "KForge/KForgeDialect.h"
#include "KForge/KForgeOps.h"

using namespace mlir;
using namespace mlir::kforge;

#include "KForge/KForgeDialect.cpp.inc"

void KForgeDialect::initialize() {
  addOperations<
#define GET_OP_LIST
#include "KForge/KForgeOps.cpp.inc"
      >();
}
