"""Data parallelism: none / DDP / FSDP2 and world-size-independent state (``strategy``), what the ranks agree on
(``collectives``), and the compute dtype (``precision``)."""
