"""Many policyc replicas sharing one fleet: the registry, bundles, leadership and soft state
kept in etcd (through aetcd), and the local store of the embedded default."""
