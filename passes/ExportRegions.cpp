//===- ExportRegions.cpp - --kforge-export-regions ------------------------===//
//
// Writes <dir>/<hash>.mlir and <dir>/<hash>.json per outlined region and the host plan of each
// function that calls regions (docs/kernel-spec.md).
//
//===----------------------------------------------------------------------===//

#include "KForge/KernelSpec.h"
#include "KForge/Passes.h"

#include "mlir/IR/BuiltinOps.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/raw_ostream.h"

namespace mlir {
namespace kforge {
#define GEN_PASS_DEF_KFORGEEXPORTREGIONS
#include "KForge/Passes.h.inc"
} // namespace kforge
} // namespace mlir

using namespace mlir;
using namespace mlir::kforge;

namespace {
struct ExportRegionsPass
    : public kforge::impl::KForgeExportRegionsBase<ExportRegionsPass> {
  using Base::Base;

  LogicalResult writeFile(Location loc, StringRef name,
                          llvm::function_ref<void(llvm::raw_ostream &)> write) {
    SmallString<256> path(dir);
    llvm::sys::path::append(path, name);
    std::error_code error;
    llvm::raw_fd_ostream os(path, error, llvm::sys::fs::OF_Text);
    if (error)
      return emitError(loc) << "kforge-export-regions: cannot write '" << path
                            << "': " << error.message();
    write(os);
    os.close();
    if (os.has_error())
      return emitError(loc) << "kforge-export-regions: error writing '" << path
                            << "': " << os.error().message();
    return success();
  }

  void runOnOperation() override {
    ModuleOp module = getOperation();
    if (dir.empty()) {
      module.emitError("kforge-export-regions: the output directory is not set; "
                       "use --kforge-export-regions=\"dir=PATH\"");
      return signalPassFailure();
    }
    if (std::error_code error = llvm::sys::fs::create_directories(dir)) {
      module.emitError("kforge-export-regions: cannot create directory '")
          << dir << "': " << error.message();
      return signalPassFailure();
    }

    SmallVector<func::FuncOp> regions, callers;
    for (func::FuncOp func : module.getOps<func::FuncOp>()) {
      if (func->hasAttr("kforge.hash"))
        regions.push_back(func);
      else if (!func.isExternal() && callsRegion(func, module))
        callers.push_back(func);
    }

    bool failedAny = false;
    for (func::FuncOp region : regions) {
      FailureOr<llvm::json::Object> spec = buildKernelSpec(region);
      if (failed(spec)) {
        failedAny = true;
        continue;
      }
      StringRef hash = region->getAttrOfType<StringAttr>("kforge.hash").getValue();
      // The region alone, in a module of its own, so the file parses by itself.
      OwningOpRef<ModuleOp> holder = ModuleOp::create(region.getLoc());
      holder->push_back(region->clone());
      if (failed(writeFile(region.getLoc(), (hash + ".mlir").str(),
                           [&](llvm::raw_ostream &os) { holder->print(os); })) ||
          failed(writeFile(region.getLoc(), (hash + ".json").str(),
                           [&](llvm::raw_ostream &os) {
                             os << llvm::formatv(
                                       "{0:2}", llvm::json::Value(std::move(*spec)))
                                << "\n";
                           })))
        failedAny = true;
    }

    if (hostPlan) {
      for (auto [index, func] : llvm::enumerate(callers)) {
        FailureOr<llvm::json::Object> plan = buildHostPlan(func);
        if (failed(plan)) {
          failedAny = true;
          continue;
        }
        std::string name = index == 0
                               ? std::string("host_plan.json")
                               : ("host_plan." + func.getSymName() + ".json").str();
        if (failed(writeFile(func.getLoc(), name, [&](llvm::raw_ostream &os) {
              os << llvm::formatv("{0:2}", llvm::json::Value(std::move(*plan)))
                 << "\n";
            })))
          failedAny = true;
      }
    }
    if (failedAny)
      return signalPassFailure();
    markAllAnalysesPreserved();
  }

  static bool callsRegion(func::FuncOp func, ModuleOp module) {
    bool found = false;
    func.walk([&](func::CallOp call) {
      auto callee = module.lookupSymbol<func::FuncOp>(call.getCallee());
      // a region, or a fallback op (a model may be all fallbacks: an embedding lookup)
      if (callee && (callee->hasAttr("kforge.hash") || callee->hasAttr("kforge.fallback")))
        found = true;
    });
    return found;
  }
};
} // namespace
