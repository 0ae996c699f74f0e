"""Run the workers as a group of Ray actors (one per data-parallel rank, FSDP2-sharded models)
behind proxies with the local workers' interface. See docs/distributed.md."""
