"""One module per algorithm: the math of one step, written against the engine."""
