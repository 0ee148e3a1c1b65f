"""State that outlives a rank: memory snapshots and their transport, replica groups, quorum, fencing."""
