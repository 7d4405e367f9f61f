"""EPContext records, the source-keyed registry and the node codec (issue 3)."""
