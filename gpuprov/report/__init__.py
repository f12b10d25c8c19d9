"""Reports: plain-data documents (the JSON schemas) built from facts, plans and checks."""
