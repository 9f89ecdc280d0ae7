//===- PrintRegionStats.cpp - --kforge-print-region-stats -----------------===//
//
// An analysis pass: per function, counts of linalg ops by name and kind and estimated FLOPs.
//
//===----------------------------------------------------------------------===//

#include "KForge/LinalgOpInfo.h"
#include "KForge/Passes.h"

#include "mlir/Interfaces/FunctionInterfaces.h"
#include "llvm/ADT/MapVector.h"
#include "llvm/Support/JSON.h"
#include "llvm/Support/raw_ostream.h"

namespace mlir {
namespace kforge {
#define GEN_PASS_DEF_KFORGEPRINTREGIONSTATS
#include "KForge/Passes.h.inc"
} // namespace kforge
} // namespace mlir

using namespace mlir;
using namespace mlir::kforge;

namespace {
struct FunctionStats {
  std::string function;
  int64_t linalgOps = 0;
  int64_t flops = 0;
  llvm::MapVector<StringRef, int64_t> perKind; // contraction, convolution, ...
  std::map<std::string, int64_t> perOpName;    // sorted for stable output
};

struct PrintRegionStatsPass
    : public kforge::impl::KForgePrintRegionStatsBase<PrintRegionStatsPass> {
  using Base::Base;

  void runOnOperation() override {
    llvm::raw_ostream &os = toStdout ? llvm::outs() : llvm::errs();
    getOperation()->walk([&](FunctionOpInterface func) {
      FunctionStats stats = collect(func);
      if (stats.linalgOps == 0 && !includeEmpty)
        return;
      if (json)
        printJson(os, stats);
      else
        printText(os, stats);
    });
    markAllAnalysesPreserved();
  }

  static FunctionStats collect(FunctionOpInterface func) {
    FunctionStats stats;
    stats.function = func.getName().str();
    for (StringRef kind :
         {"contraction", "convolution", "reduction", "elementwise", "other"})
      stats.perKind[kind] = 0;
    func->walk([&](linalg::LinalgOp op) {
      ++stats.linalgOps;
      stats.perKind[stringifyLinalgOpKind(classifyLinalgOp(op))] += 1;
      stats.perOpName[op->getName().getStringRef().str()] += 1;
      int64_t flops = estimateFlops(op);
      stats.flops = flops > std::numeric_limits<int64_t>::max() - stats.flops
                        ? std::numeric_limits<int64_t>::max()
                        : stats.flops + flops;
    });
    return stats;
  }

  static void printText(llvm::raw_ostream &os, const FunctionStats &stats) {
    os << "kforge region stats: @" << stats.function << "\n";
    os << "  linalg ops: " << stats.linalgOps << " (contractions: "
       << stats.perKind.lookup("contraction")
       << ", convolutions: " << stats.perKind.lookup("convolution")
       << ", reductions: " << stats.perKind.lookup("reduction")
       << ", elementwise: " << stats.perKind.lookup("elementwise") << ")\n";
    os << "  flops: " << stats.flops << "\n";
    for (const auto &[name, count] : stats.perOpName)
      os << "  " << name << ": " << count << "\n";
  }

  static void printJson(llvm::raw_ostream &os, const FunctionStats &stats) {
    llvm::json::Object ops;
    for (const auto &[name, count] : stats.perOpName)
      ops[name] = count;
    llvm::json::Object obj{
        {"function", stats.function},
        {"linalg_ops", stats.linalgOps},
        {"contractions", stats.perKind.lookup("contraction")},
        {"convolutions", stats.perKind.lookup("convolution")},
        {"reductions", stats.perKind.lookup("reduction")},
        {"elementwise", stats.perKind.lookup("elementwise")},
        {"flops", stats.flops},
        {"ops", std::move(ops)},
    };
    os << llvm::json::Value(std::move(obj)) << "\n";
  }
};
} // namespace
