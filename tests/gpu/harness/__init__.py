"""The real-GPU suite's parts: run.py runs its scenarios; dry_run.py, peers.py, ab.py and
where_it_goes.py load run.py for the parts they share."""
