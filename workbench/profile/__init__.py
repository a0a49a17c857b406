"""``wb profile``: one call of an op under Nsight Compute, a row per kernel it launched.

ncu.py      finding ncu, its command line, running it (timeout, Ctrl-C), what its failures mean
report.py   ncu's raw CSV page as one Kernel per launch, and the table of them
run.py      profile(): the child under ncu, its status, one run per path
child.py    the process ncu runs: load, the bench's inputs, warm-up, one profiled call
"""
