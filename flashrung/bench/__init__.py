"""The instrument: FLOP numerators, suites, peers, paired timing and its statistics, manifests.

Entry points are the ``flashrung bench | null | compare | reanchor | sustain`` commands
(:mod:`flashrung.bench.cli`); the statistics (:mod:`flashrung.bench.stats`) are pure functions
over timing series, so everything a verdict rests on is testable without a GPU.
"""
