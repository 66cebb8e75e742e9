"""Benchmarks for meshserve: each prints side-by-side figures and records them in bench/results/."""
