"""Built-in experiments: each module registers its configs with `tx.registry.experiment`."""
