"""For `kopf run -m slicekeeper.operator.kopf_entry --standalone`: the handlers on kopf's default registry.

`slicekeeper operator` is the usual way (operator/main.py); this module lets kopf's own command
line (its flags: namespaces, liveness, verbosity) run the same handlers.
"""

import kopf
from slicekeeper.operator.cluster import Cluster, client_configuration
from slicekeeper.operator.handlers import register

register(kopf.get_default_registry(), Cluster(client_configuration()))
