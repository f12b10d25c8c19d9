"""Plans: pure functions from facts and a declaration to actions or refusals; no I/O."""
