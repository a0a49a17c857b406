"""Tuning: a family's declared space of build parameters, ``wb tune``, and what it remembers.

- :mod:`~workbench.tuning.space`: ``TuneSpace`` (what a spec declares) and variants of a family.
- :mod:`~workbench.tuning.run`: ``workbench.tune()``: build every variant in parallel, check
  each one, time the survivors, pick a winner per (device, dtype, size bucket).
- :mod:`~workbench.tuning.measure`: checking and timing the built variants on one device.
- :mod:`~workbench.tuning.parallel`: ``wb tune --devices``: one worker process per GPU, each
  checking and timing its share of the variants; their tables merged into one.
- :mod:`~workbench.tuning.store`: the winners, kept in the cache by op, device, torch version
  and the build key of the family's sources.
- :mod:`~workbench.tuning.route`: loading the winners: a router kernel in C++ per op sends each
  call to its bucket's variant.

Importing this package imports nothing else: a spec imports the space on every warm start.
"""
