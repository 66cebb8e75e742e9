"""The benchmarks' shared harness: figures and tables, server processes, perf_analyzer, model repositories, load."""
