"""The per-host supervisor: runs the workload, watches it, and restarts the job with its peers."""
