"""The fleet simulator: a TrainingJob at its real size, over days, with failures at published rates,
driven through the real restart state machine and policy engine with simulated time
(`slicekeeper simulate`, docs/simulator.md)."""
