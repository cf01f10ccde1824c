"""fleettune's development tools, kept out of the operator package and its image.

* `fleettune_dev.cluster`: a real control plane on loopback with fake GPU nodes (KWOK);
* `fleettune_dev.sim`: the fleet simulator answering trial Pods on those nodes;
* `fleettune_dev.demo`: `fleettune demo`, both of them plus the operator and an example run;
* `fleettune_dev.bench`: the benchmark commands (`fleettune bench ...`, see ``docs/benchmarks.md``);
* `fleettune_dev.interop`: recorded search spaces in and out (Kernel Tuner caches, T4, T1).

It depends on the runtime package `fleettune`, never the other way round: the `fleettune`
command names these modules and loads them only when one of their commands is run.
"""
