"""Answers built from many runs: rate searches, fleet sizing, sweeps on Dask, cost."""
