"""One-off comparisons, not in `make bench`: two source trees side by side, model service variants, interceptors."""
