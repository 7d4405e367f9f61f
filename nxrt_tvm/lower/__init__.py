"""Lowering a claim: Relax import, the optimizer pipeline (TVM passes), targets, build, kernel."""
