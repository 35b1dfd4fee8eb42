"""The Assemble RPC answered: kept answers, per-part caches, cacheable plans."""
