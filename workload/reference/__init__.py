"""Reference trainers that run under the slicekeeper supervisor (the default workload)."""
