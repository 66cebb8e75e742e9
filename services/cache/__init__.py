"""Cache service: versioned response cache (in-process L1 in front of Redis) with fail-open lookups."""
