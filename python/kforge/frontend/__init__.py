"""The frontend: PyTorch model → linalg-on-tensors MLIR with weights as arguments, and the call
into `kforge-opt` that cuts it into fusion regions.

Heavy dependencies (torch-mlir, the MLIR bindings) are imported lazily inside the functions.
"""
from kforge.frontend.importer import ImportResult, LoweredModel, import_model, lower_model
from kforge.frontend.regions import RegionStats, form_regions, region_stats

__all__ = ["ImportResult", "LoweredModel", "import_model", "lower_model", "form_regions",
           "region_stats", "RegionStats"]
