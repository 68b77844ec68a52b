"""stager: keeps LLM training fed on bad infrastructure.

Pre-stages tokenized shards from object storage into a node-local cache, ahead
of the training cursor and verified with xxhash, and serves them to training.
"""

__version__ = "0.1.0"
