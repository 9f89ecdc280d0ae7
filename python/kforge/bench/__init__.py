"""`kforge bench`: PyTorch eager, torch.compile and KForge packages timed on the same machine.

Modules, in the order data flows through them:
  workloads  find and instantiate KernelBench-format workload files (full or smoke size)
  timing     device timers (CUDA events with an L2 flush between runs; host clock on the CPU)
  roofline   peak rates (measured micro-benchmark or DESIGN.md's table), FLOP and byte counts
  backends   the three contenders: eager, torch.compile, a KForge package (compiled or loaded)
  runner     the per-workload loop: correctness on fresh inputs, timing, speedups
  stats      geomean, fast_p, medians
  report     JSON, Markdown table, PNG plot; merging shards of one suite run
Only torch and triton are needed (matplotlib for the plot): no MLIR, no torch-mlir.
"""
