"""What a supervisor does only in a TPU pod: its plan, its own pod, the operator's notices on it.

A local run has none of this (supervisor.local is its counterpart); the host's parts reach the pod
only through the site (supervisor.host.site) and the leader only through `own_pod`'s annotations.

pod_plan.py     the supervisor's plan from the pod's environment and the job's ConfigMap
own_pod.py      the one door to the API server: annotations on the supervisor's own pod
pod_notices.py  the watch on the own pod for the operator's notice that the machine will go
"""
