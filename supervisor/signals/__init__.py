"""The health and straggler signals: what a host's progress says about it, judged from values
handed in (no socket, no timer, no supervisor module of their own).

A host's supervisor times its workload with them (supervisor.host) and the leader names a culprit
and a straggler with them (supervisor.leader), so they sit below both and import neither.

hang.py       hang detection, with a timeout that grows with what it times
culprit.py    which host stopped: the culprit of a hang, from where every host's workload was
straggler.py  which host makes the whole job slow, from each host's own work per step
"""
