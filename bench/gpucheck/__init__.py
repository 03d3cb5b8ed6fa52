"""The prepared validation run on a real NVIDIA GPU (`scripts/gpu-check.sh`, `make gpu-check`).

One command that, on a machine with a GPU, measures what the rest of the project measures on the
simulated GPU, and what cannot run on it at all (PyTorch, CuPy, nvcc-built programs under
`sharegpu run`), each step bounded in time, into one JSON report and one printed table.
`--dry-run` runs the same steps on the simulated GPU and reports the ones that need the CUDA
runtime as skipped, with the reason.

Modules, one job each:
  cli       options, the run's budget, the report file, the exit status
  runner    each step in a child process of its own session, killed at its time limit
  stepproc  the child: sets up the step's target and writes its result as it goes
  target    where a step runs: the real GPU or a private simulated one; probes, `sharegpu run`
  report    the result types, the JSON file and the table
  steps/    the steps, one module per subject
  programs/ the CUDA-runtime programs the real-GPU steps launch (PyTorch, CuPy, CUDA C++)
"""
