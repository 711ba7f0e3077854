"""Pure cache policy: budget, keep-alive, admission plans, eviction order (no native imports)."""
