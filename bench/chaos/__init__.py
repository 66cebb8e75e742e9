"""The chaos run: the whole local stack under open-loop load through a scripted sequence of faults (`make chaos`)."""
