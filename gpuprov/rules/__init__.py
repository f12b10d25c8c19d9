"""Rules: the safety rules that judge facts, and the one boundary every input passes."""
