"""Whether a leader may still act: sure to hold the job's lease, and never unsure since.

A leader checks that it surely holds the lease (renewed within the renew deadline) before every
command and journal it writes, and one that is not sure writes nothing. That alone let a leader
whose event loop ran seconds late skip a command (a generation's start) and then, its lease renewed
again, go on as if it had sent it, every member waiting for a start that never came: the one way
found to what the control-plane benchmark saw at 25,000 hosts. Unsure once, a leader is fenced for
good: it stands down (its candidate gives the lease up, supervisor.host.leadership, and the next
leader carries the journal on), so that nothing it skipped is taken for done.
"""

from __future__ import annotations

from collections.abc import Callable


class Fence:
    """`leading()` latched: True until the first time it is not, then False for good."""

    def __init__(self, leading: Callable[[], bool]) -> None:
        self._leading = leading
        self.broken = False
        """This leader was unsure once: it acts no more."""
        self.on_broken: Callable[[], None] = lambda: None
        """Called once, when it breaks (the leader stands down)."""

    def __call__(self) -> bool:
        if not self.broken and not self._leading():
            self.broken = True
            self.on_broken()
        return not self.broken
