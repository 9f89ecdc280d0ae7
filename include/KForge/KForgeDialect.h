//===- KForgeDialect.h - the kforge dialect ---------------------*- C++ -*-===//
#ifndef KFORGE_KFORGEDIALECT_H
#define KFORGE_KFORGEDIALECT_H

#include "mlir/IR/Dialect.h"

#include "KForge/KForgeDialect.h.inc"

#endif // KFORGE_KFORGEDIALECT_H
