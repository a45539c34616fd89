"""trio_harness: a rigorous Trio runtime for LLM agents."""
