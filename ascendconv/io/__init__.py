"""I/O: safetensors headers and shards, the source checkpoint, the AscendV1 package."""
