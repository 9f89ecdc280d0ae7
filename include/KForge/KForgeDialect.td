//===- KForgeDialect.td - the kforge dialect ---------------*- tablegen -*-===//
//
// The kforge dialect holds what upstream MLIR lacks for KForge: a fusion region (a group of
// linalg-on-tensors ops that one kernel will compute), and a call of a verified kernel.
//
//===----------------------------------------------------------------------===//

#ifndef KFORGE_DIALECT
#define KFORGE_DIALECT

include "mlir/IR/OpBase.td"

def KForge_Dialect : Dialect {
  let name = "kforge";
  let summary = "Fusion regions and verified-kernel calls for KForge.";
  let description = [{
    `kforge.fusion_region` groups linalg-on-tensors ops into one kernel candidate.
    `kforge.kernel` declares a kernel that KForge synthesized and verified for a region;
    `kforge.custom_call` calls it.
  }];
  let cppNamespace = "::mlir::kforge";
}

class KForge_Op<string mnemonic, list<Trait> traits = []> :
    Op<KForge_Dialect, mnemonic, traits>;

#endif // KFORGE_DIALECT
