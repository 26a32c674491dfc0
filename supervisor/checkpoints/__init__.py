"""The supervisors' checkpoint tiers: what a host's checkpoint copies are, where they live, and which
copy a restore takes (see docs/checkpointing.md).

tiers.py           a host's tiers together: its local tier, copies to peers and to the persistent URI,
                   staging a restore from the cheapest valid source
tier_context.py    what the parts of a host's tiers share: the machine's disk and tiers, whom it serves
save_copies.py     after each save, its copies to the peers and to the persistent URI (tried again)
staging.py         at a start, this host's shard from the first valid source into the local tier
peer_tier.py       copies of a shard on other hosts' supervisors (TCP between supervisors, mutual TLS)
persistent_tier.py the job's persistent URI (fsspec): commits, retention, reads
restore_plan.py    the restore step every host can reach, and each host's sources (a pure function)
inventory.py       what a run directory or persistent URI holds (`slicekeeper checkpoint list`)
"""
