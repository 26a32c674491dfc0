"""kopf's diff base kept for TrainingJobs only: no deep copies of every pod and node event.

For every event of every object it watches, kopf builds the object's "essence" (a deep copy of the
body without its status and system fields), clears it of its own progress records (a second deep
copy) and diffs it against the essence stored on the object, whether or not any handler of that
resource reacts to changes. Only the TrainingJob handlers do (create, update, resume, delete); pods
and nodes have event handlers alone, which never read a diff. py-spy on the operator over
benchmarks/operator_scale.py at 5,000 hosts put 280 of the 440 samples of kopf's event processing
in `copy.deepcopy`: about 0.2 ms of CPU for each event of each pod, and a job's pods bring three
events each (created, running, deleted), all 25,000 of them again when the operator restarts.

`JobsOnlyDiffBase` wraps kopf's storage: objects of `GROUP` go to it as before; for any other
object there is no essence (kopf then sees no change, as it would for an object with nothing new).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import cast

import kopf
from kopf._cogs.structs import dicts  # the field specs kopf's storages take (not re-exported)
from slicekeeper.operator.render import GROUP


def _ours(body: kopf.Body) -> bool:
    """An object of slicekeeper's API group (a TrainingJob): the only kind with change handlers."""
    return str(body.get("apiVersion", "")).startswith(f"{GROUP}/")


class JobsOnlyDiffBase(kopf.DiffBaseStorage):
    def __init__(self, inner: kopf.DiffBaseStorage) -> None:
        super().__init__()
        self.inner = inner

    def build(
        self, *, body: kopf.Body, extra_fields: Iterable[dicts.FieldSpec] | None = None
    ) -> kopf.BodyEssence:
        if not _ours(body):
            return cast(kopf.BodyEssence, None)  # kopf takes None for "no essence" (its fetch's answer)
        return self.inner.build(body=body, extra_fields=extra_fields)

    def fetch(self, *, body: kopf.Body) -> kopf.BodyEssence | None:
        return self.inner.fetch(body=body) if _ours(body) else None

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: kopf.BodyEssence) -> None:
        if _ours(body):
            self.inner.store(body=body, patch=patch, essence=essence)
