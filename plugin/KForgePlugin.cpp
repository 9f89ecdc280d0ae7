//===- KForgePlugin.cpp - the KForge passes as an mlir-opt plugin ---------===//
//
//   mlir-opt --load-dialect-plugin=KForgePlugin.so --load-pass-plugin=KForgePlugin.so
//            --pass-pipeline='builtin.module(kforge-pipeline)' model.mlir
//
// The same .so is both a pass plugin (every kforge pass and pipeline) and a dialect plugin
// (the kforge dialect, needed only to parse input that already holds kforge ops).
//
//===----------------------------------------------------------------------===//

#include "KForge/KForgeDialect.h"
#include "KForge/Passes.h"

#include "mlir/Tools/Plugins/DialectPlugin.h"
#include "mlir/Tools/Plugins/PassPlugin.h"
#include "llvm/Config/llvm-config.h"

using namespace mlir;

extern "C" LLVM_ATTRIBUTE_WEAK PassPluginLibraryInfo mlirGetPassPluginInfo() {
  return {MLIR_PLUGIN_API_VERSION, "KForgePasses", LLVM_VERSION_STRING,
          []() { kforge::registerKForgePassesAndPipelines(); }};
}

extern "C" LLVM_ATTRIBUTE_WEAK DialectPluginLibraryInfo
mlirGetDialectPluginInfo() {
  return {MLIR_PLUGIN_API_VERSION, "KForgeDialect", LLVM_VERSION_STRING,
          [](DialectRegistry *registry) {
            registry->insert<kforge::KForgeDialect>();
          }};
}
