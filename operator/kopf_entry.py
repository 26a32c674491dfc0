"""For `kopf run -m slicekeeper.operator.kopf_entry --standalone`: the handlers on kopf's default registry.

`slicekeeper operator` is the usual way (operator/main.py); this module lets kopf's own command
line (its flags: namespaces, liveness, verbosity) run the same handlers. The operator's metrics are
served on their default port (operator/metrics.py), which kopf's command line cannot change.
"""

import kopf
from slicekeeper.operator.cluster import Cluster, client_configuration
from slicekeeper.operator.handlers import register
from slicekeeper.operator.metrics import OperatorMetrics

metrics = OperatorMetrics()
register(kopf.get_default_registry(), Cluster(client_configuration(), metrics=metrics))
metrics.serve()
