"""The cluster in one box: a network namespace per node on a link of its own (common/netns.py),
each framework's own multi-node engine across them. `python -m cluster.train` runs training
(`make cluster`), `python -m cluster.allreduce` each engine's all-reduce alone (`make
collectives`); both append records that `compare/` turns into tables and plots."""
