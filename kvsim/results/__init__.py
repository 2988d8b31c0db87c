"""What a run leaves: per-request records, summaries with vLLM's metric names, streaming step writers, the
output-folder rules every writer obeys, the memory budget, and the CLI's table formats."""
