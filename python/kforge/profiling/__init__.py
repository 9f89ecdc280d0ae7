"""The profiler layer: one versioned JSON profile per candidate (kforge.profiling.schema),
gathered per target (kforge.profiling.collect) from Triton's compile metadata and code
(triton_meta), the verifier's timing and the roofline, Nsight Compute (ncu) or Proton (proton)."""
from kforge.profiling.collect import collect_profile, roofline_of, work_at_size
from kforge.profiling.schema import (SCHEMA, SCHEMA_VERSION, KernelCounters, KernelFacts, Profile,
                                     Roofline, Source, Timing, load_profile, save_profile)

__all__ = ["collect_profile", "roofline_of", "work_at_size", "SCHEMA", "SCHEMA_VERSION",
           "KernelCounters", "KernelFacts", "Profile", "Roofline", "Source", "Timing",
           "load_profile", "save_profile"]
