//===- LinkKernels.cpp - --kforge-link-kernels ----------------------------===//
//
// Replaces calls of outlined regions that have a verified kernel in the manifest
// (docs/kernel-spec.md, "Manifest") with calls of that kernel.
//
//===----------------------------------------------------------------------===//

#include "KForge/KForgeOps.h"
#include "KForge/KernelSpec.h"
#include "KForge/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/SymbolTable.h"
#include "llvm/Support/JSON.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/raw_ostream.h"

namespace mlir {
namespace kforge {
#define GEN_PASS_DEF_KFORGELINKKERNELS
#include "KForge/Passes.h.inc"
} // namespace kforge
} // namespace mlir

using namespace mlir;
using namespace mlir::kforge;
namespace json = llvm::json;

namespace {

/// One verified kernel of the manifest.
struct ManifestKernel {
  std::string hash, symbol, target;
  DictionaryAttr launch, verification;
  NamedAttrList extra; // provider, precision, source, time_ms
};

/// JSON to attributes: objects become dictionaries, arrays arrays, integers i64, other
/// numbers f64, null a unit attribute.
static Attribute toAttribute(const json::Value &value, Builder &builder) {
  switch (value.kind()) {
  case json::Value::Null:
    return builder.getUnitAttr();
  case json::Value::Boolean:
    return builder.getBoolAttr(*value.getAsBoolean());
  case json::Value::Number:
    if (std::optional<int64_t> integer = value.getAsInteger())
      return builder.getI64IntegerAttr(*integer);
    return builder.getF64FloatAttr(*value.getAsNumber());
  case json::Value::String:
    return builder.getStringAttr(*value.getAsString());
  case json::Value::Array: {
    SmallVector<Attribute> elements;
    for (const json::Value &element : *value.getAsArray())
      elements.push_back(toAttribute(element, builder));
    return builder.getArrayAttr(elements);
  }
  case json::Value::Object: {
    NamedAttrList entries;
    for (const auto &[key, element] : *value.getAsObject())
      entries.append(builder.getStringAttr(key.str()), toAttribute(element, builder));
    return builder.getDictionaryAttr(entries);
  }
  }
  return builder.getUnitAttr();
}

static bool isIdentifier(StringRef name) {
  if (name.empty() || !(llvm::isAlpha(name[0]) || name[0] == '_'))
    return false;
  return llvm::all_of(name, [](char c) {
    return llvm::isAlnum(c) || c == '_' || c == '.' || c == '$';
  });
}

struct LinkKernelsPass
    : public kforge::impl::KForgeLinkKernelsBase<LinkKernelsPass> {
  using Base::Base;

  Operation *lastDecl = nullptr;

  /// Reads the manifest; diagnostics name the file and the entry at fault.
  LogicalResult readManifest(Location loc, llvm::StringMap<ManifestKernel> &kernels) {
    auto fail = [&](const Twine &what) {
      return emitError(loc) << "kforge-link-kernels: manifest '" << manifest
                            << "': " << what;
    };
    if (manifest.empty())
      return emitError(loc) << "kforge-link-kernels: no manifest given; use "
                               "--kforge-link-kernels=\"manifest=PATH\"";
    auto buffer = llvm::MemoryBuffer::getFile(manifest);
    if (!buffer)
      return fail("cannot read: " + buffer.getError().message());
    json::Value doc = nullptr;
    if (llvm::Expected<json::Value> parsed = json::parse((*buffer)->getBuffer())) {
      doc = std::move(*parsed);
    } else {
      return fail("not valid JSON: " + llvm::toString(parsed.takeError()));
    }
    const json::Object *root = doc.getAsObject();
    if (!root)
      return fail("expected a JSON object at the top level");
    std::optional<StringRef> schema = root->getString("schema");
    if (!schema || *schema != "kforge.manifest")
      return fail("field 'schema' must be \"kforge.manifest\"");
    std::optional<int64_t> version = root->getInteger("version");
    if (!version || *version < 1 || *version > 1)
      return fail("field 'version' must be 1 (this kforge-opt reads manifest "
                  "version 1)");
    const json::Object *entries = root->getObject("kernels");
    if (!entries)
      return fail("field 'kernels' must be an object keyed by region hash");

    Builder builder(loc.getContext());
    for (const auto &[key, value] : *entries) {
      std::string hash = key.str();
      auto entryFail = [&](const Twine &what) {
        return fail("kernels[\"" + hash + "\"]: " + what);
      };
      const json::Object *entry = value.getAsObject();
      if (!entry)
        return entryFail("expected an object");
      if (hash.size() != 16 || !llvm::all_of(hash, [](char c) {
            return llvm::isDigit(c) || (c >= 'a' && c <= 'f');
          }))
        return entryFail("the key must be a region hash of 16 lowercase hex digits");
      const json::Object *verification = entry->getObject("verification");
      if (!verification)
        return entryFail("field 'verification' must be an object");
      std::optional<StringRef> status = verification->getString("status");
      if (!status)
        return entryFail("field 'verification.status' must be a string");
      if (*status != "verified")
        continue; // only verified kernels are linked
      std::optional<StringRef> symbol = entry->getString("symbol");
      if (!symbol || !isIdentifier(*symbol))
        return entryFail("field 'symbol' must be an identifier");
      std::optional<StringRef> kernelTarget = entry->getString("target");
      if (!kernelTarget || !KernelOp::isValidTarget(*kernelTarget))
        return entryFail("field 'target' must be BACKEND or BACKEND:ARCH with BACKEND one "
                         "of " + KernelOp::targetBackendsText());
      if (!linksTarget(*kernelTarget))
        continue;
      const json::Value *launch = entry->get("launch");
      if (launch && !launch->getAsObject())
        return entryFail("field 'launch' must be an object");

      ManifestKernel kernel;
      kernel.hash = hash;
      kernel.symbol = symbol->str();
      kernel.target = kernelTarget->str();
      kernel.launch = launch ? cast<DictionaryAttr>(toAttribute(*launch, builder))
                             : builder.getDictionaryAttr({});
      kernel.verification =
          cast<DictionaryAttr>(toAttribute(json::Value(json::Object(*verification)), builder));
      for (StringRef field : {"provider", "precision", "source", "time_ms"})
        if (const json::Value *extra = entry->get(field))
          kernel.extra.append(builder.getStringAttr("kforge." + field.str()),
                              toAttribute(*extra, builder));
      kernels[hash] = std::move(kernel);
    }
    return success();
  }

  /// The `target` option selects a kernel's target: `cuda` any cuda kernel, `cuda:sm_90`
  /// that architecture (and kernels recorded without one); empty: every kernel.
  bool linksTarget(StringRef kernelTarget) const {
    if (target.empty() || kernelTarget == target)
      return true;
    if (KernelOp::targetBackend(kernelTarget) != KernelOp::targetBackend(target))
      return false;
    return !StringRef(target).contains(':') || !kernelTarget.contains(':');
  }

  void runOnOperation() override {
    ModuleOp module = getOperation();
    llvm::StringMap<ManifestKernel> kernels;
    lastDecl = nullptr;
    if (!target.empty() && !KernelOp::isValidTarget(target)) {
      emitError(module.getLoc()) << "kforge-link-kernels: option target='" << target
                                 << "' must be BACKEND or BACKEND:ARCH with BACKEND one of "
                                 << KernelOp::targetBackendsText();
      return signalPassFailure();
    }
    if (failed(readManifest(module.getLoc(), kernels)))
      return signalPassFailure();

    SymbolTable symbolTable(module);
    SmallVector<func::CallOp> calls;
    module.walk([&](func::CallOp call) { calls.push_back(call); });
    llvm::SetVector<func::FuncOp> linkedRegions;
    for (func::CallOp call : calls) {
      auto region = symbolTable.lookup<func::FuncOp>(call.getCallee());
      if (!region)
        continue;
      auto hash = region->getAttrOfType<StringAttr>("kforge.hash");
      if (!hash)
        continue;
      auto it = kernels.find(hash.getValue());
      if (it == kernels.end())
        continue; // no verified kernel: the region call stays
      FailureOr<Operation *> kernel =
          declareKernel(it->second, region.getFunctionType(), symbolTable, call);
      if (failed(kernel))
        return signalPassFailure();
      OpBuilder builder(call);
      Operation *replacement;
      if (emitFuncCalls)
        replacement = func::CallOp::create(builder, call.getLoc(),
                                           cast<func::FuncOp>(*kernel),
                                           call.getOperands());
      else
        replacement = CustomCallOp::create(
            builder, call.getLoc(), call.getResultTypes(),
            SymbolRefAttr::get(builder.getContext(), it->second.symbol),
            call.getOperands());
      call.replaceAllUsesWith(replacement->getResults());
      call.erase();
      linkedRegions.insert(region);
    }
    // The reference of a linked region is not needed once nothing calls it.
    for (func::FuncOp region : linkedRegions)
      if (SymbolTable::symbolKnownUseEmpty(region, module))
        symbolTable.erase(region);
    if (!hostPlan.empty() && failed(writeHostPlan(module)))
      return signalPassFailure();
  }

  /// The host plan of the entry function (the first function with a body that is not a
  /// region): what the runtime executes.
  LogicalResult writeHostPlan(ModuleOp module) {
    func::FuncOp entry;
    for (func::FuncOp func : module.getOps<func::FuncOp>())
      if (!func.isExternal() && !func->hasAttr("kforge.hash")) {
        entry = func;
        break;
      }
    if (!entry)
      return module.emitError("kforge-link-kernels: host-plan: the module has no entry "
                              "function");
    FailureOr<json::Object> plan = buildHostPlan(entry);
    if (failed(plan))
      return failure();
    std::error_code error;
    llvm::raw_fd_ostream os(hostPlan, error);
    if (error)
      return module.emitError("kforge-link-kernels: cannot write '")
             << hostPlan << "': " << error.message();
    os << llvm::formatv("{0:2}", json::Value(std::move(*plan))) << "\n";
    return success();
  }

  FailureOr<Operation *> declareKernel(const ManifestKernel &kernel, FunctionType type,
                                       SymbolTable &symbolTable, func::CallOp call) {
    ModuleOp module = getOperation();
    if (Operation *existing = symbolTable.lookup(kernel.symbol)) {
      auto decl = dyn_cast<KernelOp>(existing);
      auto func = dyn_cast<func::FuncOp>(existing);
      bool matches = emitFuncCalls
                         ? func && func->hasAttr("kforge.kernel") &&
                               func.getFunctionType() == type
                         : decl && decl.getFunctionType() == type;
      if (!matches)
        return call.emitError("kforge-link-kernels: kernel symbol @")
               << kernel.symbol << " for region " << kernel.hash
               << " clashes with an existing symbol of another kind or type";
      return existing;
    }
    OpBuilder builder(module.getContext()); // detached: the symbol table inserts it
    Operation *decl;
    if (emitFuncCalls) {
      auto func = func::FuncOp::create(builder, module.getLoc(), kernel.symbol, type);
      func.setPrivate();
      func->setAttr("kforge.kernel", builder.getUnitAttr());
      func->setAttr("kforge.target", builder.getStringAttr(kernel.target));
      // Not `kforge.hash`: that marks outlined regions.
      func->setAttr("kforge.region_hash", builder.getStringAttr(kernel.hash));
      func->setAttr("kforge.launch", kernel.launch);
      func->setAttr("kforge.verification", kernel.verification);
      for (const NamedAttribute &extra : kernel.extra)
        func->setAttr(extra.getName(), extra.getValue());
      decl = func;
    } else {
      auto op = KernelOp::create(builder, module.getLoc(), kernel.symbol, type,
                                 kernel.target, kernel.hash, kernel.launch,
                                 kernel.verification);
      for (const NamedAttribute &extra : kernel.extra)
        op->setAttr(extra.getName(), extra.getValue());
      decl = op;
    }
    // Declarations go first in the module, in the order of their first call.
    symbolTable.insert(decl, lastDecl ? std::next(lastDecl->getIterator())
                                      : module.getBody()->begin());
    lastDecl = decl;
    return decl;
  }
};
} // namespace
