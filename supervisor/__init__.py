"""The per-host supervisor: runs the workload, watches it, and restarts the job with its peers.

Its parts are folders, each importing the others one way (an import-linter contract in
pyproject.toml fails on any loop between them); what several parts share stays here at the root.

host/         the supervisor of one host's machine: its workload, its SDK socket, its part in the job
leader/       the job's leader, run by whichever supervisor holds the lease
checkpoints/  the checkpoint tiers: local, peer, persistent, and the restore plan
signals/      hang, culprit and straggler judgements, shared by the host and the leader
pod/          what a supervisor does only in a TPU pod: its plan, its own pod, the operator's notices
local/        `slicekeeper run`: the job on one machine, the supervisors as its processes
fleet/        the fleet simulator (`slicekeeper simulate`): the leader's restart machine and policy, simulated

Shared at the root, below the folders:
plan.py                  what a supervisor knows of its job (the plan), written by who starts it
messages.py              every leader <-> member message, typed
reporting.py             how a host's parts say what happened: to the leader, to the event log
metrics.py               the Prometheus metrics of a host's supervisor
checkpoint_vocabulary.py the checkpoint words the messages and the metrics name too (tier, source)
connection_deadline.py   how long a connection between supervisors may carry nothing
tls.py                   mutual TLS on every connection between a job's supervisors
leader_connection.py     how a supervisor reaches its job's leader
workload_process.py      the workload's process: started, signalled, its exit classified
ports.py                 free ports for a local run's listeners (the host's site and the local run)
__main__.py              `python -m slicekeeper.supervisor`: one machine's supervisor, local or in a pod
"""
