"""Which job wore which GPU: ``resolve`` finds the job of each GPU process (cgroups, sessions), ``attribute`` gives
each job its share of a GPU's wear as it accrues, ``report`` is `gpuwear jobs`."""
