"""Training: loop, step, optimizer, checkpoints, mesh and sharding rules, metrics."""
