"""The resource model: seed 001's feeds-and-speeds ledgers, priced on measured or quoted rates.

- :mod:`~flashrung.model.rates`: per-SM rate tables with provenance (quoted / derived / measured).
- :mod:`~flashrung.model.ledger`: forward and backward tile ledgers, lower bound, crossover d*,
  sensitivity.
- :mod:`~flashrung.model.overlap`: two-stage, producer/consumer and pingpong overlap bounds.
- :mod:`~flashrung.model.schedule`: causal live-block counts, LPT vs lexical makespan.
- :mod:`~flashrung.model.exp2poly`: FA4's degree-3 software exp2 and its error.
- :mod:`~flashrung.model.levers`: prices of the FA4 softmax levers.
- :mod:`~flashrung.model.against`: measured time over the modeled lower bound, per bench row.
- :mod:`~flashrung.model.measure`: Gluon microbenchmarks that measure the H200's rates.
- :mod:`~flashrung.model.cli`: ``flashrung model``.
"""
from flashrung.model.ledger import Tile, backward, crossover_headdim, forward, sensitivity
from flashrung.model.rates import RateTable, get_table

__all__ = ["RateTable", "Tile", "backward", "crossover_headdim", "forward", "get_table", "sensitivity"]
