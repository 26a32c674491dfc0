"""`slicekeeper run`: the job on one machine, its hosts' supervisors as processes of it.

The local counterpart of the operator and its pods (supervisor.pod): it starts the supervisors
(`python -m slicekeeper.supervisor --plan ... --host N`) and watches their leader; nothing of the
control plane (host, leader, checkpoints) imports it.

local_runtime.py  the run: its machines' supervisors kept running, their end judged, the report
local_setup.py    what a run is (faults, steps, folders, the persistent tier), checked once; its plan
local_watch.py    the live progress, read from the leader's status lines; chaos spares brought in
live_view.py      what the run shows: a live view in a terminal, plain lines elsewhere
"""
