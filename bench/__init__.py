"""The workbench's measurements, one module each, run from the repository root as
``python -m bench NAME [ARGS]``; ``python -m bench`` lists them. What they share (the
environment, timing, child processes, reports) is in :mod:`bench.common`; their recorded results
are in ``bench/results/``. Not part of the installed package."""
